"""The gateways' side of Triton: one `tritonclient.grpc.aio` client, a `tts` stream per request,
and Triton's errors turned into HTTP-style statuses (ApiError) that the OpenAI API answers with
and the Wyoming server reports."""
import asyncio
import contextlib
import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable

from velocity.gateway.caller import CLIENT
from velocity.serving.wire.client_tag import load_key, sign
from velocity.serving.wire import triton_key
from velocity.gateway.health_reason import HealthReason
from velocity.gateway.pace import Pacer, read_ahead
from velocity.serving.wire.input_table import INPUTS
from velocity.serving.wire.tts_responses import (RETRYABLE, TRITON_STOPPED, AudioChunk, Retry,  # noqa: F401 (the gateway's names)
                                             pace_inputs, stream_ref)
from velocity.serving.lifecycle.watchdog import DIED

# the body field behind each `tts` input: the request table's, and those the gateway makes of others
FIELD_OF = {"TEXT": "input", "VOICE": "voice", "SPEAKER": "voice", "PROMPT": "speed",
            "REFINE_PROMPT": "instructions"} | {i.name: i.api_field for i in INPUTS if i.api_field}
DEADLINE = "deadline exceeded"
NOT_HEALTHY = "is not healthy"          # Triton's "Stub process 'vocoder_0_0' is not healthy"
RECONNECT_MS = 1000           # the longest pause between the gateway's tries to reach a Triton that is down
log = logging.getLogger("velocity.gateway")


class ApiError(Exception):
    """An error response in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if 400 <= self.status < 500 and self.status != 429 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def triton_error(message: str) -> ApiError:
    """A `tts` stream's error -> 503 (retry: busy, draining), 504 (its timeout passed), 500 (our
    fault) or 400 (the request's)."""
    if any(m in message for m in TRITON_STOPPED):   # past the drain: Triton itself refuses
        return ApiError(503, f"the server is shutting down ({message}): try again", code="server_busy")
    if any(m in message for m in RETRYABLE):
        return ApiError(503, message, code="server_busy")
    if DIED in message:                           # the llm named a part that died (velocity.serving.lifecycle.drain)
        return ApiError(503, message, code="server_unavailable")
    if NOT_HEALTHY in message:                    # a model's process died: the watchdog restarts the server
        return ApiError(503, f"{message}: the server is restarting; try again in a few seconds", code="server_unavailable")
    if DEADLINE in message or "Request timeout expired" in message:
        return ApiError(504, message, "timeout", code="timeout")
    if "generation failed" in message or "internal error" in message:
        return ApiError(500, message, code="internal_error")
    # the first input the message names (a whole word: REFINE_TOP_P is not TOP_P), as its body field
    param = next((FIELD_OF[w] for w in re.findall(r"\b[A-Z][A-Z_]+\b", message) if w in FIELD_OF), None)
    return ApiError(400, message, param)


def channel_args() -> list[tuple[str, int]]:
    """tritonclient's own channel options, with reconnects at most RECONNECT_MS apart: gRPC's
    default backoff grows to 2 minutes, so a Triton that restarted (scripts/serve.sh, after a
    part died) would stay unreachable from here long after it is ready again."""
    from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions

    k = KeepAliveOptions()
    return [("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", k.keepalive_time_ms), ("grpc.keepalive_timeout_ms", k.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", k.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", k.http2_max_pings_without_data),
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_MS // 4), ("grpc.min_reconnect_backoff_ms", RECONNECT_MS // 4),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_MS)]


def unavailable(url: str, e: Exception) -> "ApiError":
    """Triton unreachable, or its connection lost mid-stream: 503 (retry), with gRPC's short reason."""
    why = e.details() if hasattr(e, "details") and callable(e.details) else str(e)
    return ApiError(503, f"the Triton server at {url} is unavailable ({why}): it may be restarting after a "
                    "failure; try again in a few seconds", code="server_unavailable")


class Gateway:
    """The Triton side: an aio gRPC client per upstream, a stream per request.

    url: one gRPC address, or several separated by commas (replicas). A request that fails
    before its first chunk with a retryable error (503: busy, draining or unreachable) is
    tried again on the next upstream, up to `retries` times (default: each other upstream once;
    through a balancer, one address and retries > 0 lets the balancer pick another replica).
    After the first chunk nothing is retried: the client already has audio.
    """

    def __init__(self, url: str, retries: int | None = None, admission=None, health: str = "",
                 run_dir: str = "", key: str = "") -> None:
        """admission: velocity.gateway.fair.Admission, whose stream() each stream holds (None: no caps);
        health: the health port's URL, whose reason names a part that died (HealthReason); run_dir:
        serve.sh's run folder, whose client key signs each stream's CLIENT (none: the server
        counts this gateway's streams as direct callers') and whose Triton key every call shows,
        unless `key` (VELOCITY_TRITON_KEY) gives it (velocity.serving.wire.triton_key)."""
        self.admission, self.health = admission, HealthReason(health)
        self.client_key = load_key(run_dir)
        self.headers = triton_key.grpc_headers(triton_key.load(key, run_dir))
        self.urls = [u.strip() for u in url.split(",") if u.strip()]
        if not self.urls:
            raise ValueError("the Triton address is empty: give host:port (or several, comma-separated)")
        self.url = ",".join(self.urls)
        self.retry = Retry(len(self.urls) - 1 if retries is None else retries)
        self._clients: dict = {}
        self._names: dict[str, str] | None = None
        self._unary: set[asyncio.Task] = set()      # unary calls in flight (uncancelled)
        self._turn = 0                              # round robin over the upstreams

    def client_for(self, url: str):
        if url not in self._clients:
            import tritonclient.grpc.aio as grpcclient
            self._clients[url] = grpcclient.InferenceServerClient(url, channel_args=channel_args())
        return self._clients[url]

    def uncancelled(self, call: Awaitable):
        """`call`, a unary gRPC call to Triton, run to its end even when its caller is cancelled
        meanwhile (a client that hung up, a stream's Pacer closed): the caller stops waiting, the
        call is not cancelled. A unary infer cancelled as it completes can crash Triton 2.51's
        gRPC frontend, the pytriton wheel's (SIGSEGV; triton-inference-server/server#8034, fixed
        in 25.04). These calls are short. A stream's cancel is another handler and stays."""
        task = asyncio.ensure_future(call)
        self._unary.add(task)
        task.add_done_callback(self._unary_done)
        return asyncio.shield(task)

    def infer(self, url: str, model: str, inputs: list):
        """A unary infer of `model` on upstream `url`, never cancelled in flight (uncancelled)."""
        return self.uncancelled(self.client_for(url).infer(model, inputs, headers=self.headers))

    def _unary_done(self, task: asyncio.Task) -> None:
        self._unary.discard(task)
        if not task.cancelled():
            task.exception()                        # retrieved: its caller may have left

    async def close(self) -> None:
        """Close the gRPC channels (an aio channel left to interpreter exit can crash it), once
        the unary calls in flight are done (closing cancels them), 2 s at most."""
        if self._unary:
            await asyncio.wait(set(self._unary), timeout=2)
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()

    async def check(self, values: dict) -> None:
        """A request's inputs checked by the server's text front end, which generates nothing:
        ApiError as the stream would give it (400 naming the field), before any text is spoken.
        An upstream that fails otherwise (down, draining) passes the check to the next one."""
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import InferenceServerException

        from velocity.serving.wire.input_table import make_inputs

        failed = []
        for url in self.urls:
            try:
                await self.infer(url, "text_frontend", make_inputs(grpcclient, values))
                return
            except InferenceServerException as e:
                if e.status() == "StatusCode.INVALID_ARGUMENT":
                    raise triton_error(e.message()) from e
                failed.append(f"{url}: {e.message()}")
        raise await self.named(ApiError(503, f"no Triton server could check the request ({'; '.join(failed)}): it "
                                        "may be restarting after a failure; try again in a few seconds",
                                        code="server_unavailable"))

    async def ready(self) -> bool:
        """Some upstream's `tts` is ready and that server is not draining (its `voices` says)."""
        for url in self.urls:
            try:
                ready = await self.uncancelled(self.client_for(url).is_model_ready("tts", headers=self.headers))
                if ready and not (await self._listing(url))["draining"]:
                    return True
            except Exception:
                continue
        return False

    async def _listing(self, url: str) -> dict:
        res = await self.infer(url, "voices", [])
        return json.loads(res.as_numpy("VOICES").reshape(-1)[0])

    async def voices(self) -> dict:
        from tritonclient.utils import InferenceServerException
        for url in self.urls:                       # the first upstream that answers
            try:
                return await self._listing(url)
            except InferenceServerException as e:
                last = e
        raise await self.named(unavailable(self.url, last)) from last

    async def voice_names(self, fresh: bool = False) -> dict[str, str]:
        """The server's voice names and their kinds ("speaker", "sample", "alias"): asked once, and
        again when a request names one not among them (the voices change only when the server restarts)."""
        if fresh or self._names is None:
            self._names = {v["name"]: v["kind"] for v in (await self.voices())["voices"]}
        return self._names

    async def chunks(self, values: dict, timeout: float | None = None) -> AsyncIterator[AudioChunk]:
        """The request's audio chunks in order (AudioChunk); ApiError for an error before or during the stream.
        Leaving early (the client hung up) cancels the Triton stream, which stops the server's
        work on it within a second. timeout: seconds the request may take, sent as Triton's
        request timeout (the server ends it past that; a 504). Retryable errors before the first
        chunk move on to the next upstream (see the class). The stream counts as the current
        client's while it runs (fair.Admission; 503 past the client's cap). Read ahead of the
        caller, and paced by how far the caller's client read (velocity.gateway.pace: a writer
        calls each chunk's read() once it handed the chunk to its client). The stream names its
        client to the server (CLIENT: velocity.gateway.caller), whose engine shares its batch
        between clients."""
        with self.admission.stream() if self.admission else contextlib.nullcontext():
            try:
                async with contextlib.aclosing(read_ahead(self._chunks(values, timeout))) as chunks:
                    async for chunk in chunks:
                        yield chunk
            except ApiError as e:
                raise await self.named(e) from e

    async def named(self, e: ApiError) -> ApiError:
        """An unavailable server's error with the health port's reason (which part died), if it has one."""
        if e.code != "server_unavailable" or DIED in e.message or not (why := await self.health.why()):
            return e
        return ApiError(503, f"{why} ({e.message})", code="server_unavailable")

    async def _chunks(self, values: dict, timeout: float | None) -> AsyncIterator[AudioChunk]:
        start, self._turn = self._turn, self._turn + 1
        for attempt in range(self.retry.retries + 1):
            url = self.urls[(start + attempt) % len(self.urls)]
            started = False
            try:
                async with contextlib.aclosing(self._stream(url, values, timeout)) as stream:
                    async for wav in stream:
                        started = True
                        yield wav
                return
            except ApiError as e:
                if not self.retry.again(attempt, started, e.message, unreachable=e.code == "server_unavailable"):
                    raise
                log.info("%s before the first chunk (%s): trying again on %s", url, e.message,
                         self.urls[(start + attempt + 1) % len(self.urls)])

    async def _stream(self, url: str, values: dict, timeout: float | None = None) -> AsyncIterator[AudioChunk]:
        """One `tts` stream on one upstream, chunks in order."""
        import tritonclient.grpc.aio as grpcclient

        from velocity.serving.wire.input_table import make_inputs

        values = {**values, "CLIENT": sign(CLIENT.get(), self.client_key) or None}   # the engine's fair share

        async def requests():
            yield {"model_name": "tts", "inputs": make_inputs(grpcclient, values), "enable_empty_final_response": True,
                   "timeout": None if timeout is None else max(1, round(timeout * 1e6))}

        stream = self.client_for(url).stream_infer(requests(), headers=self.headers)
        pending: dict[int, AudioChunk] = {}
        nxt, pacer = 0, None
        ended = False       # the server ended the request (an error or the final flag): nothing to cancel
        try:
            async for result, error in stream:
                if error is not None:
                    ended = True
                    raise triton_error(str(error))
                wav = result.as_numpy("WAVEFORM")
                if wav is not None:
                    chunk = AudioChunk.of(result, wav)
                    if pacer is None and (ref := stream_ref(result)) > 0:
                        pacer = Pacer(functools.partial(self._pace, url, ref))
                    if pacer is not None:
                        pacer.received(chunk.end)
                        chunk.on_read = functools.partial(pacer.read, chunk.end)
                    pending[int(result.as_numpy("CHUNK_INDEX").reshape(-1)[0])] = chunk
                    while nxt in pending:
                        yield pending.pop(nxt)
                        nxt += 1
                if result.get_response().parameters["triton_final_response"].bool_param:
                    ended = True
                    return
        except ApiError:
            raise
        except Exception as e:                      # the connection, not the request
            raise unavailable(url, e) from e
        finally:
            # Only a stream left early is cancelled: a cancel that reaches an ensemble request
            # Triton has already ended with an error leaves it in flight for good (Triton 2.51),
            # and the server's stop then waits out its exit timeout for it.
            if not ended:
                stream.cancel()
            if pacer is not None:
                pacer.close()

    async def _pace(self, url: str, ref: int, taken: int) -> None:
        """Tell the server how far the client of stream `ref` has read (velocity.gateway.pace)."""
        import tritonclient.grpc.aio as grpcclient

        await self.infer(url, "pace", pace_inputs(grpcclient, ref, taken))
