#!/usr/bin/env python
"""What the key relay (client/key_proxy.py, perf_analyzer's way in to a server with API keys)
costs a stream: `tts` streams over gRPC with the Triton key, straight to Triton and through the
relay, on one server with a key, in paired rounds (ABBA). Per arm and level: each request's
first audio and total time, and the chunks it got; the relay's cost per chunk is the difference
of the totals over the chunks.

    .venv/bin/python benchmarks/bench_key_relay.py --streams 1,8 --requests 16 --rounds 4
"""
from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, bench_texts, exit_on_sigterm, paired_rounds, rounds_panels, save, summary  # noqa: E402
from benchmarks.server import TritonServer  # noqa: E402


def relay(grpc_url: str, key: str) -> tuple[subprocess.Popen, str]:
    """The relay as perf_analyzer.sh starts it, and its address."""
    p = subprocess.Popen([sys.executable, "-m", "client.key_proxy", "--to", grpc_url], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                         env={**os.environ, "VELOCITY_TRITON_KEY": key})
    line = p.stdout.readline()
    if not line.startswith("port "):
        p.kill()
        raise SystemExit(f"the relay did not start: {line!r}")
    return p, f"127.0.0.1:{line.split()[1]}"


def one(url: str, key: str, text: str, seed: int) -> dict:
    from client.triton import stream_grpc

    t0, first, chunks = time.perf_counter(), None, 0
    for _ in stream_grpc(url, {"TEXT": text, "SEED": seed, "MAX_NEW_TOKENS": 60}, timeout=300, check=False, key=key):
        first = first or time.perf_counter() - t0
        chunks += 1
    return {"first": first, "total": time.perf_counter() - t0, "chunks": chunks}


def level(url: str, key: str, streams: int, requests: int, texts: list[str]) -> dict:
    """`requests` requests, `streams` at a time: their medians and the chunks in all."""
    with ThreadPoolExecutor(streams) as pool:
        got = list(pool.map(lambda i: one(url, key, texts[i % len(texts)], i), range(requests)))
    return {"first_p50_ms": 1e3 * statistics.median(g["first"] for g in got),
            "total_p50_ms": 1e3 * statistics.median(g["total"] for g in got),
            "total_s": sum(g["total"] for g in got), "chunks": sum(g["chunks"] for g in got)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,8", help="streams at a time, comma-separated levels")
    ap.add_argument("--requests", type=int, default=16, help="requests per arm and level in a round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "key_relay" / "key_relay"))
    args = ap.parse_args()
    exit_on_sigterm()
    levels = [int(x) for x in args.streams.split(",")]
    key = secrets.token_hex(16)
    texts = bench_texts()
    with tempfile.TemporaryDirectory() as tmp:
        server = TritonServer(repo=ROOT / "model_repository", log_path=Path(tmp) / "server.log",
                              env={"VELOCITY_TRITON_KEY": key}, gateway_port=0)    # no gateway
        server.start(timeout=400)
        proc = None
        try:
            proc, relay_url = relay(server.grpc_url, key)
            urls = {"direct": (server.grpc_url, key), "relay": (relay_url, "")}
            level(server.grpc_url, key, 2, 4, texts)                    # warm up
            arms = [(name, n) for n in levels for name in urls]
            rounds = paired_rounds(arms, args.rounds, lambda a: level(*urls[a[0]], a[1], args.requests, texts))
        finally:
            if proc is not None:
                proc.kill()
            server.stop()
    names = [f"{a}@{n}" for a, n in arms]
    res = {"label": f"tts over gRPC with the Triton key, tiny demo checkpoint, {args.requests} requests per level",
           "levels": levels, "rounds": [{f"{a}@{n}": r for (a, n), r in rd.items()} for rd in rounds],
           "labels": {f"{a}@{n}": f"{a}, {n} at a time" for a, n in arms}}
    res["summary"] = {name: {k: statistics.median(rd[name][k] for rd in res["rounds"])
                             for k in ("first_p50_ms", "total_p50_ms")} for name in names}
    for n in levels:      # per round: (relay's total time - direct's) / chunks, in ms
        per = [(rd[f"relay@{n}"]["total_s"] - rd[f"direct@{n}"]["total_s"]) / rd[f"direct@{n}"]["chunks"] * 1e3
               for rd in res["rounds"]]
        res["summary"][f"relay@{n}"]["ms_per_chunk"] = summary(per)
    path = save(res, Path(args.out), lambda r, p: rounds_panels(
        r, p, [("first_p50_ms", "first audio p50 (ms)", None), ("total_p50_ms", "request p50 (ms)", None)],
        "Through the key relay and straight to Triton"))
    for name in names:
        print(name, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in res["summary"][name].items()})
    print("wrote", path)


if __name__ == "__main__":
    main()
