"""Triton's HTTP generate_stream for the `tts` model (velocity-tts-client --http): its
server-sent events read as they come, paced by how fast the caller takes the chunks, as
client.triton.stream_grpc is (the `pace` model, over HTTP)."""
from __future__ import annotations

import contextlib
import http.client
import json
import queue
import socket
import threading
import urllib.request
from collections.abc import Iterator

import numpy as np

from client.pace_teller import PaceTeller
from client.triton import ServerError
from velocity.serving.wire import triton_key
from velocity.serving.wire.tts_responses import READ_AHEAD_S, end_frame

HELD_MAX = round(READ_AHEAD_S * 24000)     # samples of a generate_stream read ahead of its caller at most


def tell_pace_http(url: str, ref: int, taken: int, key: str = "") -> bool:
    """tell_pace over Triton's HTTP endpoint."""
    body = {"inputs": [{"name": n, "shape": [1, 1], "datatype": "INT64", "data": [v]}
                       for n, v in (("STREAM", ref), ("TAKEN", taken))]}
    req = urllib.request.Request(f"http://{url}/v2/models/pace/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **triton_key.http_headers(key)})
    try:
        with urllib.request.urlopen(req, timeout=10):
            return True
    except OSError:
        return False


def lines(r: http.client.HTTPResponse) -> Iterator[bytes]:
    """The lines of a response body; http.client.IncompleteRead if it is cut short."""
    rest = b""
    while block := r.read1(65536):
        *done, rest = (rest + block).split(b"\n")
        yield from done
    if rest:
        yield rest


def chunk_end(event: dict) -> int:
    """The frame where a generate_stream event's chunk ends (end_frame)."""
    def one(name: str) -> int:
        return int(np.ravel(event.get(name, [0]))[0])
    return end_frame(one("SAMPLE_OFFSET"), event["WAVEFORM"].size, one("SENTENCE_INDEX"))


def http_events(r: http.client.HTTPResponse, teller: PaceTeller, stop,
                held_max: int = HELD_MAX) -> Iterator[tuple[dict, int]]:
    """The server-sent events of a generate_stream response (WAVEFORM as a flat float32 array),
    each with the frame where its chunk ends (chunk_end; 0 without audio), read by a thread of
    their own as they come (teller.arrive: how far the stream's audio arrived),
    while at most `held_max` samples wait for the caller; the reader's errors in turn. stop():
    ends the reader's blocking read when the caller leaves (shuts the connection's socket)."""
    got: queue.Queue = queue.Queue()
    room, held, closed = threading.Condition(), [0], [False]

    def read_all() -> None:
        try:
            for line in lines(r):
                if line.startswith(b"data: "):
                    event, n, end = json.loads(line[6:]), 0, 0
                    if "WAVEFORM" in event:
                        event["WAVEFORM"] = np.asarray(event["WAVEFORM"], np.float32).reshape(-1)
                        n, end = event["WAVEFORM"].size, chunk_end(event)
                        teller.arrive(end, int(np.ravel(event.get("STREAM", [0]))[0]))
                    got.put((event, end))
                    with room:                      # the caller takes it and frees its room (any order)
                        held[0] += n
                        room.wait_for(lambda: held[0] <= held_max or closed[0])
                    if closed[0]:
                        return
            got.put(None)
        except Exception as e:                      # raised to the caller in turn (a cut body: ServerError)
            got.put(e)

    reader = threading.Thread(target=read_all, name="generate-stream-reader", daemon=True)
    reader.start()
    try:
        while (item := got.get()) is not None:
            if isinstance(item, Exception):
                raise item
            if "WAVEFORM" in item[0]:
                with room:
                    held[0] -= item[0]["WAVEFORM"].size
                    room.notify()
            yield item
    finally:
        with room:
            closed[0] = True
            room.notify()
        stop()
        reader.join(timeout=5)


def stream_http(url: str, values: dict, timeout: float = 600, key: str = "",
                words: list | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (chunk index, audio) from POST /v2/models/tts/generate_stream (server-sent events);
    words: each chunk's WORDS appended (a list of {"word", "start", "end", "spoken"}) as it comes.
    A body cut short (the server died) raises ServerError: read with read1, since http.client's
    line iteration takes a chunked body's cut for its end. Paced by how fast the caller takes the
    chunks, as stream_grpc is (over HTTP: POST /v2/models/pace/infer). key: the Triton key
    (velocity.serving.wire.triton_key; "": `local`, a server without keys')."""
    body = json.dumps({k: v for k, v in values.items() if v is not None}).encode()
    host, _, port = url.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    teller = PaceTeller(lambda ref, taken: tell_pace_http(url, ref, taken, key))

    def stop() -> None:
        with contextlib.suppress(OSError, AttributeError):
            conn.sock.shutdown(socket.SHUT_RDWR)

    try:
        try:
            conn.connect()
        except OSError as e:
            raise ServerError(f"no Triton server at http://{url} ({e}); start one with `make serve`") from e
        conn.request("POST", "/v2/models/tts/generate_stream", body,
                     {"Content-Type": "application/json", **triton_key.http_headers(key)})
        r = conn.getresponse()
        if r.status != 200:
            raise ServerError(f"HTTP {r.status}: {r.read().decode(errors='replace')}")
        for event, end in http_events(r, teller, stop):
            if "error" in event:
                raise ServerError(event["error"])
            if "WAVEFORM" in event:
                if words is not None:
                    given = np.ravel(event.get("WORDS", [""]))[0]
                    words.append(json.loads(given) if given else [])
                yield int(np.ravel(event["CHUNK_INDEX"])[0]), event["WAVEFORM"]
                teller.take(end)
    except http.client.IncompleteRead as e:
        raise ServerError(f"the stream from http://{url} was cut short: the server stopped or restarted "
                          "mid-stream (its log says why); try again") from e
    except (http.client.HTTPException, ConnectionError, json.JSONDecodeError) as e:
        raise ServerError(f"http://{url} does not answer as Triton's HTTP endpoint ({type(e).__name__}: {e}); "
                          "is that the gRPC port? HTTP listens on 8000 by default") from e
    finally:
        teller.close()
        conn.close()
