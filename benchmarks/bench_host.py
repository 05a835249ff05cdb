#!/usr/bin/env python
"""The server's host work per sequence-step: many streams at once against a server of this tree
and one of a baseline revision, in paired rounds, with the engine alone (bench_step) at the
same batch beside them.

    .venv/bin/python benchmarks/bench_host.py --baseline-rev HEAD~3 --levels 32,128,256 --rounds 2
    .venv/bin/python benchmarks/bench_host.py --arms llm --levels 32 --rounds 1     # this tree alone

Both servers serve the tiny demo checkpoint, on which the model costs almost nothing: a step is
the host's work, as on a GPU. Arms: `llm` sends the front end's outputs straight to the llm model
over gRPC (each stream one request of two sentences; no vocoder, whose CPU decode would swamp the
figure), `tts` the text through the ensemble. Per level (streams at once) it reads the server's
metrics every 0.1 s and, over the window in which the batch is full (the level runs again until
that adds up to 3 s):

- the server's step: wall time / engine steps, and the engine's own step metric
  (velocity_engine_step_seconds_total / _steps_total: the steps and their callbacks);
- the sequences in the batch (a stream runs two sentences at once once its first chunk is out);
- bench_step's step at that batch, run right after the level (the engine alone, in a process of
  its own, the same tree, at about the contexts of the level's window), at the CPU threads the
  server's engine had: on CPU the llm runs on the cores but the vocoder's while a vocoder
  decodes and on all of them while none does (velocity_llm_lent_steps_total counts the latter
  steps), so the engine alone runs at both thread counts and is weighed by the window's share of
  each; the engine alone on every core is kept beside it;
- us per sequence-step = (server step - bench_step step) / sequences: what serving adds;
- beside it, the same within each run's own steps, which the machine's drift between the level
  and bench_step's run does not move: (the server's step less its engine's worker's seconds,
  minus bench_step's step less its worker's) / sequences (velocity_engine_worker_seconds_total;
  LLMEngine.worker_seconds): the host work serving adds around the model, without what the
  server's other processes take from its kernels (a tree from before that counter has none);
- the engine thread's busy share (its step seconds over wall time) and the audio s/s.

Writes JSON and a PNG (the curve of us per sequence-step against sequences, per tree).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import (ROOT, bench_texts, by_arm, exit_on_sigterm, finish,  # noqa: E402
                                hardware, paired_rounds, pct, save, trees)
from benchmarks.server import TritonServer, start_servers  # noqa: E402

log = logging.getLogger("bench_host")
FPS = 24000 / 512                     # GPT frames a second of audio
MIN_WINDOW_S = 3.0                    # seconds of full batch a level is measured over (the level runs again until then)
LLM_INPUTS = ("TOKEN_IDS", "SENTENCE_LENGTHS", "SPEAKER_VECTOR", "PARAMS_F", "PARAMS_I")
COUNTERS = {"steps": "velocity_engine_steps_total", "step_s": "velocity_engine_step_seconds_total",
            "frames": "velocity_frames_generated_total", "running": "velocity_running_sequences",
            "paused": "velocity_paused_sequences", "lent": "velocity_llm_lent_steps_total",
            "worker_s": "velocity_engine_worker_seconds_total"}     # (0 on a tree from before it)


def server_env(weights: str, most: int) -> dict[str, str]:
    """A server for `most` streams of two sentences: every sequence in one batch, none refused."""
    return {"VELOCITY_WEIGHTS": weights, "VELOCITY_MAX_NUM_SEQS": str(2 * most),
            "VELOCITY_MAX_CONCURRENT_REQUESTS": str(most + 8), "VELOCITY_MAX_DIRECT_REQUESTS": "0",
            "VELOCITY_KV_CACHE_BYTES": str(1 << 30),
            "BIND": "127.0.0.1"}


def texts_of(sentences: int) -> list[str]:
    """The shipped sentences, `sentences` of them joined per text."""
    t = bench_texts()
    return [" ".join(t[(i + k) % len(t)] for k in range(sentences)) for i in range(len(t))]


def frontend_outputs(url: str, n: int, texts: list[str], max_new_tokens: int) -> list[dict]:
    """The llm's inputs of n requests (text i mod len, seed i), as text_frontend makes them (with
    their TEXT and SEED, for the `tts` arm)."""
    import tritonclient.grpc as grpcclient

    from client.triton import make_inputs

    client = grpcclient.InferenceServerClient(url)
    out = []
    for i in range(n):
        fe = client.infer("text_frontend", make_inputs(grpcclient, {"TEXT": texts[i % len(texts)], "SEED": i,
                                                                    "MAX_NEW_TOKENS": max_new_tokens}))
        out.append({name: fe.as_numpy(name) for name in LLM_INPUTS} | {"TEXT": texts[i % len(texts)], "SEED": i})
    client.close()
    return out


def lasting(candidates: list[dict], weights: str, frames: int, n: int) -> list[dict]:
    """n of the candidates (the llm's inputs) whose every sentence runs all its `frames`: the tiny
    weights draw the end code by chance (a batch of them shrank by half in 400 steps), and a steady
    batch is what the step is measured at. Each candidate is run here on the same engine as the
    server's; its frames are its own whatever its batch (the CPU kernels are batch-invariant), so
    the server's run of it is as long."""
    from velocity.config import EngineConfig
    from velocity.engine.llm_engine import LLMEngine
    from velocity.serving.llm.llm_inputs import llm_inputs

    eng = LLMEngine(EngineConfig(model=weights, device="cpu", max_num_seqs=256))
    ok: list[dict] = []
    for start in range(0, len(candidates), 128):
        batch = candidates[start:start + 128]
        reasons: dict[int, set] = {}
        for k, arrays in enumerate(batch):
            inp = llm_inputs(lambda name: arrays.get(name), 1 << 30, eng.model.num_vq)
            for j, prompt in enumerate(inp.sentences):
                eng.add_request(f"{k}-{j}", prompt, inp.params, speaker=torch_speaker(inp.speaker))
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    reasons.setdefault(int(out.request_id.split("-")[0]), set()).add(out.finish_reason)
        ok += [arrays for k, arrays in enumerate(batch) if reasons.get(k) == {"length"}]
        if len(ok) >= n:
            return ok[:n]
    raise SystemExit(f"bench_host: only {len(ok)} of {len(candidates)} requests run {frames} frames a sentence; "
                     "lower --max-new-tokens")


def torch_speaker(spk):
    import torch
    return None if spk is None else torch.from_numpy(spk)


def read_counters(metrics_url: str) -> dict[str, float]:
    from client.triton import fetch_metrics, model_metric

    text = fetch_metrics(metrics_url)
    return {k: model_metric(text, name, "llm") for k, name in COUNTERS.items()}


async def one_stream(client, model: str, inputs: list, t0: float) -> dict:
    """One request over a gRPC stream of its own: when its first chunk came, when it ended, errors."""
    async def requests():
        yield {"model_name": model, "inputs": inputs, "enable_empty_final_response": True}

    first, error = None, None
    async for result, err in client.stream_infer(inputs_iterator=requests()):
        if err is not None:
            error = str(err)[:200]
            break
        response = result.get_response()
        if first is None and response.outputs:
            first = time.perf_counter() - t0
        if response.parameters["triton_final_response"].bool_param:
            break
    return {"first": first, "total": time.perf_counter() - t0, "error": error}


async def poll(metrics_url: str, samples: list, stop: asyncio.Event) -> None:
    """The llm's counters every 0.1 s, with the time each was read."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        with contextlib.suppress(OSError, KeyError):
            samples.append((time.perf_counter(), await loop.run_in_executor(None, read_counters, metrics_url)))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


def steady(samples: list[tuple[float, dict]], full: float = 0.9) -> dict | None:
    """The window in which the batch is full (at least `full` of its most sequences in a step):
    its wall seconds, steps, step seconds, frames and mean sequences; None if too short."""
    batch = [(t, c, c["running"] - c["paused"]) for t, c in samples]
    top = max((b for _, _, b in batch), default=0)
    inside = [(t, c, b) for t, c, b in batch if top and b >= full * top]
    # the counters move when the llm publishes them (4 times a second): the window runs from the
    # first sample that saw a publish inside it to the last one that did
    moved = [x for prev, x in zip(inside, inside[1:]) if x[1]["steps"] != prev[1]["steps"]]
    if len(moved) < 3:
        return None
    (t0, c0, _), (t1, c1, _) = moved[0], moved[-1]
    steps = c1["steps"] - c0["steps"]
    if steps <= 0:
        return None
    return {"wall_s": t1 - t0, "steps": steps, "step_s": c1["step_s"] - c0["step_s"],
            "frames": c1["frames"] - c0["frames"], "lent": c1["lent"] - c0["lent"],
            "worker_s": c1["worker_s"] - c0["worker_s"],
            "sequences": statistics.fmean(b for t, _, b in inside if t0 <= t <= t1)}


def run_level(server: TritonServer, arm: str, streams: int, llm_inputs: list[dict], texts: list[str],
              max_new_tokens: int) -> dict:
    """`streams` requests at once on `server` (arm llm or tts), the llm's counters read meanwhile."""
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aioclient

    from client.triton import array_inputs, make_inputs

    if arm == "llm":
        inputs = [array_inputs(grpcclient, {k: v for k, v in llm_inputs[i].items() if k in LLM_INPUTS})
                  for i in range(streams)]
    else:                                        # the same texts and seeds (those that run their frames)
        inputs = [make_inputs(grpcclient, {"TEXT": llm_inputs[i]["TEXT"], "SEED": llm_inputs[i]["SEED"],
                                           "MAX_NEW_TOKENS": max_new_tokens}) for i in range(streams)]
    murl = f"http://localhost:{server.metrics_port}/metrics"

    async def main() -> tuple[list, list, float]:
        samples: list = []
        stop = asyncio.Event()
        client = aioclient.InferenceServerClient(server.grpc_url)
        poller = asyncio.create_task(poll(murl, samples, stop))
        await asyncio.sleep(0.3)
        t0 = time.perf_counter()
        got = await asyncio.gather(*(one_stream(client, arm, x, t0) for x in inputs))
        wall = time.perf_counter() - t0
        stop.set()
        await poller
        await client.close()
        return got, samples, wall

    got, windows, series, wall = [], [], [], 0.0
    while sum(w["wall_s"] for w in windows) < MIN_WINDOW_S and len(series) < 6:   # a few seconds of full batch
        g, samples, seconds = asyncio.run(main())
        got += g
        wall += seconds
        # through tts the vocoder paces the streams (a stream pauses with its backlog): a looser window
        if (w := steady(samples, 0.9 if arm == "llm" else 0.6)) is not None:
            windows.append(w)
        # (seconds, steps, sequences in the batch) as read: the run's course
        series.append([(round(t - samples[0][0], 3), c["steps"], c["running"] - c["paused"]) for t, c in samples])
    window = None if not windows else {k: sum(w[k] for w in windows) for k in ("wall_s", "steps", "step_s", "frames", "lent", "worker_s")} | {
        "sequences": sum(w["sequences"] * w["steps"] for w in windows) / sum(w["steps"] for w in windows),
        "runs": len(series)}
    firsts = [g["first"] for g in got if g["first"] is not None]
    errors = [g["error"] for g in got if g["error"]]
    out = {"streams": streams, "arm": arm, "wall_s": wall, "errors": len(errors), "error_samples": errors[:3],
           "first_audio_p50_s": pct(firsts, 50), "first_audio_p99_s": pct(firsts, 99), "window": window,
           "series": series}
    if window:
        w = window
        out |= {"sequences": w["sequences"], "server_step_ms": 1e3 * w["wall_s"] / w["steps"],
                "engine_step_ms": 1e3 * w["step_s"] / w["steps"], "busy": w["step_s"] / w["wall_s"],
                "lent_share": min(1.0, w["lent"] / w["steps"]),
                "audio_s_per_s": w["frames"] / FPS / w["wall_s"]}
        if w["worker_s"] > 0:                    # the server's step outside the engine's worker, in the same steps
            out["outside_worker_ms"] = 1e3 * (w["wall_s"] - w["worker_s"]) / w["steps"]
    time.sleep(0.5)
    return out


def engine_alone(tree: str | None, weights: str, batches: list[int], steps: int, threads: int = 0) -> dict[int, dict]:
    """bench_step's figures at each batch (bench_step.measure's: step_ms, outside_worker_ms...),
    the engine alone in a process of its own, on `threads` CPU threads (0: every core)."""
    from benchmarks.bench_step import child

    args = argparse.Namespace(weights=weights, device="cpu", batches=",".join(map(str, batches)), steps=steps,
                              profile=0, scattered=False)
    got = child(args, tree, "none", threads=threads)
    return {b: got[b] for b in batches}


def engine_threads() -> tuple[int, int]:
    """The server's llm threads on CPU (its settings, from this environment as the server's is):
    while a vocoder decodes, and while none does."""
    from velocity.serving.settings import Settings

    s = Settings.from_env()
    own = s.llm_own_threads()
    return own, s.threads_lent(own)


def engine_alone_as_served(tree: str | None, weights: str, batch: int, steps: int, lent_share: float) -> dict:
    """The engine alone at `batch` on the threads the server's engine had: each thread count's
    step weighed by its share of the window's steps (`lent_share` with the vocoder's threads)."""
    own, lent = engine_threads()
    every = engine_alone(tree, weights, [batch], steps, lent)[batch]
    mine = engine_alone(tree, weights, [batch], steps, own)[batch] if own != lent and lent_share < 0.99 else every
    out = {"bench_step_all_cores_ms": every["step_ms"], "bench_step_own_threads_ms": mine["step_ms"],
           "bench_step_ms": lent_share * every["step_ms"] + (1 - lent_share) * mine["step_ms"]}
    if "outside_worker_ms" in every:           # (a tree from before LLMEngine.worker_seconds has none)
        out["bench_step_outside_worker_ms"] = lent_share * every["outside_worker_ms"] + \
            (1 - lent_share) * mine["outside_worker_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="32,128,256", help="streams at once, comma-separated")
    ap.add_argument("--arms", default="llm,tts", help="llm (straight to the llm model), tts (the ensemble)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=300, help="frames per sentence (every request runs them all)")
    ap.add_argument("--sentences", type=int, default=2, help="sentences per request")
    ap.add_argument("--steps", type=int, default=0, help="bench_step's steps per batch (0: the frames the "
                    "servers' window spans, at about its contexts)")
    base = ap.add_mutually_exclusive_group()
    base.add_argument("--baseline-rev", help="git revision of the baseline server (none: this tree alone)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "host" / "host"))
    args = ap.parse_args()
    exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from tqdm.auto import tqdm

    from velocity.demo.checkpoint import write_checkpoint

    levels = [int(x) for x in args.levels.split(",")]
    kinds = args.arms.split(",")
    if any(k not in ("llm", "tts") for k in kinds):
        raise SystemExit(f"--arms: llm and/or tts, got {args.arms!r}")
    texts = texts_of(args.sentences)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-host-")))
        # small audio models: the vocoder's CPU decode of hundreds of streams paces the tts arm less
        weights = str(write_checkpoint(tmp / "tiny", "tiny", seed=0, small_audio=True))
        roots, labels = trees(stack, args.baseline_rev)
        log.info("starting the servers of %s", ", ".join(labels.values()))
        servers = start_servers(stack, roots, tmp, lambda name: server_env(weights, max(levels)), gateway_port=0)
        llm_inputs = lasting(frontend_outputs(servers["this"].grpc_url, 3 * max(levels), texts, args.max_new_tokens),
                             weights, args.max_new_tokens, max(levels))
        names = sorted(roots)                    # the baseline first in each pair
        steps = args.steps or max(20, args.max_new_tokens - 40)
        with tqdm(total=args.rounds * len(names) * len(levels) * len(kinds), desc="levels") as bar:
            def one_round(name: str) -> dict:
                """Each level on the tree's server, then at once the engine alone at the batch it
                ran (the machine's speed drifts by minutes: the two are compared within the round)."""
                out = {}
                for kind in kinds:
                    for n in levels:
                        lv = out[f"{kind}@{n}"] = run_level(servers[name], kind, n, llm_inputs, texts,
                                                            args.max_new_tokens)
                        if lv.get("sequences"):          # (a level with no full batch has none)
                            b = round(lv["sequences"])
                            lv |= engine_alone_as_served(None if name == "this" else str(roots[name]), weights, b,
                                                         steps, lv["lent_share"])
                            lv["us_per_sequence_step"] = 1e3 * (lv["server_step_ms"] - lv["bench_step_ms"]) / \
                                lv["sequences"]
                            if "outside_worker_ms" in lv and "bench_step_outside_worker_ms" in lv:
                                lv["outside_us_per_sequence_step"] = 1e3 * (
                                    lv["outside_worker_ms"] - lv["bench_step_outside_worker_ms"]) / lv["sequences"]
                        bar.update(1)
                return out

            rounds = paired_rounds(names, args.rounds, one_round)
    res = {"hardware": hardware(), "levels": levels, "arms": kinds, "labels": labels,
           "max_new_tokens": args.max_new_tokens, "sentences": args.sentences, "bench_step_steps": steps,
           "rounds": rounds, "summary": {}}
    for name, xs in by_arm(rounds).items():
        summ = res["summary"][name] = {}
        for key in xs[0]:
            lv = [x[key] for x in xs if x[key].get("sequences")]
            if not lv:
                continue
            m = {k: statistics.median(x[k] for x in lv) for k in (
                "sequences", "server_step_ms", "engine_step_ms", "bench_step_ms", "bench_step_all_cores_ms",
                "lent_share", "us_per_sequence_step", "busy", "audio_s_per_s")}
            m["first_audio_p99_s"] = statistics.median(x["first_audio_p99_s"] or 0 for x in lv)
            if all("outside_us_per_sequence_step" in x for x in lv):
                m["outside_us_per_sequence_step"] = statistics.median(x["outside_us_per_sequence_step"] for x in lv)
            m["errors"] = sum(x[key]["errors"] for x in xs)
            m["engine_over_bench_step"] = statistics.median(x["engine_step_ms"] / x["bench_step_ms"] for x in lv)
            m["engine_over_all_cores"] = statistics.median(x["engine_step_ms"] / x["bench_step_all_cores_ms"]
                                                           for x in lv)
            summ[key] = m
            log.info("%s %s: %.0f sequences, server step %.2f ms (engine %.2f, busy %.0f%%), bench_step %.2f ms "
                     "at the engine's threads (%.0f%% of steps on every core; %.2f ms on every core): %.1f us per "
                     "sequence-step (median of rounds); %.1f audio s/s, first audio p99 %.2f s, %d errors",
                     labels[name], key, m["sequences"], m["server_step_ms"], m["engine_step_ms"], 100 * m["busy"],
                     m["bench_step_ms"], 100 * m["lent_share"], m["bench_step_all_cores_ms"],
                     m["us_per_sequence_step"], m["audio_s_per_s"], m["first_audio_p99_s"], m["errors"])
            if "outside_us_per_sequence_step" in m:
                log.info("%s %s: in the same steps, outside the worker: %.1f us per sequence-step", labels[name],
                         key, m["outside_us_per_sequence_step"])
    log.info("wrote %s and its .png", save(res, Path(args.out), plot))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, summ in res["summary"].items():
        for kind, style in (("llm", "o-"), ("tts", "s--")):
            pts = sorted((m["sequences"], m) for k, m in summ.items() if k.startswith(kind + "@"))
            if not pts:
                continue
            label = f"{res['labels'][name]}, {'straight to llm' if kind == 'llm' else 'through tts'}"
            a.plot([s for s, _ in pts], [m["us_per_sequence_step"] for _, m in pts], style, label=label)
            b.plot([s for s, _ in pts], [m["audio_s_per_s"] for _, m in pts], style, label=label)
            inside = [(s, m["outside_us_per_sequence_step"]) for s, m in pts if "outside_us_per_sequence_step" in m]
            if inside:                           # the same steps' host work around the model
                a.plot(*zip(*inside), style[0] + ":", alpha=0.6, label=label + ", in the same steps")
    a.axhline(10, color="tab:green", lw=0.8, ls=":", label="10 us")
    a.set(xscale="log", xlabel="sequences in the batch", ylabel="us per sequence-step (server - engine alone)",
          title="The server's host work per sequence and step", ylim=(0, None))
    b.set(xscale="log", xlabel="sequences in the batch", ylabel="audio seconds per second",
          title="Throughput (tiny checkpoint)", ylim=(0, None))
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    finish(fig, path, res)


if __name__ == "__main__":
    main()
