#!/usr/bin/env python
"""What Triton's `request.is_cancelled()` costs, asked from a thread of a decoupled python model
as the llm asks it (its requests live on after execute returns). Each call is a round trip to the
server process (python_backend's PbCancel waits for the parent's answer), so a check per stream
per frame on the engine thread would cost streams x this a step. A probe model, written for the
run into a temporary repository, times N calls per request and prints the mean to the server log.

    .venv/bin/python benchmarks/bench_cancel_check.py --calls 2000 --rounds 5
"""
from __future__ import annotations

import argparse
import logging
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, finish, hardware, save  # noqa: E402
from benchmarks.server import TritonServer  # noqa: E402

log = logging.getLogger("bench_cancel_check")
CONFIG = """name: "probe"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "US", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
MODEL = '''import sys, threading, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            threading.Thread(target=self.probe, args=(r, r.get_response_sender()), daemon=True).start()

    def probe(self, r, sender):
        n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
        t = time.perf_counter()
        for _ in range(n):
            r.is_cancelled()
        print("IS_CANCELLED_US", n, 1e6 * (time.perf_counter() - t) / n, flush=True, file=sys.stderr)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''
STREAMS = (1, 32, 64, 128, 256)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="is_cancelled() calls per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "cancel_check" / "is_cancelled"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import tritonclient.grpc as grpcclient

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "repo" / "probe" / "1").mkdir(parents=True)
        (Path(tmp) / "repo" / "probe" / "config.pbtxt").write_text(CONFIG)
        (Path(tmp) / "repo" / "probe" / "1" / "model.py").write_text(MODEL)
        logfile = Path(tmp) / "server.log"
        server = TritonServer(repo=Path(tmp) / "repo", log_path=logfile).start(timeout=120)
        try:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            client.start_stream(callback=lambda result, error: None)
            us: list[float] = []
            for i in range(args.rounds):          # one at a time: one thread asks, as the llm's did
                x = grpcclient.InferInput("N", [1], "INT32")
                x.set_data_from_numpy(np.array([args.calls], np.int32))
                client.async_stream_infer("probe", [x])
                deadline = time.monotonic() + 60
                while len(us) <= i and time.monotonic() < deadline:
                    time.sleep(0.1)
                    us = [float(m) for m in re.findall(r"IS_CANCELLED_US \d+ ([\d.]+)", logfile.read_text())]
            client.stop_stream()
        finally:
            server.stop()
    if len(us) < args.rounds:
        raise SystemExit(f"bench_cancel_check: {len(us)} of {args.rounds} rounds reported (see the server log)")
    med = statistics.median(us)
    res = {"hardware": hardware(), "calls_per_round": args.calls, "us_per_call": us, "median_us": med,
           "ms_per_step_if_asked_every_frame": {str(s): s * med / 1e3 for s in STREAMS}}
    log.info("is_cancelled(): %.1f us a call (median of %d rounds of %d); asked per stream per frame: %s",
             med, len(us), args.calls, ", ".join(f"{s} streams {s * med / 1e3:.2f} ms a step" for s in STREAMS))
    log.info("wrote %s", save(res, Path(args.out), plot))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    per = res["ms_per_step_if_asked_every_frame"]
    ax.bar(range(len(per)), list(per.values()), color="tab:red", tick_label=list(per))
    ax.set_xlabel("streams in the decode batch")
    ax.set_ylabel("ms a step on the engine thread")
    ax.set_title(f"is_cancelled() per stream per frame: {res['median_us']:.0f} us each")
    finish(fig, path, res)


if __name__ == "__main__":
    main()
