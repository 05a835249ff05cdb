"""An OpenAI-compatible speech API in front of the Triton server: `POST /v1/audio/speech` streams
the `tts` ensemble's chunks, encoded as they arrive, one gRPC stream per request, many at once.

    velocity-tts-gateway --triton localhost:8001 --port 8080

Also `GET /v1/models`, `GET /v1/audio/voices` (the server's `voices` model), `GET /health`
(200 only while Triton's `tts` is ready and its server is not draining) and the web page at `/`
(page.html). Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400
for what the request got wrong, 413 for a body over the limit (however it is sent), 415 for a
body not sent as application/json, 503 with
Retry-After when the server is busy, draining or unreachable (restarting after a failure), 504
when the request's timeout passed. An error after the audio began ends the response abnormally
(no last chunk of the chunked body; an `error` event first on SSE), so that a client can tell
cut audio from whole.

The WebSockets refuse a page of another origin than the gateway's own (HTTP 403) unless
VELOCITY_GATEWAY_ORIGINS (or VELOCITY_GATEWAY_CORS_ORIGINS) allows it.

A client that hangs up (before or during its audio) cancels its Triton stream, and the server
stops its work on it within a second (velocity.serving.stream_board); the hang-ups are counted
(velocity_gateway_disconnects_total).
"""
import argparse
import asyncio
import base64
import collections
import contextlib
import dataclasses
import json
import logging
import math
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from velocity.gateway import elevenlabs, fair, json_body
from velocity.gateway.client_io import ClientGone, send_within
from velocity.gateway.encode import FORMATS, Encoder
from velocity.gateway.sentences import SentencePipe, split_long
from velocity.gateway.speech_socket import PATH, SpeechSocket
from velocity.gateway.upstream import ApiError, Gateway
from velocity.serving.inputs import INPUTS, JSON
from velocity.tts.control import CONTROL

log = logging.getLogger("velocity.gateway")
MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "chattts")   # listed; any model name with "tts" is taken
SAMPLE_RATE = 24000                  # the release's, what `tts` streams
TIMEOUT_HEADER = "x-request-timeout"  # seconds, as the body's "timeout"
MAX_TIMEOUT = 3600.0


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


class Guard:
    """API keys (Authorization: Bearer) on /v1, the body size limit, and whose request it is
    (fair.CLIENT: its streams count against its cap). Plain ASGI, not Starlette's
    BaseHTTPMiddleware, which relays a streamed body through a response of its own and ends it
    cleanly when the stream fails: a client would take cut audio for whole."""

    def __init__(self, app, keys: set[str], admission: fair.Admission, limit: int) -> None:
        self.app, self.keys, self.admission, self.limit = app, keys, admission, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        key = None
        if self.keys and request.url.path.startswith("/v1/"):
            auth = request.headers.get("authorization", "")
            if not auth.startswith("Bearer ") or auth[7:].strip() not in self.keys:
                await JSONResponse(ApiError(401, "a valid API key is required: Authorization: Bearer <key>",
                                            code="invalid_api_key").body(), status_code=401)(scope, receive, send)
                return
            key = auth[7:].strip()
        client = self.admission.client(key, request.client.host if request.client else None)
        fair.CLIENT.set(client)
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.limit:
            await JSONResponse(ApiError(413, f"the request body is {size} bytes; the limit is {self.limit} "
                                             "(VELOCITY_GATEWAY_MAX_BODY_BYTES)").body(), status_code=413)(scope, receive, send)
            return
        if scope["method"] == "POST" and scope["path"] == "/v1/audio/speech" and (e := self.admission.full(client)):
            # refused before its body is read or parsed: a flood of refusals costs the gateway little
            await self.admission.refuse(client, "a speech request", e)
            await error_response(e)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def error_response(e: ApiError) -> JSONResponse:
    """An ApiError as OpenAI's error body; a 503 with Retry-After."""
    headers = {"Retry-After": str(fair.RETRY_AFTER_S)} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def speed_prompt(speed: float) -> str:
    """OpenAI's speed (0.25-4.0, 1 = normal) -> ChatTTS's [speed_N] (0-9, 5 = normal):
    N = round(5 + 2 log2(speed)), so 0.25 -> 1, 0.5 -> 3, 1 -> 5, 2 -> 7, 4 -> 9."""
    return f"[speed_{min(9, max(0, round(5 + 2 * math.log2(speed))))}]"


def of_type(v, kind: type) -> bool:
    """A JSON value is of this kind (bool, int, str; float takes an int too); a bool is no number."""
    if isinstance(v, bool):
        return kind is bool
    return isinstance(v, (int, float) if kind is float else kind)


def instruction_inputs(instructions: str) -> dict:
    """OpenAI's `instructions` -> `tts` inputs. ChatTTS follows no free-form instructions: text
    that holds only its control tokens is used ([speed_N] in the prompt, the others such as
    [oral_2][laugh_0][break_6] as text refine's prompt, which turns text refine on); any other
    text is ignored, as documented."""
    if not instructions.strip() or CONTROL.sub("", instructions).strip():
        return {}
    tokens = CONTROL.findall(instructions)
    speed = [t for t in tokens if t.startswith("[speed_")]
    refine = "".join(t for t in tokens if not t.startswith("[speed_"))
    out = {"PROMPT": speed[-1]} if speed else {}
    return out | ({"REFINE_TEXT": True, "REFINE_PROMPT": refine} if refine else {})


def request_timeout(body: dict, header: str | None) -> float | None:
    """The request's deadline in seconds (the body's `timeout`, else the X-Request-Timeout header)."""
    v = body.get("timeout", header)
    if v is None:
        return None
    try:
        t = float(v) if not isinstance(v, bool) else math.nan
    except (TypeError, ValueError):
        t = math.nan
    if not 0 < t <= MAX_TIMEOUT:
        raise ApiError(400, f"timeout must be seconds in (0, {MAX_TIMEOUT:.0f}], got {v!r}", "timeout")
    return t


def triton_values(body: dict, voices: dict[str, str], settings=None) -> tuple[dict, str, str]:
    """The request body -> (the `tts` inputs, response_format, stream_format); ApiError 400 naming
    the field and its allowed values. voices: the server's voice names -> their kind. Numbers are
    checked against their input's range (settings: the limits it names) before anything is cast."""
    def need(name: str, kind, allowed: str):
        v = body.get(name)
        if v is None or not of_type(v, kind):
            raise ApiError(400, f"{name} is required: {allowed}", name)
        return v

    model = need("model", str, f"one of {', '.join(MODELS)}")
    if model not in MODELS and "tts" not in model.lower():
        raise ApiError(400, f"model must be a speech model ({', '.join(MODELS)}, or any name with \"tts\"), "
                            f"got {model!r}", "model")
    text = need("input", str, "the text to speak")
    own = ", ".join(n for n, kind in voices.items() if kind != "alias")
    voice = need("voice", str, f"a voice ({own}) or a speaker string")
    fmt = body.get("response_format", "mp3")
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}, got {fmt!r}", "response_format")
    stream_format = body.get("stream_format", "audio")
    if not isinstance(stream_format, str) or stream_format not in ("audio", "sse"):
        raise ApiError(400, f'stream_format must be "audio" or "sse", got {stream_format!r}', "stream_format")
    speed = body.get("speed", 1.0)
    if not of_type(speed, float) or not 0.25 <= speed <= 4.0:
        raise ApiError(400, f"speed must be a number in [0.25, 4.0], got {speed!r}", "speed")
    values: dict = {"TEXT": text, "PROMPT": speed_prompt(float(speed))}
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(400, f"instructions must be a string, got {instructions!r}", "instructions")
        values |= instruction_inputs(instructions)
    if voice in voices:
        values["VOICE"] = voice
    elif len(voice) > 32:                     # a speaker string (the release's are ~300 characters)
        values["SPEAKER"] = voice
    else:
        raise ApiError(400, f"voice {voice!r} is not a voice here; voices: {own}, OpenAI's names "
                            f"({', '.join(n for n, kind in voices.items() if kind == 'alias')}) or a speaker string",
                       "voice")
    for i in INPUTS:                          # our extras: the inputs with a body field
        v = body.get(i.api_field) if i.api_field else None
        if i.json and isinstance(v, (dict, list)):
            v = json.dumps(v, ensure_ascii=False)      # the object itself, as the input's JSON text
        if v is not None:
            if not of_type(v, JSON[i.dtype]):
                kind = "a JSON object (or its text)" if i.json else JSON[i.dtype].__name__
                raise ApiError(400, f"{i.api_field} must be {kind}, got {v!r}", i.api_field)
            if JSON[i.dtype] in (int, float):
                try:
                    i.check(v, settings, i.api_field)
                except ValueError as e:
                    raise ApiError(400, str(e), i.api_field) from e
            values[i.name] = v
    return values, fmt, stream_format


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
                yield dataclasses.replace(chunk, sentence=chunk.sentence + sentences, offset=chunk.offset + samples)
    finally:
        await pipe.cancel()


def marks_asked(body: dict, stream_format: str) -> bool:
    """The body's `marks` (our extension: speech.sentence events in the SSE stream)."""
    marks = body.get("marks", False)
    if not isinstance(marks, bool):
        raise ApiError(400, f"marks must be true or false, got {marks!r}", "marks")
    if marks and stream_format != "sse":
        raise ApiError(400, 'marks come as speech.sentence events: ask for stream_format "sse" with them', "marks")
    return marks


class Marks:
    """Sentence marks of one stream: see(chunk) -> the marks of the sentences it completes, each
    {"index", "text", "start", "end", "sample_rate"} (sample offsets in the stream's audio;
    None: the stream's end)."""

    def __init__(self) -> None:
        self.open: dict | None = None
        self.samples = 0

    def see(self, chunk) -> list[dict]:
        done = []
        if self.open is not None and (chunk is None or chunk.sentence != self.open["index"]):
            self.open["end"] = chunk.offset if chunk is not None else self.samples
            done.append(self.open)
            self.open = None
        if chunk is not None:
            if self.open is None:
                self.open = {"index": chunk.sentence, "text": chunk.text, "start": chunk.offset, "end": None,
                             "sample_rate": SAMPLE_RATE}
            self.samples = chunk.offset + len(chunk.audio)
        return done


class GatewayMetrics:
    """The gateway's Prometheus series (its own registry): time to the first audio byte, requests
    by format and HTTP status, and clients that hung up before their audio was complete."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.first_byte = Histogram("velocity_gateway_time_to_first_byte_seconds",
                                    "Request arrival to its first audio chunk from Triton", ["format"],
                                    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5, 10), registry=self.registry)
        self.requests = Counter("velocity_gateway_requests", "Speech requests, by format and HTTP status",
                                ["format", "status"], registry=self.registry)
        self.disconnects = Counter("velocity_gateway_disconnects", "Clients that hung up before their audio "
                                   "was complete (their Triton stream is cancelled)", registry=self.registry)

    def render(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.registry)


def origin_allowed(headers, allowed: set[str]) -> bool:
    """A WebSocket's handshake may go on: no Origin (not a browser: the API keys are its check), the
    gateway's own page (the Origin's host is the request's Host), or an allowed origin ("*": any).
    A browser sends the page's origin with every WebSocket, and no CORS check guards one."""
    origin = headers.get("origin")
    if origin is None or "*" in allowed or origin.rstrip("/") in allowed:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == headers.get("host", "").lower()


def api_keys(settings) -> set[str]:
    """The keys a request may bear (VELOCITY_GATEWAY_API_KEYS and _FILE); none: the API is open."""
    from pathlib import Path

    keys = {k.strip() for k in settings.gateway_api_keys.split(",") if k.strip()}
    if settings.gateway_api_keys_file:
        keys |= {k.strip() for k in Path(settings.gateway_api_keys_file).read_text().splitlines() if k.strip()}
    return keys


def create_app(triton_url: str, settings=None, retries: int | None = None) -> FastAPI:
    """The ASGI app (FastAPI). triton_url: one gRPC address or several, comma-separated (see
    upstream.Gateway, with `retries`). settings: velocity.serving.settings.Settings (default:
    from the environment)."""
    from velocity.serving.settings import Settings

    settings = settings or Settings.from_env()
    keys, limit = api_keys(settings), settings.gateway_max_body_bytes
    admission = fair.Admission(fair.Limits.of(settings))
    origins = {o.strip().rstrip("/") for o in f"{settings.gateway_origins},{settings.gateway_cors_origins}".split(",")
               if o.strip()}

    async def admit(ws: WebSocket, key: str | None) -> str | None:
        """The socket's client, its socket counted against its and the gateway's caps (close with
        admission.close_socket) and its streams as its own (fair.CLIENT); None past a cap, the
        handshake answered 503 with Retry-After."""
        client = admission.client(key, ws.client.host if ws.client else None)
        try:
            admission.open_socket(client)
        except ApiError as e:
            await admission.refuse(client, f"websocket {ws.url.path}", e)
            try:
                await ws.send_denial_response(error_response(e))
            except RuntimeError:                    # a server without the denial-response extension
                await ws.close(code=1013, reason=e.message[:120])
            return None
        fair.CLIENT.set(client)
        return client

    async def refuse_origin(ws: WebSocket) -> bool:
        """Close a handshake from a page of another origin (HTTP 403); True if it was refused."""
        if origin_allowed(ws.headers, origins):
            return False
        log.warning("websocket %s: refused the page at %r (not this gateway's, not in VELOCITY_GATEWAY_ORIGINS)",
                    ws.url.path, ws.headers.get("origin"))
        await ws.close(code=1008, reason="this page's origin may not use this server: VELOCITY_GATEWAY_ORIGINS")
        return True
    gw = Gateway(triton_url, retries, admission, settings.gateway_health_url)

    def seeded(values: dict) -> dict:
        """VELOCITY_GATEWAY_DEFAULT_SEED for a request that names no seed."""
        if settings.gateway_default_seed >= 0 and values.get("SEED") is None:
            return values | {"SEED": settings.gateway_default_seed}
        return values

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await gw.close()

    app = FastAPI(title="velocity-tts", docs_url=None, redoc_url=None, lifespan=lifespan)
    metrics = GatewayMetrics()

    app.add_middleware(Guard, keys=keys, admission=admission, limit=limit)

    # added after the guard, so outside it: preflights (no key) are answered by CORS
    if settings.gateway_cors_origins:
        from fastapi.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=settings.gateway_cors_origins.split(","),
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return error_response(e)

    page_html = (Path(__file__).parent / "page.html").read_text()       # read once, served as is

    @app.get("/", include_in_schema=False)
    async def page():
        """The web page: one HTML file with its own script and styles."""
        return HTMLResponse(page_html)

    @app.get("/health")
    async def health():
        ok = await gw.ready()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.websocket(PATH)
    async def speech_stream(ws: WebSocket):
        """Streamed text in, audio and sentence marks out (velocity/gateway/speech_socket.py)."""
        if await refuse_origin(ws):
            return
        auth = ws.headers.get("authorization", "")
        if keys and not (auth.startswith("Bearer ") and auth[7:].strip() in keys):
            await ws.close(code=1008, reason="a valid API key is required: Authorization: Bearer <key>")
            return
        if (client := await admit(ws, auth[7:].strip() if keys else None)) is None:
            return
        try:
            await ws.accept()
            names = await gw.voice_names(fresh=True)
            await SpeechSocket(ws, gw, lambda body: seeded(triton_values(body, names, settings)[0]),
                               metrics.disconnects.inc, settings.gateway_send_timeout,
                               settings.gateway_idle_timeout).run()
        finally:
            admission.close_socket(client)

    @app.websocket(elevenlabs.PATH)
    async def elevenlabs_stream(ws: WebSocket, voice_id: str):
        """ElevenLabs' multi-context WebSocket, as Pipecat speaks it (velocity/gateway/elevenlabs.py)."""
        if await refuse_origin(ws):
            return
        key = ws.headers.get("xi-api-key") or ws.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if keys and key not in keys:
            await ws.close(code=1008, reason="a valid API key is required: the xi-api-key header")
            return
        if (client := await admit(ws, key if keys else None)) is None:
            return
        try:
            await elevenlabs_session(ws, voice_id)
        finally:
            admission.close_socket(client)

    async def elevenlabs_session(ws: WebSocket, voice_id: str) -> None:
        """An admitted ElevenLabs socket, from its accept to its end."""
        await ws.accept()
        names = await gw.voice_names(fresh=True)

        def values_of(text: str, speed: float) -> dict:
            body = {"model": "tts-1", "voice": voice_id, "input": text, "response_format": "pcm", "speed": speed}
            return seeded(triton_values(body, names, settings)[0])

        try:
            rate = elevenlabs.output_rate(ws.query_params.get("output_format"))
            await gw.check(values_of("Hi.", 1.0))           # the voice, checked by the server now
        except ApiError as e:
            await ws.send_text(json.dumps({"error": "invalid_request", "message": e.message}))
            await ws.close(code=1008, reason=e.message[:120])
            return
        await elevenlabs.ElevenLabsSocket(ws, gw, values_of, rate, metrics.disconnects.inc,
                                          settings.gateway_send_timeout, settings.gateway_idle_timeout).run()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "velocity-tts"} for m in MODELS]}

    @app.get("/v1/audio/voices")
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

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
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
            values, fmt, stream_format = triton_values(body, names, settings)
            values = seeded(values)
            want_marks = marks_asked(body, stream_format)
            timeout = request_timeout(body, request.headers.get(TIMEOUT_HEADER))
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
            metrics.requests.labels(label, str(e.status)).inc()
            raise
        except ClientLeft:
            metrics.disconnects.inc()
            metrics.requests.labels(label, "499").inc()
            return Response(status_code=499)               # nginx's "client closed request": no one reads it
        metrics.first_byte.labels(fmt).observe(time.perf_counter() - t0)
        metrics.requests.labels(fmt, "200").inc()

        async def encoded():
            """(chunk, its encoded bytes) in order, then (None, the encoder's last bytes)."""
            complete = False
            enc = Encoder(fmt, SAMPLE_RATE)
            try:
                if first is not None:
                    yield first, enc.push(first.audio)
                async for chunk in chunks:
                    yield chunk, enc.push(chunk.audio)
                yield None, enc.finish()
                complete = True
            except ApiError:
                complete = True                             # the server ended it: not a hang-up
                raise
            finally:
                enc.close()                                 # the codec's threads, now
                if not complete:
                    metrics.disconnects.inc()
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
                        if data:
                            yield event(type="speech.audio.delta", audio=base64.b64encode(data).decode())
            except ApiError as e:                        # failed after the audio began: said, and no "done"
                log.warning("speech: the stream failed after its audio began (%s)", e.message)
                yield event(type="error", error=e.body()["error"])
                return
            yield event(type="speech.audio.done")

        if stream_format == "sse":
            return ClosingStreamingResponse(sse(), "text/event-stream", settings.gateway_send_timeout)
        return ClosingStreamingResponse(audio(), FORMATS[fmt], settings.gateway_send_timeout)

    return app


def main(argv: list[str] | None = None) -> None:
    """velocity-tts-gateway: the OpenAI-compatible speech API."""
    import uvicorn

    ap = argparse.ArgumentParser(prog="velocity-tts-gateway", description=main.__doc__)
    ap.add_argument("--triton", default="localhost:8001",
                    help="the Triton server's gRPC address, or several replicas' comma-separated")
    ap.add_argument("--retries", type=int, default=None,
                    help="a request refused before its first chunk (busy, draining, unreachable) is "
                         "tried again on the next address up to this many times (default: each other "
                         "address once; through a balancer give one address and e.g. --retries 2)")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[gateway] %(levelname)s %(message)s")
    from velocity.serving.settings import Settings

    settings = Settings.from_env()
    # a WebSocket message is held to the body limit once decompressed (permessage-deflate is on)
    config = uvicorn.Config(create_app(args.triton, settings, retries=args.retries), log_level="warning",
                            timeout_graceful_shutdown=5, ws_max_size=settings.gateway_max_body_bytes)
    uvicorn.Server(config).run(sockets=[listen(args.host, args.port, settings.gateway_send_buffer_bytes)])


def listen(host: str, port: int, send_buffer: int) -> socket.socket:
    """The gateway's listening socket; its connections inherit its send buffer (0: the OS's), which
    bounds the audio the kernel holds for a client that does not read."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if send_buffer > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind(addr)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
