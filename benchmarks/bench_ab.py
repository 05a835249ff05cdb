"""Paired A/B rounds against one running server, for a machine whose speed drifts.

    .venv/bin/python benchmarks/bench_ab.py --arms triton,in-process --concurrency 1 --rounds 4 \\
        --requests 2 --weights checkpoints/demo-full --out docs/benchmarks/ab/overhead
    .venv/bin/python benchmarks/bench_ab.py --arms triton,triton-nolend --concurrency 16 --rounds 2
    .venv/bin/python benchmarks/bench_ab.py --arms triton@1,triton@32 --requests 4 --rounds 4

Separate sweeps minutes apart compare the machine's moods as much as the settings (CPU steal
here moves speeds by a factor within minutes). This runs the arms in short rounds, alternating their order
(ABBA), and reports each arm's pooled figures and the median of the per-round ratios to the first
arm. Arms: `triton` (the server as it runs), `triton-nolend` (the server with the llm kept on its
own threads: this script holds a vocoder busy mark on the server's core board,
velocity.serving.boards.core_board), `other` (a second server, --other-url: another build or other
settings, e.g. VELOCITY_LEND_VOCODER_CORES=0), `baseline` (a server this script starts from git
revision --baseline-rev, with this machine's VELOCITY_* settings and --weights), `triton-refine` (the same server, the requests with
REFINE_TEXT: the text head refines each sentence first) and `in-process` (the same requests through velocity
and the decoder in this process, no Triton; needs --weights). Server arms also report the
engine's mean step time (velocity_engine_step_seconds_total / _steps_total), the vocoder's decode
seconds over the wall time (its share of a core: `vocoder_decode_share`) and its chunks a call, the
llm->vocoder backlog (velocity_vocoder_backlog_chunks) and, for a server on this machine, its vocoder's
resident memory, both sampled every 0.1 s (max and mean). First audio is also pooled over all rounds
(p50/p99), and separately over the requests that arrived while others were mid-stream (each
round's requests after the first --concurrency). `arm@c` runs that arm at concurrency c instead of
--concurrency, so `triton@1,triton@32` is the throughput ratio of 32 streams to one. Writes JSON
and a PNG. A backpressure A/B: a second server with VELOCITY_BACKLOG_SECONDS=0 as `other`:

    .venv/bin/python benchmarks/bench_ab.py --arms other,triton --other-url localhost:9001 --concurrency 8 \
        --requests 24 --sentences 3 --out docs/benchmarks/backpressure/tiny_c8

A change against the revision before it (the running server is this checkout's; without git,
--baseline-dir names a folder holding that revision's tree):

    .venv/bin/python benchmarks/bench_ab.py --arms baseline,triton --baseline-rev HEAD~1 --concurrency 8
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import (ROOT, baseline_tree, bench_texts, exit_on_sigterm, finish, median_ratio,  # noqa: E402
                                paired_rounds, pct, save)
from benchmarks.server import TritonServer  # noqa: E402
from benchmarks.sweep import InProcess, metrics_url_of, run_level  # noqa: E402
from benchmarks.soak import descendants, rss_bytes  # noqa: E402
from client.triton import fetch_metrics, parse_metric  # noqa: E402
from velocity.serving.boards.core_board import CoreBoard, find_boards  # noqa: E402

log = logging.getLogger("bench_ab")
ARMS = ("triton", "triton-nolend", "triton-refine", "other", "baseline", "in-process")


def engine_counters(metrics_url: str) -> tuple[float, float] | None:
    """(engine steps, seconds in them) from a server's metrics, or None if it has none."""
    try:
        text = fetch_metrics(metrics_url)
        return parse_metric(text, "velocity_engine_steps_total"), parse_metric(text, "velocity_engine_step_seconds_total")
    except (OSError, KeyError):
        return None


class Sampler:
    """fn() sampled every 0.1 s while the block runs: .result() gives the max and mean."""

    def __init__(self, fn) -> None:
        self.fn, self.samples = fn, []
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with contextlib.suppress(OSError, KeyError, TypeError):
                self.samples.append(float(self.fn()))

    def __enter__(self) -> "Sampler":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> dict:
        return {"max": max(self.samples), "mean": statistics.fmean(self.samples)} if self.samples else {}


def vocoder_pid(grpc_url: str) -> int | None:
    """The vocoder process of the tritonserver on this machine that serves grpc_url's port."""
    port = grpc_url.rsplit(":", 1)[1]
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"tritonserver") and f"--grpc-port={port}".encode() in args:
            for child in descendants(int(d)):
                with contextlib.suppress(OSError):
                    if b"vocoder/1/model.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                        return child
    return None


def server_board(path: str | None) -> CoreBoard:
    """The running server's core board: --board, or the only one on this machine."""
    if path:
        return CoreBoard(path)
    found = find_boards()
    if len(found) != 1:
        raise SystemExit(f"triton-nolend needs the server's core board: found {[str(p) for p in found] or 'none'}; "
                         "pass --board (a server on this machine, VELOCITY_LEND_VOCODER_CORES=1)")
    return CoreBoard(found[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="triton,in-process", help=f"comma-separated, first is the baseline: {ARMS}")
    ap.add_argument("--url", default="localhost:8001")
    ap.add_argument("--metrics-url", default=None, help="default: the --url host, the port after its gRPC port (8002 for 8001)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2, help="requests per arm per round (at least --concurrency)")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--sentences", type=int, default=1,
                    help="sentences per request: each text joins this many shipped sentences in turn")
    ap.add_argument("--weights", help="checkpoint for the in-process arm")
    ap.add_argument("--device", default="cpu", help="the in-process arm's device (cuda beside a GPU server)")
    ap.add_argument("--refine-max-new-tokens", type=int, default=384,
                    help="the triton-refine arm's REFINE_MAX_NEW_TOKENS (384: the reference's default)")
    ap.add_argument("--other-url", help="the `other` arm's server (gRPC address)")
    ap.add_argument("--other-metrics-url", help="its metrics (default: its host, the port after its gRPC port)")
    base = ap.add_mutually_exclusive_group()
    base.add_argument("--baseline-rev", help="the `baseline` arm's git revision (a server started from it)")
    base.add_argument("--baseline-dir", help="or a folder holding its tree (model_repository, scripts, velocity: "
                                            "a copy without git, e.g. scripts/device_bundle.sh's on a device)")
    ap.add_argument("--board", help="the server's core board file (default: the only one found)")
    ap.add_argument("--note", help="what the servers are, for the record (e.g. 'other: --cpu-isa avx2')")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "ab" / "ab"))
    args = ap.parse_args()
    exit_on_sigterm()                                    # its servers are stopped on SIGTERM too
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    arms = args.arms.split(",")
    split = {a: a.partition("@") for a in arms}                         # "triton@32" -> ("triton", "@", "32")
    kind = {a: k for a, (k, _, _) in split.items()}
    conc = {a: int(c) if c.isdigit() else args.concurrency for a, (_, _, c) in split.items()}
    bad_at = any(at and not c.isdigit() for _, at, c in split.values())
    if bad_at or any(k not in ARMS for k in kind.values()) or len(set(arms)) != len(arms) or len(arms) < 2:
        raise SystemExit(f"--arms: two or more different ones of {', '.join(ARMS)}, each optionally @concurrency; "
                         f"got {args.arms!r}")
    if "in-process" in kind.values() and not args.weights:
        raise SystemExit("--arms in-process needs --weights (the server's checkpoint)")
    texts = bench_texts()
    if args.sentences > 1:
        texts = [" ".join(texts[(i + k) % len(texts)] for k in range(args.sentences)) for i in range(len(texts))]
    values = {"MAX_NEW_TOKENS": args.max_new_tokens}
    metrics_url = args.metrics_url or metrics_url_of(args.url)
    n = {a: max(args.requests, conc[a]) for a in arms}
    local = InProcess(args.weights, args.device) if "in-process" in kind.values() else None
    board = None
    if "triton-nolend" in kind.values():
        board = server_board(args.board)
        if board.claim() is None:
            raise SystemExit(f"the core board {board.path} is full")

    if "other" in kind.values() and not args.other_url:
        raise SystemExit("--arms other needs --other-url (a second server)")
    if ("baseline" in kind.values()) != bool(args.baseline_rev or args.baseline_dir):
        raise SystemExit("--arms baseline and --baseline-rev (or --baseline-dir) go together (a server from that tree)")
    urls = {"other": (args.other_url, args.other_metrics_url or (args.other_url and metrics_url_of(args.other_url)))}
    stack = contextlib.ExitStack()
    if args.baseline_rev or args.baseline_dir:
        if args.baseline_dir:
            tree = Path(args.baseline_dir).resolve()
            if not (tree / "model_repository").is_dir() or not (tree / "scripts" / "serve.sh").is_file():
                raise SystemExit(f"--baseline-dir {tree}: no model_repository and scripts/serve.sh in it")
            logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baseline-log-")))
        else:
            tree = stack.enter_context(baseline_tree(args.baseline_rev))
            logs = Path(tree).parent
        env = {"BIND": "127.0.0.1", **({"VELOCITY_WEIGHTS": args.weights} if args.weights else {})}
        baseline = TritonServer(tree / "model_repository", logs / "server.log", env, gateway_port=0, root=tree)
        stack.callback(baseline.stop)
        log.info("starting the baseline server (%s) from %s", args.baseline_rev or "--baseline-dir", tree)
        baseline.start(timeout=400)
        urls["baseline"] = (baseline.grpc_url, f"http://localhost:{baseline.metrics_port}/metrics")

    def run(arm: str, bar) -> dict:
        if kind[arm] == "in-process":
            return local.level(texts, conc[arm], n[arm], values, bar)
        url, murl = urls.get(kind[arm], (args.url, metrics_url))
        hold = board.busy() if kind[arm] == "triton-nolend" else contextlib.nullcontext()
        before = engine_counters(murl)
        refine = {"REFINE_TEXT": True, "REFINE_MAX_NEW_TOKENS": args.refine_max_new_tokens} \
            if kind[arm] == "triton-refine" else {}
        pid = vocoder_pid(url)
        with hold, Sampler(lambda: parse_metric(fetch_metrics(murl), "velocity_vocoder_backlog_chunks")) as backlog, \
                Sampler(lambda: rss_bytes([pid]) / 2**20 if pid else None) as rss:
            out = run_level(url, texts, conc[arm], n[arm], values | refine, bar, murl)
        out["vocoder_backlog_chunks"], out["vocoder_rss_mib"] = backlog.result(), rss.result()
        time.sleep(0.6)                                                 # the llm exports its counters four times a second
        after = engine_counters(murl)
        if before and after and after[0] > before[0]:
            out["engine_step_ms"] = 1e3 * (after[1] - before[1]) / (after[0] - before[0])
        return out

    if board is not None:                                               # give the slot back, even on error
        stack.callback(board.close)
    with stack, tqdm(total=args.rounds * sum(n.values()), desc="A/B rounds") as bar:
        rounds = paired_rounds(arms, args.rounds, lambda arm: run(arm, bar))

    def pooled(arm: str) -> dict:
        lv = [rd[arm] for rd in rounds]
        out = {"first_audio_avg_s": statistics.mean(x["first_audio_s"]["avg"] for x in lv),
               "audio_s_per_s": sum(x["audio_s"] for x in lv) / sum(x["wall_s"] for x in lv),
               "total_avg_s": statistics.mean(x["total_s"]["avg"] for x in lv),
               "stall_avg_s": statistics.mean(x["stall_s"]["avg"] for x in lv),
               "errors": sum(x.get("errors", 0) for x in lv)}
        if all("engine_step_ms" in x for x in lv):
            out["engine_step_ms"] = statistics.mean(x["engine_step_ms"] for x in lv)
        for key in ("decode_share", "chunks_per_call"):                # the vocoder's, where counted
            if all(key in (x.get("vocoder_queue") or {}) for x in lv):
                out["vocoder_" + key] = statistics.mean(x["vocoder_queue"][key] for x in lv)
        out["rtf_p99_worst_round"] = max((x["rtf"]["p99"] for x in lv if x["rtf"]["p99"] is not None), default=None)
        for key in ("first_audio_samples", "first_audio_later_samples"):
            xs = [v for x in lv for v in x.get(key, [])]
            out[key.replace("_samples", "")] = {"p50": pct(xs, 50), "p99": pct(xs, 99), "n": len(xs)}
        for key in ("vocoder_backlog_chunks", "vocoder_rss_mib"):     # max and mean of the samples
            got = [x[key] for x in lv if x.get(key)]
            if got:
                out[key] = {"max": max(b["max"] for b in got), "mean": statistics.fmean(b["mean"] for b in got)}
        return out

    base = arms[0]
    res = {"concurrency": conc, "requests_per_round": n, "arms": arms, "max_new_tokens": args.max_new_tokens,
           "sentences": args.sentences, "note": args.note,
           "baseline_rev": args.baseline_rev or (args.baseline_dir and Path(args.baseline_dir).name),
           "pooled": {a: pooled(a) for a in arms}, "rounds": rounds, "median_ratio_to_" + base: {
               a: {"first_audio": median_ratio(rounds, a, base, lambda x: x["first_audio_s"]["avg"]),
                   "audio_s_per_s": median_ratio(rounds, a, base, lambda x: x["audio_s_per_s"]),
                   "total": median_ratio(rounds, a, base, lambda x: x["total_s"]["avg"])}
               for a in arms[1:]}}
    out = Path(args.out)
    save(res, out, plot)
    log.info("pooled %s; median ratios %s; wrote %s and .png", json.dumps(res["pooled"]),
             json.dumps(res["median_ratio_to_" + base]), out.with_suffix(".json"))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    rounds = range(1, len(res["rounds"]) + 1)
    for arm in res["arms"]:
        a.plot(rounds, [rd[arm]["first_audio_s"]["avg"] for rd in res["rounds"]], "o-", label=arm)
        b.plot(rounds, [rd[arm]["audio_s_per_s"] for rd in res["rounds"]], "o-", label=arm)
    a.set(xlabel="round", ylabel="first audio, avg (s)", title="concurrency " + ", ".join(sorted({str(v) for v in res["concurrency"].values()}, key=int)), ylim=(0, None))
    b.set(xlabel="round", ylabel="audio seconds per second", title="throughput", ylim=(0, None))
    for ax in (a, b):
        ax.set_xticks(list(rounds))
        ax.grid(alpha=0.3)
        ax.legend()
    finish(fig, path, res)


if __name__ == "__main__":
    main()
