"""Another client's first audio while one client floods the gateway, with the fair-share caps and
without (VELOCITY_GATEWAY_MAX_STREAMS_PER_CLIENT): client B (127.0.0.3) times its first audio
alone, then while client A (127.0.0.2, a process of its own) keeps --flood requests going at
once, each sent again as soon as it ends or is refused. A server of this checkout on the tiny demo checkpoint per arm, in
rounds (with --baseline-rev, each cap on that revision too, and with --baseline-env, on this
checkout with those settings, in ABBA order); the flood's first audio over the idle one, and where
the server's time went. Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_fair.py --arms 16,64 --flood 64 --rounds 1 --baseline-rev REV
    .venv/bin/python benchmarks/bench_fair.py --arms 16 --flood 64 --baseline-env VELOCITY_GATEWAY_HTTP=h11
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import logging
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import (ROOT, alternating, baseline_tree, bench_texts, cpu_model,  # noqa: E402
                                exit_on_sigterm, finish, revision, save, setting_pairs)

log = logging.getLogger("bench_fair")
FIRST_BODY: dict[int, str] = {}        # the first answer of each unexpected status (what a 400 said)


def post(gateway: str, source: str, text: str, hang_up: bool, extra: dict | None = None) -> tuple[int, float]:
    """(status, seconds to the first audio bytes) of one request from address `source`."""
    u = urlparse(gateway)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300, source_address=(source, 0))
    body = {"model": "tts-1", "voice": "amber", "input": text, "response_format": "pcm", "max_new_tokens": 200}
    try:
        conn.request("POST", "/v1/audio/speech", json.dumps(body | (extra or {})), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            body = r.read()
            if r.status not in (200, 503):
                FIRST_BODY.setdefault(r.status, body.decode(errors="replace")[:400])
            return r.status, float("nan")
        r.read1(1)
        took = time.perf_counter() - t0
        if not hang_up:
            r.read()
        return 200, took
    finally:
        conn.close()


def direct(grpc_url: str, text: str) -> float:
    """Seconds to the first audio of the same request straight to Triton's `tts` (no gateway)."""
    from client.triton import stream_grpc
    t0 = time.perf_counter()
    chunks = stream_grpc(grpc_url, {"TEXT": text, "VOICE": "amber", "MAX_NEW_TOKENS": 200}, timeout=300)
    next(chunks)
    took = time.perf_counter() - t0
    chunks.close()
    return took


def where_the_time_goes(m0: str, m1: str) -> dict:
    """The server's side of the flood between two scrapes (every stream's, A's and B's): the
    llm's mean arrival-to-first-chunk, the vocoder's mean queue wait and decode per chunk, and
    the running and paused sequences at the end."""
    from client.triton import parse_metric

    def d(name: str) -> float:
        return parse_metric(m1, name) - parse_metric(m0, name)

    ttfc = "velocity_time_to_first_chunk_seconds"
    chunks = max(1.0, d("velocity_vocoder_chunks_total"))
    return {"llm_first_chunk_s": d(ttfc + "_sum") / max(1.0, d(ttfc + "_count")),
            "vocoder_queue_s": d("velocity_vocoder_queue_seconds_total") / chunks,
            "vocoder_decode_s": d("velocity_vocoder_decode_seconds_total") / chunks,
            "running": parse_metric(m1, "velocity_running_sequences"),
            "paused": parse_metric(m1, "velocity_paused_sequences")}


def lexicon(keys: int, salt: str) -> dict:
    """A request lexicon of `keys` words no other request has (the server caches lexicons by content)."""
    return {f"w{salt}x{k}": f"word {k}" for k in range(keys)}


def flood(gateway: str, n: int, texts: list[str], stop: threading.Event, counts: dict,
          lexicon_keys: int = 0) -> list[threading.Thread]:
    """n threads of client A, each sending its next request as soon as the last ends; with
    lexicon_keys, each a short text with a fresh lexicon of that many keys (the front end's load)."""
    def one(i: int) -> None:
        sent = 0
        while not stop.is_set():
            sent += 1
            if lexicon_keys:
                status, _ = post(gateway, "127.0.0.2", "Hello there.", hang_up=False,
                                 extra={"lexicon": lexicon(lexicon_keys, f"{i}n{sent}"), "max_new_tokens": 8})
            else:
                status, _ = post(gateway, "127.0.0.2", texts[i % len(texts)], hang_up=False)
            counts[status] = counts.get(status, 0) + 1
            if status != 200:
                time.sleep(0.05)
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def flood_process(gateway: str, n: int, texts: list[str], lexicon_keys: int, stop, out) -> None:
    """Client A's flood in a process of its own until `stop` (a multiprocessing Event) is set;
    then (A's statuses, the first body of each unexpected one) on `out`. Its own process: A's
    threads in B's would hold the GIL while B times its first audio."""
    counts, done = {}, threading.Event()
    threads = flood(gateway, n, texts, done, counts, lexicon_keys)
    stop.wait()
    done.set()
    for t in threads:
        t.join(timeout=120)
    out.put((counts, FIRST_BODY))


def arm(cap: int, root: Path, args, texts: list[str], env: dict | None = None) -> list[dict]:
    """args.rounds rounds on one server of the tree at `root` with this cap (and these settings)."""
    from benchmarks.server import TritonServer
    from velocity.demo.checkpoint import write_checkpoint

    d = Path(tempfile.mkdtemp())
    ckpt = write_checkpoint(d / "tiny", "tiny", seed=0)
    for attempt in range(2):                     # a port taken between its choice and the server's bind: again
        server = TritonServer(repo=root / "model_repository", log_path=d / "server.log", root=root,
                              # on 127.0.0.1 only: the flood's thousands of connections from 127.0.0.2 leave
                              # ports in TIME_WAIT that a wildcard bind of the next arm's server could hit
                              env={"VELOCITY_WEIGHTS": str(ckpt), "VELOCITY_GATEWAY_MAX_STREAMS_PER_CLIENT": str(cap),
                                   "BIND": "127.0.0.1", **(env or {})})
        try:
            server.start(timeout=400)
            break
        except RuntimeError:
            if attempt:
                raise
    gw, rounds = server.gateway_url, []
    try:
        from benchmarks.server import wait_for
        wait_for(lambda: post(gw, "127.0.0.3", "Ready?", True)[0] == 200, 60)
        for r in range(args.rounds):
            idle = [post(gw, "127.0.0.3", texts[k], True)[1] for k in range(args.samples)]
            ctx = multiprocessing.get_context("fork")
            stop, out = ctx.Event(), ctx.Queue()
            a = ctx.Process(target=flood_process, args=(gw, args.flood, texts, args.lexicon_keys, stop, out), daemon=True)
            a.start()
            time.sleep(args.settle)
            m0 = server.metrics()
            flooded = [post(gw, "127.0.0.3", texts[k], True) for k in range(args.samples)]
            straight = [direct(server.grpc_url, texts[k]) for k in range(args.samples)]
            m1 = server.metrics()
            stop.set()
            counts, bodies = out.get(timeout=300)
            a.join(timeout=30)
            for status, body in bodies.items():
                FIRST_BODY.setdefault(status, body)
            ok = [s for st, s in flooded if st == 200]
            row = {"cap": cap, "round": r, "idle_s": statistics.median(idle),
                   "flood_s": statistics.median(ok) if ok else None, "b_refused": len(flooded) - len(ok),
                   "flood_direct_s": statistics.median(straight),       # the same beside the flood, straight to Triton
                   "a_statuses": {str(k): v for k, v in counts.items()}}
            row["ratio"] = row["flood_s"] / row["idle_s"] if ok else None
            row["server"] = where_the_time_goes(m0, m1)
            log.info("cap %d round %d: %s", cap, r, json.dumps(row))
            rounds.append(row)
    finally:
        server.stop()
    return rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="0,64", help="VELOCITY_GATEWAY_MAX_STREAMS_PER_CLIENT of each arm (0: no cap)")
    ap.add_argument("--flood", type=int, default=128, help="client A's requests at once")
    ap.add_argument("--samples", type=int, default=6, help="client B's requests per measurement")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds of flood before B measures")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lexicon-keys", type=int, default=0,
                    help="client A sends short texts, each with a fresh lexicon of this many keys")
    base = ap.add_mutually_exclusive_group()
    base.add_argument("--baseline-rev", default="", help="also run each cap on this git revision (a worktree)")
    base.add_argument("--baseline-env", action="append", metavar="NAME=VALUE",
                      help="also run each cap on this checkout with these settings")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "fair" / "tiny"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    exit_on_sigterm()                                     # a SIGTERM still stops the servers started
    texts = [t for t in bench_texts() if t.isascii()]     # the tiny demo's vocabulary lacks most Chinese characters
    res = {"hardware": cpu_model(), "flood": args.flood, "samples": args.samples, "revision": revision(),
           "lexicon_keys": args.lexicon_keys,
           "baseline": args.baseline_rev or None, "baseline_env": args.baseline_env, "arms": {}}
    with contextlib.ExitStack() as stack:
        trees = {"this": ROOT}
        if args.baseline_rev:
            trees["base"] = stack.enter_context(baseline_tree(args.baseline_rev))
        elif args.baseline_env:
            trees["base"] = ROOT
        envs = {"base": setting_pairs(args.baseline_env, "--baseline-env")}
        caps = args.arms.split(",")
        for i, name in alternating(list(trees), len(caps)):        # each cap: both trees, ABBA
            key = caps[i] if len(trees) == 1 else f"{name} cap {caps[i]}"
            key += f" #{i}" if caps.count(caps[i]) > 1 else ""               # --arms 16,16: ABBA over two servers each
            res["arms"][key] = arm(int(caps[i]), trees[name], args, texts, envs.get(name))
    res["median_ratio"] = {c: statistics.median(r["ratio"] for r in rows if r["ratio"] is not None)
                           for c, rows in res["arms"].items() if any(r["ratio"] for r in rows)}
    res["unexpected"] = {str(k): v for k, v in FIRST_BODY.items()}
    save(res, Path(args.out), plot)
    log.info("flood / idle first audio of the other client, by cap: %s", json.dumps(res["median_ratio"]))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    caps = list(res["arms"])
    idle = [statistics.median(r["idle_s"] for r in res["arms"][c]) for c in caps]
    flooded = [statistics.median(r["flood_s"] for r in res["arms"][c] if r["flood_s"]) for c in caps]
    xs = range(len(caps))
    ax.bar([x - 0.2 for x in xs], idle, 0.4, label="alone")
    ax.bar([x + 0.2 for x in xs], flooded, 0.4, label=f"while another client floods ({res['flood']} at once)")
    ax.set_xticks(list(xs), [c.replace("cap 0", "no cap") if " " in c else (f"cap {c}" if c != "0" else "no cap")
                             for c in caps], fontsize=8)
    ax.set_ylabel("first audio (s), median")
    ax.set_yscale("log")
    ax.set_title(f"a client's first audio beside another's flood of {res['flood']} (2 cores, tiny demo)")
    ax.legend(fontsize=8)
    finish(fig, path, res, dpi=110)


if __name__ == "__main__":
    main()
