"""When a part dies: how soon its clients hear it, readiness says 503, and a new request speaks.

One server as serve.sh starts it (tiny demo checkpoint, the gateway on); for each part, in
rounds, a gRPC `tts` stream and a /v1/audio/speech stream are live, the part is killed
(SIGKILL), and the seconds from the kill to: the later of the two clients' errors, the health
port's 503, and the first request that speaks again. Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_recovery.py --rounds 2 --out docs/benchmarks/recovery/tiny
"""
from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, cpu_model, finish, save  # noqa: E402
from benchmarks.server import http_status  # noqa: E402

log = logging.getLogger("bench_recovery")
PARTS = ["llm", "vocoder", "text_frontend", "tts_offline", "tritonserver"]
LONG = "This sentence goes on for a while. " * 24


def live_streams(server) -> tuple[list[threading.Thread], list[float], threading.Event]:
    """A gRPC stream and a gateway stream on threads; each appends the time it ended to `ended`;
    `started` is set once both have audio."""
    from client.triton import stream_grpc

    ended: list[float] = []
    firsts = [threading.Event(), threading.Event()]

    def grpc() -> None:
        try:
            for _ in stream_grpc(server.grpc_url, {"TEXT": LONG, "MAX_NEW_TOKENS": 2000}, timeout=120):
                firsts[0].set()
        except Exception:
            pass
        ended.append(time.monotonic())

    def post() -> None:
        u = urlparse(server.gateway_url)
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
            conn.request("POST", "/v1/audio/speech", json.dumps({"model": "tts-1", "voice": "amber", "input": LONG,
                                                                 "response_format": "pcm", "max_new_tokens": 2000}),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            while r.read1(65536):
                firsts[1].set()
        except Exception:
            pass
        ended.append(time.monotonic())

    threads = [threading.Thread(target=f, daemon=True) for f in (grpc, post)]
    for t in threads:
        t.start()
    both = threading.Event()
    threading.Thread(target=lambda: (firsts[0].wait(120), firsts[1].wait(120), both.set()), daemon=True).start()
    return threads, ended, both


def speaks(server) -> bool:
    from client.triton import stream_grpc
    try:
        return any(len(a) for _, a in stream_grpc(server.grpc_url, {"TEXT": "Back.", "MAX_NEW_TOKENS": 20}, timeout=30))
    except Exception:
        return False


def one(server, part: str) -> dict:
    threads, ended, both = live_streams(server)
    if not both.wait(120):
        raise RuntimeError("the streams did not start")
    t0 = time.monotonic()
    os.kill(server.part_pid(part), signal.SIGKILL)
    ready_url = f"http://127.0.0.1:{server.health_port}/v2/health/ready"
    not_ready = None
    while time.monotonic() - t0 < 30:
        if not_ready is None and http_status(ready_url) == 503:
            not_ready = time.monotonic() - t0
        if not_ready is not None and len(ended) == 2:
            break
        time.sleep(0.02)
    for t in threads:
        t.join(5)
    while not (http_status(ready_url) == 200 and speaks(server)):
        if time.monotonic() - t0 > 120:
            raise RuntimeError(f"{part}: not back in 120 s")
        time.sleep(0.2)
    row = {"part": part, "told_s": max(ended) - t0 if len(ended) == 2 else None, "not_ready_s": not_ready,
           "speaks_s": time.monotonic() - t0}
    log.info("%s", json.dumps(row))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "recovery" / "tiny"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from benchmarks.server import TritonServer
    from velocity.demo.checkpoint import write_checkpoint

    d = Path(tempfile.mkdtemp())
    server = TritonServer(repo=ROOT / "model_repository", log_path=d / "server.log",
                          env={"VELOCITY_WEIGHTS": str(write_checkpoint(d / "tiny", "tiny", seed=0))}).start(timeout=400)
    rows = []
    try:
        for r in range(args.rounds):
            for part in args.parts.split(","):
                rows.append(one(server, part) | {"round": r})
    finally:
        server.stop()
    res = {"hardware": cpu_model(), "rounds": args.rounds, "rows": rows,
           "median": {p: {k: statistics.median(x[k] for x in rows if x["part"] == p and x[k] is not None)
                          for k in ("told_s", "not_ready_s", "speaks_s")} for p in args.parts.split(",")}}
    save(res, Path(args.out), plot)
    log.info("medians: %s", json.dumps(res["median"], indent=1))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = list(res["median"])
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for i, (key, label) in enumerate((("told_s", "every client told"), ("not_ready_s", "readiness 503"),
                                      ("speaks_s", "a new request speaks"))):
        ax.bar([x + (i - 1) * 0.27 for x in range(len(parts))], [res["median"][p][key] for p in parts], 0.27, label=label)
    ax.axhline(2, color="gray", ls="--", lw=0.8)
    ax.set_xticks(range(len(parts)), parts)
    ax.set_ylabel("seconds after the kill (median)")
    ax.set_yscale("log")
    ax.set_title("a part killed (SIGKILL) under live streams: 2 cores, tiny demo")
    ax.legend(fontsize=8)
    finish(fig, path, res, dpi=110)


if __name__ == "__main__":
    main()
