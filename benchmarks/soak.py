"""Soak test: a steady mix of streams, cancellations and bad requests against one server.

    .venv/bin/python -m benchmarks.soak --seconds 3600 --pid $(pgrep -o -f scripts/serve.sh)

Afterwards it checks that no KV block is in use, no sequence runs and no request is in
flight, that the server's resident memory is back within 20% + 64 MiB of its level after
warm-up, and that every good request's audio was complete (chunk indices 0..n-1, whole
frames). Prints a JSON report; exit status 1 when a check fails. tests/server/test_soak.py runs it
for a bounded time in CI.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.harness import bench_texts
from client.triton import ServerError, array_inputs, metric, stream_grpc

TEXTS = bench_texts()
BAD = [{"TEXT": "   "}, {"TOP_P": 2.0}, {"MAX_NEW_TOKENS": 0}, {"SPEAKER": "not a speaker"}, {"TEMPERATURE": -1.0},
       {"TOP_K": -5}, {"PROMPT": "free text"}, {"VOICE": "nobody"}, {"SPEAKER_SAMPLE": "not a sample"},
       {"SAMPLE_TEXT": "a transcript alone"}, {"REFINE_PROMPT": "[oral_2]"}, {"REFINE_TEXT": True, "REFINE_TOP_P": 2.0},
       {"SPEAKER_SAMPLE": b"RIFF\x00\x00not audio"}]


def voice_values(r: random.Random) -> dict:
    """A good request's voice and refine: the default voice, a named one, a seed, a voice sample
    (a sample string of random codes), sometimes with text refine first."""
    from velocity.tts.speaker import encode_sample

    voice = r.choice([{}, {"VOICE": "basil"}, {"SPEAKER_SEED": r.randrange(1 << 20)},
                      {"SPEAKER_SAMPLE": encode_sample(np.array([[r.randrange(625) for _ in range(12)]
                                                                 for _ in range(4)])), "SAMPLE_TEXT": "a sample"}])
    return voice | ({"REFINE_TEXT": True, "REFINE_MAX_NEW_TOKENS": 8} if r.random() < 0.25 else {})
RSS_MARGIN = (1.2, 64 << 20)       # end <= 1.2 x after warm-up + 64 MiB


def llm_request(ids: list[int], lengths: list[int], speaker: list[float] | None = None,
                params_f=(0.3, 0.7, 1.05), params_i=(20, 40, -1)) -> dict:
    """Inputs of a direct call to the `llm` model (what text_frontend would send)."""
    return {"TOKEN_IDS": np.array([ids], np.int32), "SENTENCE_LENGTHS": np.array([lengths], np.int32),
            "SPEAKER_VECTOR": np.array([speaker or []], np.float32),
            "PARAMS_F": np.array([params_f], np.float32), "PARAMS_I": np.array([params_i], np.int64)}


# Malformed direct llm calls: each must be refused with INVALID_ARG and hold no slot afterwards.
BAD_LLM = [llm_request([10 ** 6, 5], [2]),                            # not a text token id
           llm_request([1, 2, 3], [3], speaker=[0.5] * 5),               # a speaker of the wrong size
           llm_request([1, 2, 3], [3], params_i=(20, 10 ** 7, -1)),      # too many new tokens
           llm_request([1] * 100_000, [100_000]),                        # a prompt over max_model_len
           llm_request([1, 2, 3], [5])]                                  # lengths that do not split the ids


def call_llm(url: str, arrays: dict, timeout: float = 120) -> tuple[int, str | None]:
    """One direct request to the decoupled `llm` model -> (chunks received, error message or None)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    chunks, error = 0, None
    try:
        client.async_stream_infer("llm", array_inputs(grpcclient, arrays), enable_empty_final_response=True)
        while True:
            result, err = got.get(timeout=timeout)
            if err is not None:
                error = str(err)
                break
            codes = result.as_numpy("CODES")
            if codes is not None:
                index = int(result.as_numpy("CHUNK_INDEX").reshape(-1)[0])
                if index < 0:                      # an error chunk (velocity.serving.wire.protocol.STREAM_*)
                    error = f"error chunk {index}"
                    break
                chunks += 1
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream(cancel_requests=error is None and chunks > 0)
        client.close()
    return chunks, error


def descendants(pid: int) -> list[int]:
    """All live descendants of pid, read from /proc."""
    children: dict[int, list[int]] = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def rss_bytes(pids: list[int], field: str = "VmRSS") -> int:
    """Summed resident bytes of the processes (field "VmHWM": each one's peak)."""
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def tree_rss(pid: int) -> int:
    """Resident bytes of pid and all its descendants (the server and its python stubs)."""
    return rss_bytes([pid, *descendants(pid)])


def one(url: str, r: random.Random, max_new: int, stats: Counter, problems: list, texts: list[str]) -> None:
    """One random request: good (55%), cancelled after its first chunk (25%), bad (12%) or a
    malformed direct call to the llm model (8%); good and cancelled ones with a random voice
    (default, named, seeded or a sample) and some with text refine."""
    kind = r.choices(["good", "cancel", "bad", "bad llm"], [0.55, 0.25, 0.12, 0.08])[0]
    values = {"TEXT": r.choice(texts), "MAX_NEW_TOKENS": max_new, "SEED": r.randrange(1 << 20)}
    if kind in ("good", "cancel"):
        values |= voice_values(r)
    if kind == "bad llm":
        chunks, error = call_llm(url, r.choice(BAD_LLM))
        if error is None or chunks or error.startswith("error chunk"):   # not an INVALID_ARG response
            problems.append(f"malformed llm call not refused: {chunks} chunks, {error}")
        else:
            stats["bad llm rejected"] += 1
        return
    if kind == "bad":
        try:
            list(stream_grpc(url, {**values, **r.choice(BAD)}, timeout=120, check=False))
            problems.append(f"bad request accepted: {values}")
        except ServerError:
            stats["bad rejected"] += 1
        return
    stream = stream_grpc(url, values, timeout=120, check=False)
    try:
        if kind == "cancel":
            next(stream, None)
            stream.close()                  # stops the stream with cancel_requests=True
            stats["cancelled"] += 1
            return
        chunks = list(stream)
    except ServerError as e:
        problems.append(f"good request failed: {e}")
        return
    idx = sorted(i for i, _ in chunks)
    if not chunks or idx != list(range(len(idx))) or sum(len(a) for _, a in chunks) % 256:   # 512 T - 256 a sentence
        problems.append(f"incomplete audio: chunks {idx}")
    stats["good complete"] += 1
    for name, what in (("SPEAKER_SAMPLE", "with a sample"), ("VOICE", "with a named voice"), ("REFINE_TEXT", "refined")):
        stats[what] += name in values


def soak(url: str, metrics_url: str, seconds: float, pid: int | None = None, concurrency: int = 4,
         max_new: int = 40, seed: int = 0, texts: list[str] | None = None) -> dict:
    """texts: what good requests say (default: benchmarks/texts.txt, English and Chinese)."""
    stats, problems = Counter(), []
    start = time.monotonic()
    warm_at, end_at = start + 0.25 * seconds, start + seconds
    rss: dict = {}

    def worker(k: int) -> None:
        r = random.Random(seed * 1000 + k)
        while time.monotonic() < end_at:
            try:
                one(url, r, max_new, stats, problems, texts or TEXTS)
            except Exception as e:          # report, keep soaking
                problems.append(f"client error: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    if pid:
        time.sleep(max(0.0, warm_at - time.monotonic()))
        rss["after_warm_up"] = tree_rss(pid)
    for t in threads:
        t.join()
    deadline = time.monotonic() + 120       # requests cancelled through the ensemble run to MAX_NEW_TOKENS
    gauges = {"kv_blocks_used": "velocity_kv_blocks_used", "running": "velocity_running_sequences",
              "waiting": "velocity_waiting_sequences", "requests_in_flight": "velocity_active_requests"}
    while time.monotonic() < deadline and any(metric(metrics_url, g) for g in gauges.values()):
        time.sleep(0.5)
    idle = {k: metric(metrics_url, g) for k, g in gauges.items()}
    if any(idle.values()):
        problems.append(f"not idle after the soak: {idle}")
    if pid:
        rss["end"] = tree_rss(pid)
        limit = RSS_MARGIN[0] * rss["after_warm_up"] + RSS_MARGIN[1]
        if rss["end"] > limit:
            problems.append(f"resident memory grew: {rss['after_warm_up'] >> 20} MiB after warm-up, "
                            f"{rss['end'] >> 20} MiB at the end (limit {int(limit) >> 20} MiB)")
    return {"seconds": seconds, "concurrency": concurrency, "requests": dict(stats), "idle": idle,
            "rss_bytes": rss, "problems": problems[:20], "ok": not problems}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="localhost:8001")
    ap.add_argument("--metrics-url", default="http://localhost:8002/metrics")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--pid", type=int, help="the server's (or serve.sh's) pid, for the memory check")
    args = ap.parse_args()
    rep = soak(args.url, args.metrics_url, args.seconds, args.pid, args.concurrency, args.max_new_tokens)
    print(json.dumps(rep, indent=2))
    sys.exit(0 if rep["ok"] else 1)


if __name__ == "__main__":
    main()
