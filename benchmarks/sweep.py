"""Serving benchmark: a concurrency sweep of gRPC streams against a running server.

    make serve WEIGHTS=checkpoints/demo-full &         # or scripts/serve.sh --weights ...
    .venv/bin/python -m benchmarks.sweep --weights checkpoints/demo-full

Each level keeps `concurrency` streams in flight (each its own gRPC stream) over the shipped
English and Chinese sentences (benchmarks/texts.txt) and reports time to first audio
(avg/p50/p90/p99), second-chunk latency, total latency, RTF, audio seconds generated per
second and errors, with the server's own statistics diffed before and after. With
--weights it also runs the same texts in this process (front end + velocity + decoder, no
Triton) at concurrency 1: the serving overhead is the ratio. Writes JSON and a PNG.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from benchmarks.harness import bench_texts, cpu_model, finish, ROOT, save, summary
from client.triton import ServerError, fetch_metrics, parse_metric, stream_grpc
from client.tts_client import SAMPLE_RATE, stall, synthesize


log = logging.getLogger("bench")



def server_stats(url: str) -> dict:
    """Per model: successes, and summed queue / compute times (ns), from Triton's statistics API."""
    import tritonclient.grpc as grpcclient
    st = grpcclient.InferenceServerClient(url).get_inference_statistics(as_json=True)
    out = {}
    for m in st.get("model_stats", []):
        s = m.get("inference_stats", {})
        out[m["name"]] = {k: int(s.get(k, {}).get(f, 0)) for k, f in
                          [("success", "count"), ("fail", "count"), ("queue", "ns"), ("compute_infer", "ns")]}
        out[m["name"]]["success_ns"] = int(s.get("success", {}).get("ns", 0))
    return out


def stats_diff(before: dict, after: dict) -> dict:
    d = {}
    for name, a in after.items():
        b = before.get(name, {})
        n = a["success"] - b.get("success", 0)
        if n:
            d[name] = {"requests": n, "failures": a["fail"] - b.get("fail", 0),
                       "avg_queue_ms": (a["queue"] - b.get("queue", 0)) / n / 1e6,
                       "avg_compute_ms": (a["compute_infer"] - b.get("compute_infer", 0)) / n / 1e6}
    return d


VOCODER_COUNTERS = ("chunks", "queue_seconds", "decode_seconds", "late_seconds")


def metrics_url_of(grpc_url: str) -> str:
    """The metrics port beside the gRPC one on its host, as Triton's defaults (8001, 8002) and
    serve.sh's ports moved together (GRPC_PORT=9001, METRICS_PORT=9002) have it."""
    host, _, port = grpc_url.rpartition(":")
    return f"http://{host}:{int(port) + 1 if port.isdigit() else 8002}/metrics"


def vocoder_counters(metrics_url: str) -> dict | None:
    """The vocoder's own counters (Triton's statistics see only its queueing of chunks, not the
    decode), and its calls where the server counts them."""
    if not metrics_url:
        return None
    try:
        text = fetch_metrics(metrics_url)
        got = {k: parse_metric(text, f"velocity_vocoder_{k}_total") for k in VOCODER_COUNTERS}
    except (OSError, KeyError):
        return None
    with contextlib.suppress(KeyError):
        got["calls"] = parse_metric(text, "velocity_vocoder_calls_total")
    return got


def vocoder_diff(before: dict | None, after: dict | None, wall_s: float) -> dict | None:
    """A level's vocoder: its chunks, their mean queue, decode and lateness (ms), its decode seconds
    over the level's wall time (its share of one core) and chunks a call."""
    n = after and before and after["chunks"] - before["chunks"]
    if not n:
        return None
    out = {"chunks": int(n), **{f"avg_{k.split('_')[0]}_ms": (after[k] - before[k]) / n * 1e3
                                for k in VOCODER_COUNTERS[1:]},
           "decode_share": (after["decode_seconds"] - before["decode_seconds"]) / wall_s}
    if "calls" in before and "calls" in after and after["calls"] > before["calls"]:
        out["chunks_per_call"] = n / (after["calls"] - before["calls"])
    return out


def run_concurrently(n: int, concurrency: int, job: Callable[[int], None]) -> None:
    """job(0), ..., job(n - 1) on `concurrency` worker threads, each taking the next index."""
    lock, todo = threading.Lock(), iter(range(n))

    def worker() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            job(i)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_level(url: str, texts: list[str], concurrency: int, n_requests: int, values: dict, bar,
              metrics_url: str = "") -> dict:
    """n_requests over `concurrency` worker threads, each request its own gRPC stream."""
    results, errors, lock = [], [], threading.Lock()
    later: list[float] = []      # first audio of the requests that arrived while others were mid-stream

    def one(i: int) -> None:
        try:
            r = synthesize(stream_grpc(url, {**values, "TEXT": texts[i % len(texts)], "SEED": i}, check=False))
            with lock:
                results.append(r)
                if i >= concurrency and r.first_audio is not None:
                    later.append(r.first_audio)
        except (ServerError, Exception) as e:    # count it, keep the sweep going
            with lock:
                errors.append(str(e)[:300])
        bar.update(1)

    before, voc_before = server_stats(url), vocoder_counters(metrics_url)
    t0 = time.perf_counter()
    run_concurrently(n_requests, concurrency, one)
    wall = time.perf_counter() - t0
    if metrics_url:
        time.sleep(0.3)           # the models publish their counters four times a second
    audio = sum(r.seconds for r in results)
    return {
        "concurrency": concurrency, "requests": n_requests, "errors": len(errors), "error_samples": errors[:3],
        "wall_s": wall, "audio_s": audio, "audio_s_per_s": audio / wall,
        "first_audio_s": summary([r.first_audio for r in results if r.first_audio is not None]),
        "first_audio_samples": [r.first_audio for r in results if r.first_audio is not None],
        "first_audio_later_samples": later,
        "second_chunk_s": summary([r.chunk_times[1] for r in results if len(r.chunk_times) > 1]),
        "total_s": summary([r.total for r in results]),
        "rtf": summary([r.rtf for r in results if r.seconds]),
        "stall_s": summary([r.stall for r in results]),
        "server": stats_diff(before, server_stats(url)),
        "vocoder_queue": vocoder_diff(voc_before, vocoder_counters(metrics_url), wall),
    }


class InProcess:
    """The same requests through velocity and the decoder in this process (no Triton), keeping
    `concurrency` requests in flight on one LLMEngine; chunks are decoded in the step loop."""

    def __init__(self, weights: str, device: str = "cpu") -> None:
        from velocity.serving.settings import Settings
        from velocity.tts.pipeline import TTSPipeline, chattts_params

        s = Settings.from_env()
        self.params = chattts_params
        self.pipe = TTSPipeline(weights, device=device, schedule=s.schedule(gpu=device.startswith("cuda")),
                                lookahead=s.lookahead,
                                max_num_seqs=s.max_num_seqs, kv_cache_bytes=s.kv_cache_bytes,
                                sentences_ahead=s.sentences_ahead, quantize=s.quantize,
                                vocoder_quantize=s.vocoder_quantize)
        list(self.pipe.stream("Warm up.", params=chattts_params(max_new_tokens=8)))

    def level(self, texts: list[str], c: int, n: int, values: dict, bar=None) -> dict:
        """n requests (texts[i % len], seed i), c at a time; the same summary as run_level."""
        started, first, samples, totals, playable = {}, {}, Counter(), {}, defaultdict(list)
        t0 = time.perf_counter()
        for ev in self.pipe.stream_many([texts[i % len(texts)] for i in range(n)], concurrency=c,
                                        params=lambda i: self.params(max_new_tokens=values["MAX_NEW_TOKENS"], seed=i)):
            now = time.perf_counter()
            if ev.kind == "start":
                started[ev.text] = now
            elif ev.kind == "chunk":
                first.setdefault(ev.text, now - started[ev.text])
                samples[ev.text] += len(ev.chunk.audio)
                playable[ev.text].append((now, len(ev.chunk.audio) / SAMPLE_RATE))
            else:
                totals[ev.text] = now - started[ev.text]
                if bar is not None:
                    bar.update(1)
        wall = time.perf_counter() - t0
        audio = sum(samples.values()) / SAMPLE_RATE
        return {"concurrency": c, "requests": n, "wall_s": wall, "audio_s": audio, "audio_s_per_s": audio / wall,
                "first_audio_s": summary(list(first.values())), "total_s": summary(list(totals.values())),
                "rtf": summary([totals[i] / (samples[i] / SAMPLE_RATE) for i in totals if samples[i]]),
                "stall_s": summary([stall(playable[i]) for i in totals])}


def in_process(weights: str, texts: list[str], levels: list[int], n_min: int, values: dict, device: str) -> dict:
    """InProcess at each level, max(n_min, c) requests."""
    runner, out = InProcess(weights, device), {}
    for c in levels:
        n = max(n_min, c)
        with tqdm(total=n, desc=f"in-process c={c}") as bar:
            out[c] = runner.level(texts, c, n, values, bar)
        log.info("in-process c=%d: first audio p50 %.3f s, %.2f audio s/s", c, out[c]["first_audio_s"]["p50"] or -1,
                 out[c]["audio_s_per_s"])
    return out


def realtime_streams(levels: list[dict], rtf: float = 1.0, first_audio_s: float = 0.5) -> int:
    """The "streams in real time": the largest concurrency at which p99 RTF < rtf and p99
    first audio < first_audio_s, with no errors (0: none qualifies)."""
    ok = [x["concurrency"] for x in levels if not x["errors"] and x["rtf"]["p99"] is not None
          and x["rtf"]["p99"] < rtf and x["first_audio_s"]["p99"] < first_audio_s]
    return max(ok, default=0)


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lv = res["levels"]
    c = [x["concurrency"] for x in lv]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, q, style in [("first_audio_s", "p50", "o-"), ("first_audio_s", "p99", "o--"), ("total_s", "p50", "s-")]:
        a.plot(c, [x[key][q] for x in lv], style, label=f"{key.replace('_s', '').replace('_', ' ')} {q}")
    ip = res.get("in_process") or {}
    if ip:
        ic = sorted(ip, key=int)
        a.plot([int(k) for k in ic], [ip[k]["first_audio_s"]["p50"] for k in ic], "x:", color="gray",
               label="first audio p50, in-process")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("concurrent streams")
    a.set_ylabel("seconds")
    a.set_title("Latency")
    a.legend(fontsize=8)
    b.plot(c, [x["audio_s_per_s"] for x in lv], "o-", label="audio seconds / second")
    if ip:
        b.plot([int(k) for k in ic], [ip[k]["audio_s_per_s"] for k in ic], "x:", color="gray", label="in-process")
    b.set_xscale("log", base=2)
    b.set_xlabel("concurrent streams")
    b.set_ylabel("audio seconds generated per second")
    b2 = b.twinx()
    b2.plot(c, [x["rtf"]["p50"] for x in lv], "s--", color="tab:red", label="RTF p50")
    b2.plot(c, [x["rtf"]["p99"] for x in lv], "^:", color="tab:red", label="RTF p99")
    b2.axhline(1.0, color="tab:red", lw=0.6, alpha=0.5)
    if res.get("realtime_streams"):
        b.axvline(res["realtime_streams"], color="tab:green", ls="--",
                  label=f"{res['realtime_streams']} streams in real time (p99 RTF < 1, first audio < 0.5 s)")
    b2.set_ylabel("RTF")
    b.set_title("Throughput")
    b.legend(loc="upper left", fontsize=8)
    b2.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"velocity-tts on Triton, {res['hardware']['device']}, {res['checkpoint']}")
    finish(fig, path, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="localhost:8001")
    ap.add_argument("--metrics-url", default=None, help="default: the --url host, the port after its gRPC port (8002 for 8001)")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    ap.add_argument("--requests", type=int, default=8, help="requests per level at least (and >= concurrency)")
    ap.add_argument("--max-new-tokens", type=int, default=120, help="frame cap per sentence (random weights rarely stop)")
    ap.add_argument("--weights", help="also run the in-process baseline on this checkpoint")
    ap.add_argument("--in-process-concurrency", default="1,32", help="levels for the in-process baseline")
    ap.add_argument("--in-process-only", action="store_true", help="no server: only the in-process baseline")
    ap.add_argument("--device", default="cpu", help="for the in-process baseline")
    ap.add_argument("--hardware", default=None, help="what to print as the hardware (default: this CPU)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "serving_cpu"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    texts = bench_texts()
    values = {"MAX_NEW_TOKENS": args.max_new_tokens}
    levels = [int(c) for c in args.concurrency.split(",")]
    metrics_url = args.metrics_url or metrics_url_of(args.url)
    res: dict = {"hardware": {"device": args.hardware or f"CPU {cpu_model()}, {os.cpu_count()} cores"},
                 "checkpoint": Path(args.weights).name if args.weights else "server's",
                 "max_new_tokens": args.max_new_tokens, "texts": len(texts), "levels": [],
                 # this process's settings: the in-process baseline's, and the server's where it was
                 # started with the same environment (as scripts/device_sweep.sh does)
                 "settings": {k: v for k, v in sorted(os.environ.items()) if k.startswith("VELOCITY_")}}
    if args.weights:
        res["in_process"] = in_process(args.weights, texts, [int(c) for c in args.in_process_concurrency.split(",")],
                                       args.requests, values, args.device)
    if args.in_process_only:
        levels = []
    if levels:
        synthesize(stream_grpc(args.url, {"TEXT": "Warm up.", "MAX_NEW_TOKENS": 8}))   # checks the server too
    total = sum(max(args.requests, c) for c in levels)
    with tqdm(total=total, desc="requests") as bar:
        for c in levels:
            bar.set_postfix(concurrency=c)
            lv = run_level(args.url, texts, c, max(args.requests, c), values, bar, metrics_url)
            res["levels"].append(lv)
            log.info("c=%d: first audio p50 %.3f p99 %.3f s, RTF p50 %.3f, %.2f audio s/s, %d errors", c,
                     lv["first_audio_s"]["p50"] or -1, lv["first_audio_s"]["p99"] or -1, lv["rtf"]["p50"] or -1,
                     lv["audio_s_per_s"], lv["errors"])
    lv = {x["concurrency"]: x for x in res["levels"]}
    ratios = {}
    ip = res.get("in_process") or {}
    if 1 in lv and 1 in ip:
        ratios["first_audio_c1_triton_vs_in_process"] = lv[1]["first_audio_s"]["avg"] / ip[1]["first_audio_s"]["avg"]
    if 32 in lv and 32 in ip:
        ratios["audio_s_per_s_c32_triton_vs_in_process"] = lv[32]["audio_s_per_s"] / ip[32]["audio_s_per_s"]
    if 1 in ip and 32 in ip:
        ratios["in_process_audio_s_per_s_c32_vs_c1"] = ip[32]["audio_s_per_s"] / ip[1]["audio_s_per_s"]
    if 1 in lv and 16 in lv:
        ratios["first_audio_p99_c16_vs_c1"] = lv[16]["first_audio_s"]["p99"] / lv[1]["first_audio_s"]["p99"]
    if 1 in lv and 32 in lv:
        ratios["audio_s_per_s_c32_vs_c1"] = lv[32]["audio_s_per_s"] / lv[1]["audio_s_per_s"]
    res["ratios"] = ratios
    if res["levels"]:
        res["realtime_streams"] = realtime_streams(res["levels"])
        log.info("streams in real time (p99 RTF < 1, p99 first audio < 0.5 s): %d", res["realtime_streams"])
    out = Path(args.out)
    save(res, out, plot)
    log.info("ratios: %s; wrote %s and .png", json.dumps(ratios), out.with_suffix(".json"))


if __name__ == "__main__":
    main()
