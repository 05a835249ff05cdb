#!/usr/bin/env python
"""Scale test: N streams through the HAProxy balancer (benchmarks/replicas.py) in front of one
replica, then of two, in alternating rounds in the same run; reports per-replica load (each
replica's `tts` successes) and total throughput. Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_replicas.py                      # tiny demo, 16 streams at 4
    .venv/bin/python benchmarks/bench_replicas.py --weights DIR --requests 32 --concurrency 8

Both replicas run on this machine: on two cores they share the same two cores, so two replicas
show that the load splits and nothing fails, not a speed-up (run them on two machines for that).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import alternating, bench_texts, exit_on_sigterm, finish, save  # noqa: E402
from benchmarks.sweep import run_level  # noqa: E402
from benchmarks.replicas import Balancer, Replica, tts_requests, tts_served  # noqa: E402
from benchmarks.server import TritonServer, free_port  # noqa: E402


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    arms = list(res["arms"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(arms, [res["arms"][k]["audio_s_per_s"] for k in arms], color=["#888", "#3a7"])
    a.set_ylabel("audio seconds per second (median of rounds)")
    a.set_title("throughput through the balancer")
    bottom = [0.0] * len(arms)
    for i in range(2):
        share = [res["arms"][k]["per_replica"][i] if i < len(res["arms"][k]["per_replica"]) else 0 for k in arms]
        b.bar(arms, share, bottom=bottom, label=f"replica {i + 1}")
        bottom = [x + y for x, y in zip(bottom, share)]
    b.set_ylabel("streams served (all rounds)")
    b.set_title("load per replica")
    b.legend()
    fig.suptitle(f"{res['requests']} streams at concurrency {res['concurrency']}, {res['hardware']}")
    finish(fig, path, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", help="a ChatTTS release folder (default: the tiny demo checkpoint)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each arm, alternating (1, 2, 2, 1, ...)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "replicas" / "replicas"))
    args = ap.parse_args()
    exit_on_sigterm()                                    # its servers are stopped on SIGTERM too
    from tqdm import tqdm

    logs = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    env = {"BIND": "127.0.0.1", **({"VELOCITY_WEIGHTS": args.weights} if args.weights else {})}
    servers = [TritonServer(ROOT / "model_repository", logs / f"replica{i + 1}.log", env, gateway_port=0)
               for i in range(2)]
    texts, values = bench_texts(), {"MAX_NEW_TOKENS": args.max_new_tokens}
    rounds: dict[str, list[dict]] = {"1 replica": [], "2 replicas": []}

    def metrics(s: TritonServer) -> str:
        return f"http://127.0.0.1:{s.metrics_port}/metrics"

    try:
        for s in servers:
            s.start(timeout=400)
        order = [n for _, n in alternating((1, 2), args.rounds)]
        with tqdm(total=len(order) * args.requests, desc="streams") as bar:
            for n in order:
                with Balancer(free_port(), [Replica("127.0.0.1", s.grpc_port, s.health_port)
                                            for s in servers[:n]]) as lb:
                    time.sleep(1.0)                            # first health checks
                    before = [tts_requests(metrics(s)) for s in servers]
                    got = run_level(lb.url, texts, args.concurrency, args.requests, values, bar)
                    got["per_replica"] = tts_served([metrics(s) for s in servers], before,
                                                    args.requests - got["errors"])
                rounds["1 replica" if n == 1 else "2 replicas"].append(got)
    finally:
        for s in servers:
            s.stop()
    import statistics
    arms = {k: {"audio_s_per_s": statistics.median(r["audio_s_per_s"] for r in v),
                "first_audio_p50_s": statistics.median(r["first_audio_s"]["p50"] for r in v),
                "errors": sum(r["errors"] for r in v),
                "per_replica": [sum(r["per_replica"][i] for r in v) for i in range(2)]} for k, v in rounds.items()}
    res = {"hardware": f"CPU, {os.cpu_count()} cores, both replicas on it", "weights": args.weights or "tiny demo",
           "requests": args.requests, "concurrency": args.concurrency, "max_new_tokens": args.max_new_tokens,
           "rounds": rounds, "arms": arms,
           "two_over_one": arms["2 replicas"]["audio_s_per_s"] / arms["1 replica"]["audio_s_per_s"]}
    out = Path(args.out)
    save(res, out, plot)
    for k, a in arms.items():
        print(f"{k}: {a['audio_s_per_s']:.2f} audio s/s, first audio p50 {a['first_audio_p50_s']:.2f} s, "
              f"streams per replica {a['per_replica']}, errors {a['errors']}")
    print(f"two replicas / one: {res['two_over_one']:.2f}x; wrote {out.with_suffix('.json')} and .png")


if __name__ == "__main__":
    main()
