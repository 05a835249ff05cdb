#!/usr/bin/env python
"""Engine decode step with ChatTTS sampling, split into model, sampler and the rest, by batch size.

Every request samples as the service does (temperature 0.3, top-p 0.7, top-k 20, repetition
penalty 1.05 over 16 frames, its own seed) with a speaker; the end code is ignored so the batch
stays full. With the tiny checkpoint the model costs almost nothing and the step is the engine's
host work (scheduler, inputs, sampler, outputs): on a GPU that is what bounds a step.

    .venv/bin/python benchmarks/bench_step.py --size tiny
    .venv/bin/python benchmarks/bench_step.py --size tiny --baseline-rev HEAD~1   # A/B against a revision
    .venv/bin/python benchmarks/bench_step.py --size full --device cuda
    .venv/bin/python benchmarks/bench_step.py --size full --quantize int8 --baseline-quantize none --batches 1,8,32

--baseline-rev REV measures velocity at git revision REV too, with the same --quantize (a
temporary worktree, this script run with it first on the path), in alternating rounds (ABBA),
and reports per batch size the median ratio of the baseline's step time to this checkout's; --baseline-dir DIR does the same
with a folder holding a `velocity` package (a copy without git, e.g. on a device machine);
--baseline-quantize Q compares this checkout with --quantize against itself with Q, and
--baseline-config NAME=VALUE with its
--config against itself with those EngineConfig settings (one lever's share: graph_sampler=0,
gpu_kernels=0). The weight
bytes a step reads and, on CPU, the bound they set (bytes / read bandwidth measured in the run)
are reported per arm. --scattered takes the KV blocks in a random order (seeded; the same in
every arm), as a long-running server's are once many streams came and went, instead of a fresh
cache's in order. Writes JSON and a PNG.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a file: the repository's packages

from benchmarks.harness import (ROOT, baseline_tree, by_arm, finish, hardware,  # noqa: E402
                                paired_rounds, revision, save)

log = logging.getLogger("bench_step")


def weight_bytes(model) -> int:
    """Bytes of weights an audio decode step (this script's) reads: parameters (not embedding
    tables, of which a step reads a row per token), prepacked float32 and int8 linears; not
    ChatTTS's head_text, which only text refine runs."""
    import torch
    unread = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    unread += [model.head_text] if hasattr(model, "head_text") else []
    skip = {id(p) for m in unread for p in m.parameters()}
    n = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skip)
    for m in model.modules():
        if m in unread:
            continue
        if hasattr(m, "packed") and hasattr(m, "in_features"):
            per = 1 if type(m).__name__ == "Int8Linear" else 4
            n += m.in_features * m.out_features * per
    return n


def profile_steps(eng, n: int, sync) -> dict:
    """The torch profiler over `n` engine steps, per decoded frame: kernels, the GPU's busy time (the
    union of its kernels and copies), the host gap (wall time the GPU sits idle), the CUDA runtime
    calls (launches, graph replays, copies, syncs), the top kernels and the top host operations."""
    from collections import Counter, defaultdict

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = eng.worker.device.type == "cuda"
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        t, frames = time.perf_counter(), 0
        for _ in range(n):
            frames += len(eng.step()[0].new_token_ids)
        sync()
        wall = time.perf_counter() - t
    events = prof.events()
    dev = [e for e in events if e.device_type != DeviceType.CPU]            # kernels, copies, fills
    kernels = [e for e in dev if not e.name.startswith(("Memcpy", "Memset"))]
    busy, end = 0.0, float("-inf")                                          # union of the spans, us
    for s, e in sorted((e.time_range.start, e.time_range.end) for e in dev):
        busy += max(0.0, e - max(s, end))
        end = max(end, e)
    gpu = defaultdict(float)
    for e in kernels:
        gpu[e.name] += e.time_range.elapsed_us()
    calls = Counter(e.name for e in events if e.device_type == DeviceType.CPU and e.name.startswith("cuda"))
    host = sorted(((a.key, a.self_cpu_time_total) for a in prof.key_averages()), key=lambda x: -x[1])
    return {"frames": frames, "wall_ms": 1e3 * wall / frames, "kernels": len(kernels) / frames,
            "gpu_busy_ms": busy / 1e3 / frames, "host_gap_ms": max(0.0, 1e3 * wall - busy / 1e3) / frames,
            "runtime_calls": {k: v / frames for k, v in calls.most_common(8)},
            "top_kernels": [[k[:90], v / 1e3 / frames] for k, v in sorted(gpu.items(), key=lambda x: -x[1])[:8]],
            "top_host_ops": [[k[:90], v / 1e3 / frames] for k, v in host[:8]]}


def measure(weights: str, device: str, batches: list[int], steps: int, quantize: str = "none",
            profile: int = 0, config: dict | None = None, scattered: bool = False) -> dict:
    """{batch: {"step_ms", "model_ms", "sampler_ms", "host_ms", "host_us_per_seq", "outside_worker_ms"},
    "weight_bytes": n, "threads": torch's CPU threads}:
    medians over the steps of `steps` decoded frames, per frame. On CPU, host_ms is the step less
    the model's forward, the heads and the sampler's tensor work (the time the host spends outside
    them, on a GPU what it adds to the step unless hidden), and host_us_per_seq it over the batch;
    outside_worker_ms the step less LLMEngine.worker_seconds (a tree from before it has none).
    Where the layers run on the C++ rows (CPU), also "linears_ms" (the C++ GEMMs' calls) and
    "attention_ms" (RoPE, the cache write and paged decode attention, one call a layer) inside the model's.
    With `profile`, each batch's "profile" over that many more steps, without the timers
    (profile_steps)."""
    import torch

    import velocity.engine.worker as worker_module
    from velocity.config import EngineConfig
    from velocity.engine.llm_engine import LLMEngine
    from velocity.tts.pipeline import chattts_params
    from velocity.tts.speaker import random_speaker

    kw = {"quantize": quantize} if quantize != "none" else {}   # (a baseline from before it has none)
    kw.update(config or {})
    eng = LLMEngine(EngineConfig(model=weights, device=device, max_num_seqs=max(batches), **kw))
    w = eng.worker
    if scattered:                          # the free blocks (least recently freed first) shuffled
        order = list(eng.block_manager.free)
        random.Random(0).shuffle(order)
        eng.block_manager.free = collections.OrderedDict.fromkeys(order)
    sync = torch.cuda.synchronize if w.device.type == "cuda" else (lambda: None)
    spent = {"model": 0.0, "sampler": 0.0, "device": 0.0, "linears": 0.0, "attention": 0.0}

    class Timed:
        """Calls through to `inner`, adding the seconds they take to spent[key]."""

        def __init__(self, inner, key: str) -> None:
            self.inner, self.key = inner, key

        def __call__(self, *a, **kw):
            sync()
            t = time.perf_counter()
            out = self.inner(*a, **kw)
            sync()
            spent[self.key] += time.perf_counter() - t
            return out

        def __getattr__(self, name: str):
            return getattr(self.inner, name)


    timed = [(w.runner, "run", "model"), (w, "sampler", "sampler")]   # the sampler's share includes
    if hasattr(worker_module, "sampling_batch"):                        # preparing its tensors (a
        timed.append((worker_module, "sampling_batch", "sampler"))     # baseline from before has none)
    for obj, name, key in timed:
        setattr(obj, name, Timed(getattr(obj, name), key))
    # the device's work: the model's forward and the heads (inside "model" and the worker), and
    # the sampler's own call (inside "sampler"); what is left of a step is the host's
    w.runner.model = Timed(w.runner.model, "device")
    w.sampler.inner = Timed(w.sampler.inner, "device")
    for h in w.model.heads.values():
        h.fn = Timed(h.fn, "device")
    body = getattr(w.model, "model", None)
    split = getattr(body, "rows", None) is not None and hasattr(body, "row_plan")
    if split:                              # the C++ rows: the GEMMs and the attention apart, before the first step
        for m in body.modules():           # (row_plan binds each linear's gemm at its first call)
            if getattr(m, "gemm", None) is not None:
                m.gemm = Timed(m.gemm, "linears")

        class Rows:
            """The rows' module, its attention call timed."""

            def __init__(self, inner) -> None:
                self.inner, self.rope_attend_scale = inner, Timed(inner.rope_attend_scale, "attention")

            def __getattr__(self, name: str):
                return getattr(self.inner, name)

        body.rows = Rows(body.rows)
    spk = torch.from_numpy(random_speaker(1, w.model.config.hidden_size))
    out = {}
    for b in batches:
        ids = [f"b{b}-{i}" for i in range(b)]
        for i, rid in enumerate(ids):
            p = chattts_params(seed=i, max_new_tokens=steps + profile + 22)
            p.ignore_eos = True
            eng.add_request(rid, list(range(5, 45)), p, speaker=spk)
        frames = 0
        while frames < 20:                      # prefill, then decodes with a full history
            frames += len(eng.step()[0].new_token_ids)
        rows, outside = [], []
        while frames < 20 + steps:
            spent.update(model=0.0, sampler=0.0, device=0.0, linears=0.0, attention=0.0)
            ws = getattr(eng, "worker_seconds", None)        # (a baseline from before it has none)
            t = time.perf_counter()
            eng.step()
            sync()
            frames += 1
            dt = time.perf_counter() - t
            rows.append((dt, spent["model"], spent["sampler"], dt - spent["device"], spent["linears"], spent["attention"]))
            if ws is not None:
                outside.append(dt - (eng.worker_seconds - ws))
        out[b] = {k: 1e3 * statistics.median(r[j] for r in rows)
                  for j, k in enumerate(("step_ms", "model_ms", "sampler_ms", "host_ms"))}
        out[b]["host_us_per_seq"] = 1e3 * out[b]["host_ms"] / b
        log.info("batch %d: step %.2f ms (model %.2f, sampler %.2f; host %.2f, %.2f us a sequence)", b,
                 *out[b].values())
        if outside:                             # the step outside the worker (velocity_engine_worker_seconds_total's)
            out[b]["outside_worker_ms"] = 1e3 * statistics.median(outside)
        if split:
            out[b] |= {"linears_ms": 1e3 * statistics.median(r[4] for r in rows),
                       "attention_ms": 1e3 * statistics.median(r[5] for r in rows)}
        if profile:
            for obj, name, _ in timed:
                setattr(obj, name, getattr(obj, name).inner)
            out[b]["profile"] = profile_steps(eng, profile, sync)
            for obj, name, key in timed:
                setattr(obj, name, Timed(getattr(obj, name), key))
        for rid in ids:
            eng.abort(rid)
    out["weight_bytes"] = weight_bytes(w.model)
    out["threads"] = torch.get_num_threads()
    out["velocity"] = str(Path(worker_module.__file__).parents[1])     # whose code ran: this tree or a baseline's
    return out


def parse_config(items: list[str]) -> dict:
    """["gpu_kernels=0", ...] -> EngineConfig overrides {"gpu_kernels": False, ...} (bools and ints)."""
    from dataclasses import fields

    from velocity.config import EngineConfig
    types = {f.name: f.type for f in fields(EngineConfig)}
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in types or not value:
            raise SystemExit(f"bench_step: --config {item!r}: want NAME=VALUE with NAME an EngineConfig field "
                             f"({', '.join(sorted(types))})")
        out[key] = (value.lower() in ("1", "true", "yes")) if types[key] == "bool" else \
            int(value) if types[key] == "int" else value
    return out


def child(args: argparse.Namespace, tree: str | None, quantize: str, config: list[str] = (), threads: int = 0) -> dict:
    """One round in a fresh process, importing velocity from `tree` if given (this script and the
    harness stay this checkout's: a baseline may predate them). threads: torch's CPU threads there
    (OMP_NUM_THREADS; 0: torch's default, every core)."""
    cmd = [sys.executable, __file__, "--child", "--weights", args.weights, "--device", args.device,
           "--batches", args.batches, "--steps", str(args.steps), "--quantize", quantize,
           "--profile", str(args.profile)] + (["--scattered"] if args.scattered else [])
    cmd += [a for c in config for a in ("--config", c)]
    env = os.environ | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
    run = subprocess.run(cmd + (["--tree", tree] if tree else []), capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"bench_step: a round failed ({tree or 'this tree'}, quantize {quantize}):\n{run.stderr[-3000:]}")
    got = json.loads(run.stdout.splitlines()[-1])
    return {(int(k) if k.isdigit() else k): v for k, v in got.items()}


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in ("baseline", "this") if a in res["arms"]]
    batches = res["batches"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        xs = [i + (j - (len(arms) - 1) / 2) * width for i in range(len(batches))]
        m = res["arms"][arm]
        bottom = [0.0] * len(batches)
        for part, color in (("model_ms", "tab:blue"), ("sampler_ms", "tab:orange"), ("other_ms", "tab:gray")):
            vals = [m[str(b)][part] for b in batches]
            ax.bar(xs, vals, width, bottom=bottom, color=color, alpha=1.0 if arm == "this" else 0.45,
                   label=f"{part[:-3]} ({res['labels'][arm]})")
            bottom = [x + v for x, v in zip(bottom, vals)]
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("sequences in the decode batch")
    ax.set_ylabel("ms per frame (median)")
    ax.set_title(f"velocity decode step, ChatTTS sampling: {res['checkpoint']} on {res['device']}")
    ax.legend(fontsize=7)
    finish(fig, path, res, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("tiny", "full"), default="tiny", help="demo checkpoint made for the run")
    ap.add_argument("--weights", help="a ChatTTS release folder instead of --size")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=4, help="with a baseline: rounds of each arm")
    base = ap.add_mutually_exclusive_group()
    base.add_argument("--baseline-rev", help="git revision to compare against")
    base.add_argument("--baseline-dir", help="folder holding the velocity package to compare against")
    base.add_argument("--baseline-quantize", choices=("none", "int8"), help="this checkout, another VELOCITY_QUANTIZE")
    base.add_argument("--baseline-config", action="append", metavar="NAME=VALUE",
                      help="this checkout with these EngineConfig settings (repeatable), e.g. graph_sampler=0")
    ap.add_argument("--quantize", choices=("none", "int8"), default="none", help="this arm's VELOCITY_QUANTIZE")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                    help="this arm's EngineConfig settings (repeatable)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also run the torch profiler over N more steps a batch (kernels, host gaps)")
    ap.add_argument("--scattered", action="store_true", help="the KV blocks taken in a random order (a long-running server's)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "engine_step"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        logging.basicConfig(level=logging.WARNING)
        if args.tree:                           # the baseline's velocity (none is imported yet)
            assert "velocity" not in sys.modules
            sys.path.insert(0, args.tree)
        print(json.dumps(measure(args.weights, args.device, batches, args.steps, args.quantize,
                                 args.profile, parse_config(args.config), args.scattered)))
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from tqdm.auto import tqdm
    checkpoint = args.weights or args.size
    quant = {"this": args.quantize, "baseline": args.baseline_quantize or args.quantize}   # a revision: the same settings
    labels = {"this": revision() or "this"}
    with tempfile.TemporaryDirectory() as tmp, \
            (baseline_tree(args.baseline_rev) if args.baseline_rev else contextlib.nullcontext()) as wt:
        if not args.weights:
            from velocity.demo.checkpoint import write_checkpoint
            args.weights = str(write_checkpoint(Path(tmp) / "ck", args.size, seed=0))
        trees = {"this": None}
        if args.baseline_rev:
            trees["baseline"], labels["baseline"] = str(wt), args.baseline_rev
        elif args.baseline_dir:
            if not (Path(args.baseline_dir) / "velocity" / "__init__.py").is_file():
                raise SystemExit(f"--baseline-dir {args.baseline_dir}: no velocity package in it")
            trees["baseline"], labels["baseline"] = str(Path(args.baseline_dir).resolve()), Path(args.baseline_dir).name
        elif args.baseline_quantize or args.baseline_config:
            trees["baseline"], labels["baseline"] = None, labels["this"]
        configs = {"this": args.config, "baseline": args.baseline_config or args.config}
        parse_config(configs["this"] + configs["baseline"])          # a typo stops here, not in a child
        for a in trees:
            if quant[a] != "none":
                labels[a] += f" {quant[a]}"
            if configs[a]:
                labels[a] += " " + " ".join(configs[a])
        arms = ["baseline", "this"] if "baseline" in trees else ["this"]
        rounds = args.rounds if len(arms) > 1 else 1
        with tqdm(total=rounds * len(arms), desc="rounds") as bar:
            runs = by_arm(paired_rounds(arms, rounds, lambda a: child(args, trees[a], quant[a], configs[a]),
                                        bar))
    res = {"hardware": hardware(),
           "device": args.device, "checkpoint": checkpoint, "batches": batches, "steps": args.steps,
           "rounds": len(runs["this"]), "quantize": {a: quant[a] for a in runs},
           "config": {a: configs[a] for a in runs}, "scattered": args.scattered,
           "labels": labels, "arms": {}, "rounds_raw": {a: [{str(b): v for b, v in x.items()} for x in runs[a]]
                                                       for a in runs}}
    if args.device == "cpu":
        from benchmarks.bench_engine import bandwidth_gbs
        res["bandwidth_GBs"] = bandwidth_gbs("cpu")
    for a, xs in runs.items():
        res["arms"][a] = {"weight_bytes": xs[0]["weight_bytes"]}
        if "bandwidth_GBs" in res:
            res["arms"][a]["bound_ms"] = xs[0]["weight_bytes"] / res["bandwidth_GBs"] / 1e6
        for b in batches:
            m = {k: statistics.median(x[b][k] for x in xs) for k in ("step_ms", "model_ms", "sampler_ms", "host_ms",
                                                                       "host_us_per_seq")}
            m["other_ms"] = max(0.0, m["step_ms"] - m["model_ms"] - m["sampler_ms"])
            m |= {k: statistics.median(x[b][k] for x in xs) for k in ("linears_ms", "attention_ms") if k in xs[0][b]}
            res["arms"][a][str(b)] = m
    if args.profile:                              # each arm's first round
        res["profile"] = {a: {str(b): xs[0][b]["profile"] for b in batches} for a, xs in runs.items()}
        for a in res["profile"]:
            for b, pr in res["profile"][a].items():
                log.info("profile %s, batch %s: %.2f ms a frame, GPU busy %.2f ms, host gap %.2f ms, %.0f kernels, "
                         "top kernel %s", labels[a], b, pr["wall_ms"], pr["gpu_busy_ms"], pr["host_gap_ms"],
                         pr["kernels"], (pr["top_kernels"] or [["-"]])[0][0][:50])
    if "baseline" in runs:
        res["baseline_over_this"] = {str(b): statistics.median(x[b]["step_ms"] / y[b]["step_ms"]
                                                               for x, y in zip(runs["baseline"], runs["this"]))
                                     for b in batches}
        res["host_baseline_over_this"] = {str(b): statistics.median(x[b]["host_ms"] / y[b]["host_ms"]
                                                                    for x, y in zip(runs["baseline"], runs["this"]))
                                          for b in batches}
    for a in runs:
        if "bound_ms" in res["arms"][a]:
            log.info("%s: %.0f MB of weights, bound %.2f ms per step at %.1f GB/s", labels[a],
                     res["arms"][a]["weight_bytes"] / 1e6, res["arms"][a]["bound_ms"], res["bandwidth_GBs"])
    for b in batches:
        this = res["arms"]["this"][str(b)]
        line = "batch %3d: step %.2f ms (model %.2f, sampler %.2f; host %.2f ms, %.2f us a sequence)" % (
            b, *(this[k] for k in ("step_ms", "model_ms", "sampler_ms", "host_ms", "host_us_per_seq")))
        if "linears_ms" in this:
            line += "; of the model, linears %.2f, attention %.2f ms" % (this["linears_ms"], this["attention_ms"])
        if "baseline" in runs:
            line += "; baseline %.2f ms, %.2fx; its host %.2f us a sequence, %.2fx" % (
                res["arms"]["baseline"][str(b)]["step_ms"], res["baseline_over_this"][str(b)],
                res["arms"]["baseline"][str(b)]["host_us_per_seq"], res["host_baseline_over_this"][str(b)])
        log.info(line)
    log.info("wrote %s and its .png", save(res, Path(args.out), plot))


if __name__ == "__main__":
    main()
