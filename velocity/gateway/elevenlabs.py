"""ElevenLabs' multi-context WebSocket, the subset that Pipecat's ElevenLabsTTSService speaks, so
that it works unchanged apart from its `url` (docs/clients.md):

    WS /v1/text-to-speech/{voice_id}/multi-stream-input?output_format=pcm_16000&model_id=...
    xi-api-key: a key of VELOCITY_GATEWAY_API_KEYS, when the gateway has keys

voice_id is one of our voices (or OpenAI's names for them); model_id and the other query
parameters but sync_alignment and enable_ssml_parsing (text that starts with <speak> is then an
SSML document, velocity.tts.ssml, spoken whole once its </speak> came) are taken and ignored; output_format is pcm_<rate> (8000, 16000,
22050, 24000, 32000, 44100 or 48000; default pcm_24000, our audio's rate: others are resampled).
The client sends JSON messages, each for a context (`context_id`; none: one default context):
    {"text": " ", "context_id": "c1", "voice_settings": {"speed": 1.1}}    opens it (speed only)
    {"text": "Hello there. ", "context_id": "c1"}     text: each sentence is spoken once complete
    {"text": ""}                                      keepalive
    {"context_id": "c1", "flush": true}               speak what is pending now
    {"context_id": "c1", "close_context": true}       after a flush (the end of a turn): its audio
                                                      goes on to the end, then isFinal; else, or
                                                      a second time (barge-in): it stops at once
    {"close_socket": true}                            stop every context and close
The server sends {"audio": base64 16-bit PCM, "isFinal": false, "contextId", "alignment",
"normalizedAlignment"} in order within a context, then {"isFinal": true, "contextId"}; and
{"error", "message"} for a bad message (the socket stays usable). The alignments give the
characters of the words estimated to start in the message's audio ({"chars", "charStartTimesMs",
"charDurationsMs"}: velocity.gateway.word_times), as written and as read ("$5": "five dollars"):
exact at sentences' edges, an estimate within them (velocity.tts.word_timing). Their times start
at each message's start, as Pipecat reads them; with sync_alignment=true (LiveKit's plugin asks
for it) at the context's start, as LiveKit reads them.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging

from velocity.gateway import json_body
from velocity.gateway.client_io import (POLICY, SERVICE_RESTART, ClientGone, close_socket, once, receive_unless_idle,
                                        send_within, server_failed)
from velocity.gateway.encode import Encoder
from velocity.gateway.sentences import SentenceBuffer, SentencePipe
from velocity.gateway.upstream import ApiError
from velocity.gateway.word_times import MessageWords, alignment

log = logging.getLogger("velocity.gateway")
PATH = "/v1/text-to-speech/{voice_id}/multi-stream-input"
RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
MAX_CONTEXTS = 5                 # open at once on one socket, as ElevenLabs allows
AHEAD = 2                        # sentences generating beside the one being spoken


def output_rate(fmt: str | None) -> int:
    """output_format -> its sample rate; ApiError for a format we do not speak."""
    rate = fmt.removeprefix("pcm_") if fmt else "24000"
    if not (fmt is None or fmt.startswith("pcm_")) or not rate.isdigit() or int(rate) not in RATES:
        raise ApiError(400, f"output_format must be pcm_<rate> with a rate of {', '.join(map(str, RATES))}, "
                            f"got {fmt!r}", "output_format")
    return int(rate)


class Context:
    """One context: its pending text, its sentences (a SentencePipe), its own resampler, and the
    task that sends its audio, then isFinal when it is closed and all spoken."""

    def __init__(self, socket: "ElevenLabsSocket", cid: str, speed: float) -> None:
        self.socket, self.cid = socket, cid
        self.buffer, self.flushed, self.closing = SentenceBuffer(ssml=socket.ssml), False, False
        self.pipe = SentencePipe(lambda text: socket.gw.chunks(socket.values_of(text, speed)), AHEAD)
        self.encoder = Encoder("pcm", 24000, socket.rate)
        self.words, self.samples, self.starts = MessageWords(), 0, {}   # samples: the context's audio so far (24 kHz)
        self.writer = asyncio.create_task(self._write())

    def text(self, text: str) -> None:
        for sentence in self.buffer.write(text):
            self.pipe.add(sentence)
        if text.strip():
            self.flushed = False

    def flush(self) -> None:
        for sentence in self.buffer.flush():
            self.pipe.add(sentence)
        self.flushed = True

    async def stop(self) -> None:
        """Stop at once: its Triton streams are cancelled, nothing more of it is sent."""
        await self.pipe.cancel()
        self.writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.writer
        self.encoder.close()

    async def _write(self) -> None:
        try:
            await self._write_all()
        except ClientGone as e:
            await self.socket.gone(e)

    async def _write_all(self) -> None:
        async for s, chunk in self.pipe.out():
            if chunk is not None and not isinstance(chunk, Exception):
                self.words.add(chunk.words, self.starts.setdefault(s.index, self.samples))
                self.samples += len(chunk.audio)
                if data := self.encoder.push(chunk.audio):
                    await self.audio(data)
                chunk.read()
                continue
            if isinstance(chunk, Exception):                  # a sentence ended, or failed
                msg = chunk.message if isinstance(chunk, ApiError) else str(chunk)
                await self.socket.send(error="synthesis_failed", message=f"sentence {s.index}: {msg}", contextId=self.cid)
                if server_failed(chunk):                      # the rest would fail too: the socket closes
                    await self.socket.restarting()
                    return
            if self.closing and self.pipe.idle:
                await self.finish()
                return

    async def audio(self, data: bytes, last: bool = False) -> None:
        """An audio message (16-bit PCM), with the alignment of the words that start in it."""
        words, t0, t1 = self.words.take(len(data) / 2 / self.socket.rate, last)
        sync = self.socket.sync
        await self.socket.send(audio=base64.b64encode(data).decode(), isFinal=False, contextId=self.cid,
                               alignment=alignment(words, t0, t1, sync),
                               normalizedAlignment=alignment(words, t0, t1, sync, "spoken"))

    async def finish(self) -> None:
        tail = self.encoder.finish()
        self.encoder.close()
        if tail or self.words.waiting:
            await self.audio(tail, last=True)
        await self.socket.final(self.cid)


class ElevenLabsSocket:
    """One WebSocket session (see the module). values_of(text, speed) -> the `tts` inputs."""

    def __init__(self, ws, gw, values_of, rate: int, left=lambda: None, send_timeout: float = 0,
                 idle_timeout: float = 0, sync: bool = False, ssml: bool = False) -> None:
        """sync: sync_alignment (alignment times from each context's start); ssml:
        enable_ssml_parsing (text that starts with <speak> is an SSML document, spoken whole);
        left(): called once if the client leaves with speech still to come (a hang-up, counted);
        send_timeout: a client that takes nothing for this long is gone (client_io);
        idle_timeout: a socket with no message and no speech for this long is closed (0: never)."""
        self.ws, self.gw, self.values_of, self.rate, self.left = ws, gw, values_of, rate, once(left)
        self.sync, self.ssml = sync, ssml
        self.send_timeout, self.idle_timeout = send_timeout, idle_timeout
        self.contexts: dict[str, Context] = {}
        self.lock = asyncio.Lock()

    async def send(self, **msg) -> None:
        async with self.lock:
            await send_within(self.ws.send_text(json.dumps(msg, ensure_ascii=False)), self.send_timeout)

    async def final(self, cid: str) -> None:
        self.contexts.pop(cid, None)
        await self.send(isFinal=True, contextId=cid)

    async def run(self) -> None:
        try:
            while True:
                msg = await receive_unless_idle(self.ws, self.idle_timeout,
                                                lambda: all(ctx.pipe.idle for ctx in self.contexts.values()))
                if msg is None:
                    log.info("elevenlabs socket: idle for %g s: closed", self.idle_timeout)
                    await self.ws.close(code=1000, reason=f"idle for {self.idle_timeout:g} s")
                    return
                if msg["type"] == "websocket.disconnect":
                    if any(not ctx.pipe.idle for ctx in self.contexts.values()):
                        log.info("elevenlabs socket: the client left; its speech is stopped")
                        self.left()
                    return
                try:
                    if not await self.handle(json_body.loads(msg.get("text") or "null", "a message")):
                        return
                except ApiError as e:
                    await self.send(error="invalid_message", message=e.message)
                except ClientGone:
                    raise
                except Exception:    # our fault: said as such, logged, and the socket goes on
                    log.exception("elevenlabs socket: a message failed")
                    await self.send(error="internal_error", message="the message failed on the server (its log "
                                    "says why)")
        except ClientGone as e:
            await self.gone(e)
        finally:
            for ctx in list(self.contexts.values()):
                await ctx.stop()

    async def gone(self, e: ClientGone) -> None:
        """The client takes none of its audio: every context's speech is stopped, the socket closed."""
        log.info("elevenlabs socket: %s: its speech is stopped", e)
        self.left()
        for ctx in list(self.contexts.values()):
            await ctx.pipe.cancel()
        await close_socket(self.ws, POLICY, str(e))

    async def restarting(self) -> None:
        """The server failed: every context's speech is stopped, the socket closed (1012)."""
        for ctx in list(self.contexts.values()):
            await ctx.pipe.cancel()
        await close_socket(self.ws, SERVICE_RESTART, "the server is restarting: try again shortly")

    async def handle(self, msg) -> bool:
        """One message; False once the socket is to close."""
        if not isinstance(msg, dict):
            raise ApiError(400, "a message must be a JSON object")
        if msg.get("close_socket"):
            await self.ws.close()
            return False
        cid = msg.get("context_id") or msg.get("contextId") or ""
        if not isinstance(cid, str):
            raise ApiError(400, f"context_id must be a string, got {cid!r}")
        ctx = self.contexts.get(cid)
        text = msg.get("text")
        if text is not None and not isinstance(text, str):
            raise ApiError(400, f"text must be a string, got {text!r}")
        if ctx is None and text:                              # " " opens a context
            if len(self.contexts) >= MAX_CONTEXTS:
                raise ApiError(400, f"at most {MAX_CONTEXTS} contexts may be open at once: close one first")
            settings = msg.get("voice_settings") or {}
            if not isinstance(settings, dict):
                raise ApiError(400, f"voice_settings must be an object, such as {{\"speed\": 1.1}}, got {settings!r}")
            speed = settings.get("speed", 1.0)
            if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= speed <= 4.0:
                raise ApiError(400, f"voice_settings.speed must be a number in [0.25, 4.0], got {speed!r}")
            ctx = self.contexts[cid] = Context(self, cid, float(speed))
        if ctx is None:
            if msg.get("close_context"):
                await self.send(isFinal=True, contextId=cid)   # nothing of it is open
            return True                                       # a keepalive, or a flush of nothing
        if ctx.closing and (text or msg.get("flush")):
            raise ApiError(400, f"context {cid!r} is closed: open another for more text")
        if text:
            ctx.text(text)
        if msg.get("flush"):
            ctx.flush()
        if msg.get("close_context"):
            if ctx.closing or not ctx.flushed:                # barge-in: stop now
                log.info("elevenlabs socket: context %r closed %s: its speech is stopped", cid,
                         "again" if ctx.closing else "before a flush")
                await ctx.stop()
                await self.final(cid)
            else:                                             # the turn's end: speak it all, then isFinal
                ctx.closing = True
                if ctx.pipe.idle:
                    await ctx.stop()
                    await ctx.finish()
        return True
