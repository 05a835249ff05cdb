"""The gateway's CPU per request, by HTTP parser (VELOCITY_GATEWAY_HTTP: httptools or h11).

A flood of requests that the gateway answers itself costs the cores that also speak
(docs/benchmarks.md, "Fair share"): this measures that cost per request, the gateway process's CPU time (user +
system, /proc) over --requests requests each on a new connection, sent by --threads threads, for
two kinds the gateway answers itself: a POST with the wrong content type (415, its body unread)
and GET /v1/models. One gateway per parser, both running, no Triton behind them (the kinds need
none); the arms alternate in rounds (ABBA). Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_gateway_cpu.py --rounds 4 --out docs/benchmarks/gateway_cpu/parsers
"""
from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, alternating, cpu_model, finish, revision, save  # noqa: E402
from benchmarks.replicas import stop_group  # noqa: E402
from benchmarks.server import free_port, listening, wait_for  # noqa: E402

log = logging.getLogger("bench_gateway_cpu")
PARSERS = ("h11", "httptools")
BODY = json.dumps({"model": "tts-1", "voice": "amber", "input": "Hello there."})
KINDS = {"415": ("POST", "/v1/audio/speech", {"Content-Type": "text/plain"}),
         "models": ("GET", "/v1/models", {})}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(port: int, kind: str) -> int:
    method, path, headers = KINDS[kind]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, BODY if method == "POST" else None, headers)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests of each kind per arm per round")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "gateway_cpu" / "parsers"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    gateways: dict[str, tuple[subprocess.Popen, int]] = {}
    try:
        for parser in PARSERS:
            port = free_port()
            env = {**os.environ, "VELOCITY_GATEWAY_HTTP": parser}
            p = subprocess.Popen([sys.executable, "-m", "velocity.gateway.app", "--triton", "127.0.0.1:1",
                                  "--host", "127.0.0.1", "--port", str(port)], cwd=ROOT, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
            gateways[parser] = (p, port)
            assert wait_for(lambda: listening(port), 60), f"the {parser} gateway did not start"
        rounds: list[dict] = [{} for _ in range(args.rounds)]
        with ThreadPoolExecutor(args.threads) as pool:
            for r, parser in alternating(list(PARSERS), args.rounds):
                p, port = gateways[parser]
                row = {}
                for kind in KINDS:
                    c0, t0 = cpu_seconds(p.pid), time.perf_counter()
                    statuses = list(pool.map(lambda _: one(port, kind), range(args.requests)))
                    row[kind] = {"cpu_ms_per_request": (cpu_seconds(p.pid) - c0) * 1000 / args.requests,
                                 "wall_s": time.perf_counter() - t0,
                                 "statuses": {str(s): statuses.count(s) for s in set(statuses)}}
                rounds[r][parser] = row
                log.info("round %d, %s: %s", r, parser, json.dumps(
                    {k: (round(v["cpu_ms_per_request"], 3), v["statuses"]) for k, v in row.items()}))
    finally:
        for p, _ in gateways.values():
            stop_group(p, 10)
    res = {"hardware": cpu_model(), "revision": revision(), "arms": list(PARSERS), "requests": args.requests,
           "threads": args.threads, "rounds": rounds,
           "median_cpu_ms": {a: {k: statistics.median(rd[a][k]["cpu_ms_per_request"] for rd in rounds)
                                 for k in KINDS} for a in PARSERS}}
    save(res, Path(args.out), plot)
    print(json.dumps(res["median_cpu_ms"]))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    kinds = list(KINDS)
    for k, parser in enumerate(res["arms"]):
        ax.bar([i + 0.4 * k - 0.2 for i in range(len(kinds))], [res["median_cpu_ms"][parser][kd] for kd in kinds],
               0.4, label=parser)
    ax.set_xticks(range(len(kinds)), ["POST, wrong type (415)", "GET /v1/models"])
    ax.set(ylabel="gateway CPU ms per request (median)", title="the gateway's CPU per request, by HTTP parser")
    ax.legend()
    finish(fig, path, res)


if __name__ == "__main__":
    main()
