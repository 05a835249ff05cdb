"""What hang-ups cost a running server: N clients of the OpenAI API start streaming, each reads its
first audio and hangs up; then the seconds until the server is idle (no request active, no KV
block used: the llm's gauges, published four times a second, so 0.3 s is the least this can
show) and the first audio of a new request sent right after the hang-ups, against one sent to the
idle server before them. In rounds; writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_hangup.py --gateway http://localhost:8080 \\
        --metrics http://localhost:8002/metrics --clients 12 --rounds 4 --out docs/benchmarks/hangup/tiny
"""
from __future__ import annotations

import argparse
import http.client
import json
import logging
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import bench_texts, cpu_model, finish, ROOT, save  # noqa: E402
from client.triton import fetch_metrics, parse_metric  # noqa: E402

log = logging.getLogger("bench_hangup")


def speech(gateway: str, text: str, seed: int) -> http.client.HTTPConnection:
    """A streaming /v1/audio/speech request, sent (the response not read yet)."""
    u = urlparse(gateway)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    conn.request("POST", "/v1/audio/speech", json.dumps({"model": "tts-1", "voice": "amber", "input": text,
                                                         "response_format": "pcm", "seed": seed}),
                 {"Content-Type": "application/json"})
    return conn


def first_audio(gateway: str, text: str, seed: int, hang_up: bool = True) -> float:
    """Seconds from sending to the first audio bytes; then hang up (or read it all)."""
    t0 = time.perf_counter()
    conn = speech(gateway, text, seed)
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    r.read1(1)
    took = time.perf_counter() - t0
    if hang_up:
        conn.sock.shutdown(socket.SHUT_RDWR)
    else:
        r.read()
    conn.close()
    return took


def idle(metrics: str) -> bool:
    m = fetch_metrics(metrics)
    return parse_metric(m, "velocity_active_requests") == 0 and parse_metric(m, "velocity_kv_blocks_used") == 0


def wait_idle(metrics: str, limit: float) -> float:
    t0 = time.perf_counter()
    time.sleep(0.3)                    # the gauges are published four times a second
    while not idle(metrics):
        if time.perf_counter() - t0 > limit:
            return float("inf")
        time.sleep(0.05)
    return time.perf_counter() - t0


def hang_ups(args, texts: list[str]) -> None:
    """args.clients requests at once, each hanging up after its first audio."""
    threads = [threading.Thread(target=first_audio, args=(args.gateway, texts[i % len(texts)], i))
               for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def one_round(args, texts: list[str], r: int) -> dict:
    """Before: a request's first audio on the idle server. Then the clients hang up: seconds until
    the server is idle. Then they hang up again, and a new request is sent at once: its first
    audio (every measured request hangs up too, after its first audio)."""
    wait_idle(args.metrics, 300)
    before = first_audio(args.gateway, texts[0], 1000 + r)
    wait_idle(args.metrics, 300)
    frames0 = parse_metric(fetch_metrics(args.metrics), "velocity_frames_generated_total")
    hang_ups(args, texts)
    idle_s = wait_idle(args.metrics, 300)          # its clock starts as the last client leaves
    frames = parse_metric(fetch_metrics(args.metrics), "velocity_frames_generated_total") - frames0
    hang_ups(args, texts)
    after = first_audio(args.gateway, texts[0], 2000 + r)
    wait_idle(args.metrics, 300)
    return {"first_audio_before_s": before, "first_audio_right_after_s": after, "idle_after_s": idle_s,
            "frames_generated_by_the_clients": frames}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gateway", default="http://localhost:8080")
    ap.add_argument("--metrics", default="http://localhost:8002/metrics")
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--sentences", type=int, default=4, help="sentences per request (long requests: work to stop)")
    ap.add_argument("--label", default="", help="what the server is (in the plot and JSON)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "hangup" / "hangup"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    base = bench_texts()
    texts = [" ".join(base[(i + k) % len(base)] for k in range(args.sentences)) for i in range(len(base))]
    rounds = []
    for r in range(args.rounds):
        rounds.append(one_round(args, texts, r))
        log.info("round %d: %s", r + 1, json.dumps({k: round(v, 3) for k, v in rounds[-1].items()}))
    med = {k: statistics.median(rd[k] for rd in rounds) for k in rounds[0]}
    res = {"clients": args.clients, "sentences": args.sentences, "label": args.label, "cpu": cpu_model(),
           "median": med, "rounds": rounds}
    out = Path(args.out)
    save(res, out, plot)
    log.info("median %s; wrote %s and .png", json.dumps(med), out.with_suffix(".json"))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    n = range(1, len(res["rounds"]) + 1)
    a.plot(n, [rd["idle_after_s"] for rd in res["rounds"]], "o-")
    a.set(xlabel="round", ylabel="seconds", ylim=(0, None),
          title=f"{res['clients']} clients hang up: until the server is idle")
    for key, label in (("first_audio_before_s", "before the hang-ups"), ("first_audio_right_after_s", "right after")):
        b.plot(n, [rd[key] for rd in res["rounds"]], "o-", label=label)
    b.set(xlabel="round", ylabel="seconds", ylim=(0, None), title="a new request's first audio")
    b.legend()
    for ax in (a, b):
        ax.set_xticks(list(n))
        ax.grid(alpha=0.3)
    finish(fig, path, res)


if __name__ == "__main__":
    main()
