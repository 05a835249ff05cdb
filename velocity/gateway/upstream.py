"""The gateways' side of Triton: one `tritonclient.grpc.aio` client, a `tts` stream per request,
and Triton's errors turned into HTTP-style statuses (ApiError) that the OpenAI API answers with
and the Wyoming server reports."""
import json
from collections.abc import AsyncIterator

import numpy as np

RETRYABLE = ("server busy", "shutting down")


class ApiError(Exception):
    """An error response in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status in (400, 401, 413) else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def triton_error(message: str) -> ApiError:
    """A `tts` stream's error -> 503 (retry: busy, draining), 500 (our fault) or 400 (the request's)."""
    if any(m in message for m in RETRYABLE):
        return ApiError(503, message, code="server_busy")
    if "generation failed" in message or "internal error" in message:
        return ApiError(500, message, code="internal_error")
    param = next((f for f, n in (("input", "TEXT"), ("voice", "VOICE"), ("voice", "SPEAKER"), ("speed", "PROMPT"),
                                 ("speaker_sample", "SPEAKER_SAMPLE"), ("sample_text", "SAMPLE_TEXT"),
                                 ("temperature", "TEMPERATURE"), ("top_p", "TOP_P"), ("top_k", "TOP_K"),
                                 ("seed", "SEED")) if n in message), None)
    return ApiError(400, message, param)


class Gateway:
    """The Triton side: one aio gRPC client, a stream per request."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client = None
        self._names: list[str] | None = None

    @property
    def client(self):
        if self._client is None:
            import tritonclient.grpc.aio as grpcclient
            self._client = grpcclient.InferenceServerClient(self.url)
        return self._client

    async def close(self) -> None:
        """Close the gRPC channel (an aio channel left to interpreter exit can crash it)."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def ready(self) -> bool:
        try:
            return await self.client.is_model_ready("tts")
        except Exception:
            return False

    async def voices(self) -> dict:
        from tritonclient.utils import InferenceServerException
        try:
            res = await self.client.infer("voices", [])
        except InferenceServerException as e:
            raise ApiError(502, f"the Triton server at {self.url} did not answer ({e.message()})") from e
        return json.loads(res.as_numpy("VOICES").reshape(-1)[0])

    async def voice_names(self, fresh: bool = False) -> list[str]:
        """The server's voice names: asked once, and again when a request names one not among
        them (the voices change only when the server restarts)."""
        if fresh or self._names is None:
            self._names = [v["name"] for v in (await self.voices())["voices"]]
        return self._names

    async def chunks(self, values: dict) -> AsyncIterator[np.ndarray]:
        """The request's audio chunks in order; ApiError for an error before or during the stream.
        Leaving early (the client hung up) cancels the Triton stream."""
        import tritonclient.grpc.aio as grpcclient

        from velocity.gateway.inputs import make_inputs

        async def requests():
            yield {"model_name": "tts", "inputs": make_inputs(grpcclient, values), "enable_empty_final_response": True}

        stream = self.client.stream_infer(requests())
        pending: dict[int, np.ndarray] = {}
        nxt = 0
        try:
            async for result, error in stream:
                if error is not None:
                    raise triton_error(str(error))
                wav = result.as_numpy("WAVEFORM")
                if wav is not None:
                    pending[int(result.as_numpy("CHUNK_INDEX").reshape(-1)[0])] = wav.reshape(-1)
                    while nxt in pending:
                        yield pending.pop(nxt)
                        nxt += 1
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return
        except ApiError:
            raise
        except Exception as e:                      # the connection, not the request
            raise ApiError(502, f"the Triton server at {self.url} failed: {e}") from e
        finally:
            stream.cancel()
