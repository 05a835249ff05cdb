"""Talking to the server: the `tts` inputs as tritonclient tensors, a gRPC stream, `tts_offline`,
the `voices` list and the metrics port (HTTP generate_stream: client.http_stream). Used by the CLI
(client/tts_client.py), the benchmarks and the tests."""
from __future__ import annotations

import contextlib
import json
import queue
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np

from velocity.serving.wire import triton_key
from velocity.serving.wire.input_table import array_inputs, make_inputs  # noqa: F401 (re-exported)
from client.pace_teller import PaceTeller
from velocity.serving.wire.tts_responses import AudioChunk, Retry, pace_inputs, stream_ref

RETRY_PAUSE = 0.5     # seconds: a balancer that checks every 300 ms has seen a drain by then


class ServerError(RuntimeError):
    """The server is unreachable, the model not ready, or the request failed."""


class NotServing(ServerError):
    """The server did not answer, or said that it or the model is not ready: nothing was sent
    yet, so another try (behind a balancer, another replica) is safe."""


def check_ready(client, model: str, where: str, headers: dict | None = None) -> None:
    try:
        live = client.is_server_live()
    except Exception as e:
        raise NotServing(f"no Triton server at {where} ({e}); start one with `make serve`") from e
    try:
        ready = live and client.is_model_ready(model, headers=headers)
    except Exception as e:                    # a server shutting down answers "Server not ready"
        raise NotServing(f"model '{model}' is not ready on {where} ({e}); see the server log (make serve)") from e
    if not ready:
        raise NotServing(f"model '{model}' is not ready on {where}; see the server log (make serve)")


def stream_grpc(url: str, values: dict, timeout: float = 600, check: bool = True,
                texts: list | None = None, retries: int = 0,
                deadline: float | None = None, marks: list | None = None,
                key: str = "") -> Iterator[tuple[int, np.ndarray]]:
    """Yield (chunk index, audio) as the `tts` ensemble streams them over one gRPC stream; with
    text refine each sentence's refined text is appended to `texts` as its first chunk comes.
    marks: each chunk's (chunk index, SENTENCE_INDEX, SAMPLE_OFFSET, SENTENCE_TEXT, WORDS) appended as
    it comes; WORDS: the words estimated to start in the chunk, [{"word", "start", "end", "spoken"}]
    in samples of the stream's audio (velocity.tts.word_timing).
    timeout: seconds to wait for each chunk here. deadline: seconds the server may take for the
    whole request (Triton's request timeout: past it the server stops it and answers an error).
    Closing the iterator early (Ctrl-C, a closed pipe) cancels the stream: the server stops its
    work on it within a second. A caller that takes the chunks slower than they come (a player
    at real time behind a pipe) paces the stream: once it is 2 s of audio behind, the server's
    `pace` model is told how far it took them (at once, even while the caller is still on a chunk:
    client.pace_teller), and the server pauses the stream with VELOCITY_BACKLOG_SECONDS of audio
    not yet taken (ReadPosition).
    retries: a request refused before its first chunk (server busy, draining, or not serving:
    NotServing) is sent again, up to this many times, after a pause that grows by RETRY_PAUSE each
    time: behind a balancer the next try goes to another replica (the pause gives the balancer
    time to see a drain).
    key: the Triton key (velocity.serving.wire.triton_key), where the server asks for one."""
    retry = Retry(retries, RETRY_PAUSE)
    for attempt in range(retries + 1):
        started = False
        try:
            with contextlib.closing(_stream_grpc(url, values, timeout, check, texts, deadline, marks, key)) as chunks:
                for item in chunks:
                    started = True
                    yield item
            return
        except ServerError as e:
            if not retry.again(attempt, started, str(e), unreachable=isinstance(e, NotServing)):
                raise
        time.sleep(retry.wait(attempt))


def tell_pace(client, ref: int, taken: int, headers: dict | None = None) -> bool:
    """Tell the server's `pace` model how far stream `ref` was taken; False when it cannot be told
    (a server without `pace`): the stream then goes unpaced."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        client.infer("pace", pace_inputs(grpcclient, ref, taken), headers=headers)
        return True
    except InferenceServerException:
        return False


def _stream_grpc(url: str, values: dict, timeout: float, check: bool, texts: list | None,
                 deadline: float | None = None, marks: list | None = None,
                 key: str = "") -> Iterator[tuple[int, np.ndarray]]:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    headers = triton_key.grpc_headers(key)
    if check:
        check_ready(client, "tts", url, headers)
    got: queue.Queue = queue.Queue()
    teller = PaceTeller(lambda ref, taken: tell_pace(client, ref, taken, headers))

    def came(result, error) -> None:                   # on tritonclient's thread, as each response comes
        c = None
        if error is None and (wav := result.as_numpy("WAVEFORM")) is not None:
            c = AudioChunk.of(result, wav)                 # as the gateway reads a chunk
            teller.arrive(c.end, stream_ref(result))
        got.put((result, error, c))

    ended = False        # the server ended the request (final flag or error): nothing to cancel
    try:
        client.start_stream(callback=came, headers=headers)
        try:
            client.async_stream_infer("tts", make_inputs(grpcclient, values), enable_empty_final_response=True,
                                      timeout=None if deadline is None else max(1, round(deadline * 1e6)))
        except InferenceServerException as e:     # the stream failed at once (a key refused): its reason came
            ended = True                          # to the callback, or is this
            try:
                error = got.get(timeout=5)[1] or e
            except queue.Empty:
                error = e
            raise ServerError(str(error)) from e
        while True:
            result, error, c = got.get(timeout=timeout)
            if error is not None:
                ended = True
                raise ServerError(str(error))
            ended = result.get_response().parameters["triton_final_response"].bool_param
            if c is not None:       # the final flag comes on the last chunk or on an empty response
                refined = result.as_numpy("REFINED_TEXT")
                if texts is not None and refined is not None and refined.reshape(-1)[0]:
                    texts.append(refined.reshape(-1)[0].decode())
                index = int(result.as_numpy("CHUNK_INDEX").reshape(-1)[0])
                if marks is not None:
                    marks.append((index, c.sentence, c.offset, c.text, c.words))
                yield index, c.audio
                teller.take(c.end)                             # the caller took it
            if ended:
                return
    finally:
        teller.close()
        client.stop_stream(cancel_requests=not ended)    # cancel only a stream left early
        client.close()


def offline_grpc(url: str, values: dict, key: str = "") -> Iterator[tuple[int, np.ndarray]]:
    """The whole waveform from `tts_offline` in one response, as a single chunk."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    headers = triton_key.grpc_headers(key)
    check_ready(client, "tts_offline", url, headers)
    try:
        res = client.infer("tts_offline", make_inputs(grpcclient, values), headers=headers)
    except InferenceServerException as e:
        raise ServerError(e.message()) from e
    yield 0, res.as_numpy("WAVEFORM").reshape(-1)


def list_voices(url: str, key: str = "") -> dict:
    """The server's voices (the `voices` model): {"default": name, "voices": [{"name", "kind", ...}]}."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    headers = triton_key.grpc_headers(key)
    check_ready(client, "voices", url, headers)
    try:
        res = client.infer("voices", [], headers=headers)
    except InferenceServerException as e:
        raise ServerError(e.message()) from e
    return json.loads(res.as_numpy("VOICES").reshape(-1)[0])


def fetch_metrics(metrics_url: str) -> str:
    """The server's Prometheus text (the metrics port, e.g. http://localhost:8002/metrics)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        return r.read().decode()


def parse_metric(text: str, name: str) -> float:
    """The value of the first sample of `name` in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"{name} not in the metrics:\n{text[:3000]}")


def model_metric(text: str, name: str, model: str) -> float:
    """The sum of `name`'s samples for one model (Triton's per-model metrics, e.g.
    nv_inference_exec_count{model="vocoder",version="1"}) in Prometheus text; 0 when it has none."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and f'model="{model}"' in line)


def metric(metrics_url: str, name: str) -> float:
    return parse_metric(fetch_metrics(metrics_url), name)
