"""OpenAI's speech API: `POST /v1/audio/speech` streams the `tts` ensemble's chunks, encoded as
they arrive, one gRPC stream per request (a long text, with VELOCITY_GATEWAY_LONG_TEXT, as its
pieces' streams), or as server-sent events (`stream_format: "sse"`, with sentence marks and word
timing on request); `POST /v1/audio/captioned_speech`, the same body, answers one JSON object:
the whole audio (base64) and each word's start and end in seconds (as Kokoro-FastAPI's captioned
speech); `GET /v1/models` and `GET /v1/audio/voices` (the server's `voices` model). An error
after the audio began ends the response abnormally (no last chunk of the chunked body; an
`error` event first on SSE), so that a client can tell cut audio from whole. A client that hangs
up cancels its Triton stream; the hang-ups are counted (velocity_gateway_disconnects_total)."""
import asyncio
import base64
import collections
import contextlib
import dataclasses
import json
import logging
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from velocity.gateway import json_body
from velocity.gateway.client_io import ClientGone, send_within
from velocity.gateway.encode import FORMATS, Encoder
from velocity.gateway.sentences import SentencePipe
from velocity.gateway.speech_request import SAMPLE_RATE, TIMEOUT_HEADER, Marks, events_asked, request_timeout
from velocity.gateway.speech_schema import MODELS
from velocity.gateway.state import AppState
from velocity.gateway.upstream import ApiError, Gateway
from velocity.gateway.word_times import in_seconds, moved, shown
from velocity.tts.text_pieces import split_long

log = logging.getLogger("velocity.gateway")


class ClientLeft(Exception):
    """The HTTP client hung up before its first audio."""


class CutResponse(Exception):
    """Raised to the ASGI server once a streamed response's audio has begun and its stream
    failed: uvicorn then closes the connection without the chunked body's last chunk."""


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its body's generator as it ends, after a hang-up too
    (Starlette leaves a generator it stopped reading to the garbage collector): the response's
    Triton stream is cancelled, its encoder freed and the hang-up counted at once. A client that
    takes none of it for `send_timeout` seconds is gone (client_io): the response ends there."""

    def __init__(self, body, media_type: str, send_timeout: float = 0) -> None:
        super().__init__(body, media_type=media_type)
        self.send_timeout = send_timeout

    async def __call__(self, scope, receive, send) -> None:
        async def bounded(message) -> None:
            await send_within(send(message), self.send_timeout)

        try:
            await super().__call__(scope, receive, bounded)
        except ClientGone as e:
            log.info("speech: %s: its speech is stopped", e)
        except ApiError as e:            # after the audio began: the response must not end cleanly
            log.warning("speech: the stream failed after its audio began (%s): the response is cut", e.message)
            raise CutResponse(e.message) from None
        finally:
            await self.body_iterator.aclose()


async def long_chunks(gw: Gateway, values: dict, pieces: list[str], timeout: float | None):
    """A text over the limit as its pieces' chunks, one stream: each piece its own request, two
    generating at once (SentencePipe), sentences and sample offsets counted on across pieces."""
    pipe = SentencePipe(lambda text: gw.chunks(values | {"TEXT": text}, timeout), ahead=1)
    todo = collections.deque(pieces)

    def feed() -> None:                              # the next pieces as places free: two queued at most
        while todo and len(pipe.queue) < 2:
            pipe.add(todo.popleft())

    feed()
    samples = sentences = 0                          # in the pieces before this one
    piece_samples = piece_sentences = done = 0
    try:
        async with contextlib.aclosing(pipe.out()) as out:
            async for _, chunk in out:
                if isinstance(chunk, Exception):
                    raise chunk
                if chunk is None:                    # a piece is complete
                    samples, sentences = samples + piece_samples, sentences + piece_sentences
                    piece_samples = piece_sentences = 0
                    done += 1
                    feed()
                    if done == len(pieces):
                        return
                    continue
                piece_samples, piece_sentences = chunk.offset + len(chunk.audio), chunk.sentence + 1
                yield dataclasses.replace(chunk, sentence=chunk.sentence + sentences, offset=chunk.offset + samples,
                                          words=moved(chunk.words, samples))
    finally:
        await pipe.cancel()


def speech_router(state: AppState) -> APIRouter:
    router = APIRouter()
    settings, gw, limit = state.settings, state.gw, state.settings.gateway_max_body_bytes

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "velocity-tts"} for m in MODELS]}

    @router.get("/v1/audio/voices")
    async def voices():
        listing = await gw.voices()
        return {"default": listing["default"], "voices": [v["name"] for v in listing["voices"]],
                "details": listing["voices"]}

    async def read_body(request: Request) -> bytes:
        """The body, refused with 413 as soon as it passes the limit, however it is framed
        (Content-Length is checked by the guard; a chunked body has none)."""
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > limit:
                raise ApiError(413, f"the request body is over the limit of {limit} bytes "
                                    "(VELOCITY_GATEWAY_MAX_BODY_BYTES)")
        return bytes(data)

    async def first_chunk(request: Request, chunks):
        """The stream's first chunk (None: it had none); ClientLeft, with the stream cancelled,
        when the client hangs up while it waits."""
        task = asyncio.ensure_future(anext(chunks, None))
        while not (await asyncio.wait({task}, timeout=0.2))[0]:
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                await chunks.aclose()
                raise ClientLeft
        return task.result()

    # the body is read here, bounded (read_body, json_body), and validated by its model: the
    # OpenAPI page takes the model's schema from here
    body_schema = {"content": {"application/json": {"schema": state.body_model.model_json_schema()}}, "required": True}

    @router.post("/v1/audio/captioned_speech", openapi_extra={"requestBody": body_schema},
                 responses={200: {"description": 'the whole audio and its words: {"audio": base64, "response_format", '
                                  '"words": [{"word", "start", "end"}] in seconds}'}})
    async def captioned_speech(request: Request):
        return await answer(request, captioned=True)

    @router.post("/v1/audio/speech", openapi_extra={"requestBody": body_schema},
                 responses={200: {"description": "the audio, streamed as it is made",
                                  "content": {t: {} for t in dict.fromkeys(FORMATS.values())}}})
    async def speech(request: Request):
        return await answer(request, captioned=False)

    async def answer(request: Request, captioned: bool):
        """A speech request: its audio streamed (or as events), or with `captioned` whole, with its words."""
        kind = request.headers.get("content-type", "")
        if kind.split(";")[0].strip().lower() != "application/json":
            # a web page may POST text/plain to any server without asking (no CORS preflight):
            # JSON only, so that another site's page cannot make this server speak
            raise ApiError(415, f"send the body as JSON with Content-Type: application/json (got {kind!r})")
        body = json_body.loads(await read_body(request), "the body")
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        names = await gw.voice_names()
        voice = body.get("voice")
        if isinstance(voice, str) and voice not in names:   # a voice added since, or a speaker string
            names = await gw.voice_names(fresh=True)
        fmt = body.get("response_format", "mp3")
        label = fmt if isinstance(fmt, str) and fmt in FORMATS else "other"
        t0 = time.perf_counter()
        try:
            values, req = state.speech_values(body, names)
            fmt, stream_format, (want_marks, want_words) = req.response_format, req.stream_format, events_asked(req)
            if captioned and stream_format != "audio":
                raise ApiError(400, 'captioned speech is one JSON answer: stream_format must be "audio" (the '
                                    'default); for words as the audio streams, use /v1/audio/speech with '
                                    'stream_format "sse" and "words": true', "stream_format")
            timeout = request_timeout(req, request.headers.get(TIMEOUT_HEADER))
            if settings.gateway_long_text and len(values["TEXT"]) > settings.max_text_chars:
                if len(values["TEXT"]) > settings.gateway_long_text_max_chars:
                    raise ApiError(400, f"input has {len(values['TEXT'])} characters; a long text may have "
                                        f"{settings.gateway_long_text_max_chars} (VELOCITY_GATEWAY_LONG_TEXT_MAX_CHARS)",
                                   "input")
                chunks = long_chunks(gw, values, split_long(values["TEXT"], settings.max_text_chars), timeout)
            else:
                chunks = gw.chunks(values, timeout)
            first = await first_chunk(request, chunks)   # errors before the first byte are real HTTP errors
        except ApiError as e:
            state.metrics.requests.labels(label, str(e.status)).inc()
            raise
        except ClientLeft:
            state.metrics.disconnects.inc()
            state.metrics.requests.labels(label, "499").inc()
            return Response(status_code=499)               # nginx's "client closed request": no one reads it
        state.metrics.first_byte.labels(fmt).observe(time.perf_counter() - t0)
        state.metrics.requests.labels(fmt, "200").inc()

        async def encoded():
            """(chunk, its encoded bytes) in order, then (None, the encoder's last bytes)."""
            complete = False
            enc = Encoder(fmt, SAMPLE_RATE)
            try:
                if first is not None:
                    yield first, enc.push(first.audio)
                    first.read()                            # sent: the response asks for the next part
                async for chunk in chunks:
                    yield chunk, enc.push(chunk.audio)
                    chunk.read()
                yield None, enc.finish()
                complete = True
            except ApiError:
                complete = True                             # the server ended it: not a hang-up
                raise
            finally:
                enc.close()                                 # the codec's threads, now
                if not complete:
                    state.metrics.disconnects.inc()
                await chunks.aclose()

        async def audio():
            async with contextlib.aclosing(encoded()) as parts:
                async for _, data in parts:
                    yield data

        def event(**kw) -> str:
            return f"data: {json.dumps(kw, ensure_ascii=False)}\n\n"

        async def sse():
            marks = Marks() if want_marks else None
            try:
                async with contextlib.aclosing(encoded()) as parts:
                    async for chunk, data in parts:
                        for mark in marks.see(chunk) if marks else ():    # a sentence whose audio is all out
                            yield event(type="speech.sentence", **mark)
                        if want_words and chunk is not None and chunk.words:
                            yield event(type="speech.words", words=shown(chunk.words), sample_rate=SAMPLE_RATE)
                        if data:
                            yield event(type="speech.audio.delta", audio=base64.b64encode(data).decode())
            except ApiError as e:                        # failed after the audio began: said, and no "done"
                log.warning("speech: the stream failed after its audio began (%s)", e.message)
                yield event(type="error", error=e.body()["error"])
                return
            yield event(type="speech.audio.done")

        async def whole():
            audio, words = bytearray(), []
            async with contextlib.aclosing(encoded()) as parts:
                async for chunk, data in parts:
                    audio += data
                    words += chunk.words if chunk is not None else []
            return JSONResponse({"audio": base64.b64encode(bytes(audio)).decode(), "response_format": fmt,
                                 "words": in_seconds(words)})

        if captioned:
            return await whole()
        if stream_format == "sse":
            return ClosingStreamingResponse(sse(), "text/event-stream", settings.gateway_send_timeout)
        return ClosingStreamingResponse(audio(), FORMATS[fmt], settings.gateway_send_timeout)

    return router
