"""The gateway's cost: time to the first audio byte through `POST /v1/audio/speech` against the
first chunk of a direct gRPC stream, same server, same requests, in alternating rounds (ABBA);
and the encoding cost per second of audio of each response format.

    scripts/serve.sh --weights checkpoints/demo-full &              # a running server
    .venv/bin/python benchmarks/bench_gateway.py --triton localhost:8001 --concurrency 1,16

Starts its own gateway (velocity-tts-gateway) on a free port. Writes JSON and a PNG.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.harness import bench_texts, finish, median_ratio, paired_rounds, save  # noqa: E402
from benchmarks.sweep import run_concurrently  # noqa: E402
from benchmarks.server import free_port  # noqa: E402
from client.triton import stream_grpc  # noqa: E402

log = logging.getLogger("bench_gateway")


def first_grpc(url: str, text: str, seed: int, max_new: int) -> float:
    t = time.perf_counter()
    stream = stream_grpc(url, {"TEXT": text, "SEED": seed, "MAX_NEW_TOKENS": max_new, "VOICE": "amber"}, timeout=600,
                         check=False)
    next(stream)
    first = time.perf_counter() - t
    for _ in stream:
        pass
    return first


def first_gateway(base: str, text: str, seed: int, max_new: int) -> float:
    body = json.dumps({"model": "tts-1", "voice": "amber", "input": text, "response_format": "pcm", "seed": seed,
                       "max_new_tokens": max_new}).encode()
    t = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(base + "/v1/audio/speech", data=body,
                                                       headers={"Content-Type": "application/json"}), timeout=600) as r:
        r.read(1)
        first = time.perf_counter() - t
        r.read()
    return first


def level(fn, target: str, texts: list[str], c: int, n: int, max_new: int) -> list[float]:
    """n requests, c at a time -> their times to first audio."""
    out: list[float] = []
    run_concurrently(n, c, lambda i: out.append(fn(target, texts[i % len(texts)], i, max_new)))   # append is atomic
    return out


def encoding_cost(seconds: float = 10.0, rounds: int = 3) -> dict:
    """Seconds of CPU per second of audio, per format (0.5 s chunks, as streamed)."""
    from velocity.gateway.encode import FORMATS, Encoder
    audio = (0.3 * np.sin(2 * np.pi * 220 * np.arange(int(24000 * seconds)) / 24000)).astype(np.float32)
    out = {}
    for fmt in FORMATS:
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            enc = Encoder(fmt, 24000)
            for i in range(0, len(audio), 12000):
                enc.push(audio[i:i + 12000])
            enc.finish()
            times.append(time.perf_counter() - t)
        out[fmt] = statistics.median(times) / seconds
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--triton", default="localhost:8001")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4, help="per arm and round (at least the concurrency)")
    ap.add_argument("--max-new-tokens", type=int, default=60)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "gateway" / "gateway"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    port = free_port()
    gw = subprocess.Popen([sys.executable, "-m", "velocity.gateway.app", "--triton", args.triton, "--host", "127.0.0.1",
                           "--port", str(port)], start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        texts = [t for t in bench_texts() if t.isascii()]
        res: dict = {"concurrency": {}, "encoding_cpu_s_per_audio_s": encoding_cost()}
        for c in map(int, args.concurrency.split(",")):
            n = max(args.requests, c)
            arms = {"grpc": (first_grpc, args.triton), "gateway": (first_gateway, base)}
            rounds = paired_rounds(list(arms), args.rounds, lambda a: statistics.mean(
                level(*arms[a], texts, c, n, args.max_new_tokens)))
            log.info("c=%d rounds: %s", c, json.dumps(rounds))
            res["concurrency"][c] = {"rounds": rounds, "median_ratio": median_ratio(rounds, "gateway", "grpc", float),
                "grpc_avg_s": statistics.mean(rd["grpc"] for rd in rounds),
                "gateway_avg_s": statistics.mean(rd["gateway"] for rd in rounds)}
    finally:
        os.killpg(gw.pid, signal.SIGTERM)
        gw.wait(timeout=30)
    out = Path(args.out)
    save(res, out, plot)
    log.info("%s", json.dumps({c: {k: v for k, v in r.items() if k != "rounds"} for c, r in res["concurrency"].items()}))
    log.info("encoding: %s", json.dumps(res["encoding_cpu_s_per_audio_s"]))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    cs = list(res["concurrency"])
    x = np.arange(len(cs))
    a.bar(x - 0.2, [res["concurrency"][c]["grpc_avg_s"] for c in cs], 0.4, label="direct gRPC (first chunk)")
    a.bar(x + 0.2, [res["concurrency"][c]["gateway_avg_s"] for c in cs], 0.4, label="gateway (first byte)")
    a.set(xticks=x, xticklabels=[f"{c} streams" for c in cs], ylabel="seconds", title="time to first audio")
    a.legend()
    enc = res["encoding_cpu_s_per_audio_s"]
    b.bar(list(enc), [1e3 * v for v in enc.values()])
    b.set(ylabel="ms of CPU per second of audio", title="encoding cost")
    finish(fig, path, res)


if __name__ == "__main__":
    main()
