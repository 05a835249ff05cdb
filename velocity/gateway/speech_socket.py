"""Streamed text in, audio out: the gateway's WebSocket for voice agents, `/v1/audio/speech/stream`.

The client sends JSON text messages:
    {"type": "setup", "voice": "amber", "seed": 7, ...}   first: the fields of /v1/audio/speech
                                                          but `input` (response_format: pcm)
    {"type": "text", "text": "Hel"}                        text as an LLM writes it
    {"type": "flush"}                                      speak what is pending now
    {"type": "cancel"}                                     barge-in: stop at once, drop what is pending
    {"type": "close"}                                      speak what is pending, then close
The server sends the audio as binary messages (16-bit little-endian 24 kHz mono PCM, in order)
and JSON text messages:
    {"type": "ready"}                                      after a setup
    {"type": "words", "index", "words": [{"word", "start", "end"}], "sample_rate"}
                                                           before the audio they start in: the
                                                           words (as sent) estimated to start in
                                                           it, samples in the socket's audio
    {"type": "sentence", "index", "text", "start", "end", "sample_rate"}
                                                           once a sentence's audio is all sent:
                                                           its samples in the socket's audio
    {"type": "cancelled", "dropped": n}                    after a cancel: no audio of before follows
    {"type": "error", "message", "param"}                  a bad message or a failed sentence; the
                                                           socket stays usable
    {"type": "done"}                                       after close, before the socket closes
Each sentence is spoken as soon as it is complete (velocity.gateway.sentences, the rule
Wyoming's streamed synthesize uses), several generating at once, their audio in order. A
sentence's bounds are exact; its words' times within it are an estimate (velocity.tts.word_timing).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from velocity.gateway import json_body
from velocity.gateway.client_io import (POLICY, SERVICE_RESTART, ClientGone, close_socket, once, receive_unless_idle,
                                        send_within, server_failed)
from velocity.gateway.encode import pcm16
from velocity.gateway.sentences import SentenceBuffer, SentencePipe
from velocity.gateway.upstream import ApiError
from velocity.gateway.word_times import moved, shown

log = logging.getLogger("velocity.gateway")
PATH = "/v1/audio/speech/stream"
SAMPLE_RATE = 24000
AHEAD = 2                        # sentences generating beside the one being spoken


class SpeechSocket:
    """One WebSocket session (see the module): reads the client's messages, speaks through a
    SentencePipe, writes audio and marks from its own task."""

    def __init__(self, ws, gw, values_of, left=lambda: None, send_timeout: float = 0,
                 idle_timeout: float = 0) -> None:
        """values_of(body) -> the `tts` inputs of an /v1/audio/speech body (ApiError if bad);
        left(): called once if the client leaves with speech still to come (a hang-up, counted);
        send_timeout: a client that takes nothing for this long is gone (client_io);
        idle_timeout: a socket with no message and no speech for this long is closed (0: never)."""
        self.ws, self.gw, self.values_of, self.left = ws, gw, values_of, once(left)
        self.send_timeout, self.idle_timeout = send_timeout, idle_timeout
        self.setup: dict | None = None
        self.text = SentenceBuffer()
        self.pipe = SentencePipe(self._stream, AHEAD)
        self.samples = 0                          # audio samples sent on this socket
        self.finished = 0                         # sentences whose mark (or error) is sent
        self.writer: asyncio.Task | None = None
        self.send_lock = asyncio.Lock()

    async def _stream(self, text: str):
        async for chunk in self.gw.chunks(self.values_of(self.setup | {"input": text})):
            yield chunk

    async def send(self, **msg) -> None:
        async with self.send_lock:
            await send_within(self.ws.send_text(json.dumps(msg, ensure_ascii=False)), self.send_timeout)

    async def run(self) -> None:
        self.writer = asyncio.create_task(self._write())
        try:
            while True:
                msg = await receive_unless_idle(self.ws, self.idle_timeout, lambda: self.pipe.idle)
                if msg is None:
                    log.info("websocket: idle for %g s: closed", self.idle_timeout)
                    await self.ws.close(code=1000, reason=f"idle for {self.idle_timeout:g} s")
                    break
                if msg["type"] == "websocket.disconnect":
                    if not self.pipe.idle:
                        log.info("websocket: the client left; its speech is stopped")
                        self.left()
                    break
                if msg.get("text") is None:
                    await self.send(type="error", message="send JSON text messages, not binary ones", param=None)
                elif not await self.handle(msg["text"]):
                    break
        except ClientGone as e:
            await self.gone(e)
        finally:
            await self.pipe.cancel()
            self.writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.writer

    async def handle(self, raw: str) -> bool:
        """One client message; False once the socket is to close."""
        try:
            msg = json_body.loads(raw, "a message")
            if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
                raise ApiError(400, 'a message is a JSON object with a "type"', "type")
            kind = msg["type"]
            if kind == "setup":
                body = {k: v for k, v in msg.items() if k != "type"}
                body.setdefault("response_format", "pcm")
                if body["response_format"] != "pcm":
                    raise ApiError(400, f"response_format must be pcm on the WebSocket, got {body['response_format']!r}",
                                   "response_format")
                body.setdefault("model", "tts-1")
                # checked now, by the server's front end (nothing generated): errors name the field
                await self.gw.check(self.values_of(body | {"input": "Hi."}))
                self.setup = body
                await self.send(type="ready")
            elif kind in ("text", "flush", "close") and self.setup is None:
                raise ApiError(400, f'send a "setup" message before "{kind}"', "type")
            elif kind == "text":
                text = msg.get("text")
                if not isinstance(text, str):
                    raise ApiError(400, f"text must be a string, got {text!r}", "text")
                for sentence in self.text.write(text):
                    self.pipe.add(sentence)
            elif kind in ("flush", "close"):
                for sentence in self.text.flush():
                    self.pipe.add(sentence)
                if kind == "close":
                    # every sentence out, its mark sent; a writer that ended first could not send:
                    # the client left after its close (the caller's finally stops the rest)
                    while self.finished < self.pipe.count and not self.writer.done():
                        await asyncio.sleep(0.02)
                    if self.finished < self.pipe.count:
                        log.info("websocket: the client left after its close; its speech is stopped")
                        self.left()
                        return False
                    await self.send(type="done")
                    await self.ws.close()
                    return False
            elif kind == "cancel":
                self.text.flush()                           # what is pending is dropped
                async with self.send_lock:                  # no audio of before goes out after this
                    dropped = await self.pipe.cancel()
                    self.finished = self.pipe.count
                    self.writer.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await self.writer
                    self.writer = asyncio.create_task(self._write())
                await self.send(type="cancelled", dropped=dropped)
            else:
                raise ApiError(400, f'unknown message type {kind!r}: setup, text, flush, cancel or close', "type")
        except ApiError as e:
            await self.send(type="error", message=e.message, param=e.param)
        except ClientGone:
            raise
        except Exception:            # our fault: said as such, logged, and the socket goes on
            log.exception("websocket: a message failed")
            await self.send(type="error", message="internal error: the message failed on the server (its log "
                            "says why)", param=None)
        return True

    async def _write(self) -> None:
        """The pipe's audio and marks, in order, until cancelled; a client that takes none of it for
        the send timeout is gone: its speech is stopped and the socket closed."""
        try:
            await self._write_all()
        except ClientGone as e:
            await self.gone(e)

    async def gone(self, e: ClientGone) -> None:
        log.info("websocket: %s: its speech is stopped", e)
        self.left()
        await self.pipe.cancel()
        await close_socket(self.ws, POLICY, str(e))

    async def _write_all(self) -> None:
        start = {}
        async for s, chunk in self.pipe.out():
            if isinstance(chunk, Exception):
                msg = chunk.message if isinstance(chunk, ApiError) else str(chunk)
                await self.send(type="error", message=f"sentence {s.index} failed: {msg}", param=None,
                                code=getattr(chunk, "code", None))
                self.finished += 1
                if server_failed(chunk):          # the rest would fail too: said, and the socket closed
                    await self.pipe.cancel()
                    await close_socket(self.ws, SERVICE_RESTART, "the server is restarting: try again shortly")
                    return
                continue
            if chunk is None:
                await self.send(type="sentence", index=s.index, text=s.text, start=start.pop(s.index, self.samples),
                                end=self.samples, sample_rate=SAMPLE_RATE)
                self.finished += 1
                continue
            begun = start.setdefault(s.index, self.samples)
            if chunk.words:
                await self.send(type="words", index=s.index, words=shown(moved(chunk.words, begun)),
                                sample_rate=SAMPLE_RATE)
            async with self.send_lock:
                await send_within(self.ws.send_bytes(pcm16(chunk.audio)), self.send_timeout)
            chunk.read()
            self.samples += len(chunk.audio)
