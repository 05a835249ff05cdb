#!/usr/bin/env python
"""The CPU float32 linears alone: the C++ f32_gemm (F32Linear) against oneDNN's prepacked linear
(PackedLinear), by rows a call, in paired rounds. Two sets at the release's sizes, random weights:
the GPT's 80 layer linears (a decode step at 1 row a sequence; a prefill's rows) and the vocoder's
64 ConvNeXt linears (DVAE, Decoder, Vocos: a chunk's frames). Writes
docs/benchmarks/engine_step/linears.{json,png}.

    .venv/bin/python benchmarks/bench_linears.py --rows 1,4,16,64 --rounds 4
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a file: the repository's packages

import torch
from torch import nn

from benchmarks.harness import ROOT, finish, hardware, median_ratio, paired_rounds, save
from velocity.model.kernels.cpu_kernels import kernels
from velocity.model.layers.packed_linear import F32Linear, PackedLinear

# (in, out) of each linear, as many as the release has
SETS = {"gpt": [(768, 2304), (768, 768), (768, 6144), (3072, 768)] * 20,
        "vocoder": [(256, 1024), (1024, 256)] * 12 + [(512, 2048), (2048, 512)] * 12
                   + [(512, 1536), (1536, 512)] * 8}
ARMS = ("onednn", "f32_gemm")


def timed(mods: list[nn.Module], rows: int, passes: int) -> float:
    """The best of `passes` passes over every linear, ms (the input rows random, made beforehand)."""
    xs = {m.in_features: torch.randn(rows, m.in_features) for m in mods}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(passes):
            t = time.perf_counter()
            for m in mods:
                m(xs[m.in_features])
            best = min(best, time.perf_counter() - t)
    return best * 1e3


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(res["sets"]), figsize=(5 * len(res["sets"]), 4))
    for ax, (name, s) in zip(list(axes) if len(res["sets"]) > 1 else [axes], res["sets"].items()):
        rows = [int(r) for r in s]
        ax.plot(rows, [s[str(r)]["ratio"] for r in rows], "o-")
        ax.axhline(1, color="0.6", lw=0.8)
        ax.set(xscale="log", xlabel="rows a call", ylabel="f32_gemm speed / oneDNN's (median of rounds)",
               title=f"{name}: {res['linears'][name]} linears", ylim=(0, None))
    finish(fig, path, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--sets", default="gpt,vocoder")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--passes", type=int, default=3, help="passes a round; the best counts")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "engine_step" / "linears"))
    args = ap.parse_args()
    K = kernels()
    if K is None or K.f32_gemm_lanes() == 0:
        raise SystemExit("no f32_gemm here: the C++ kernels did not build, or without AVX2 and FMA")
    torch.manual_seed(0)
    res = {"arms": list(ARMS), "rounds_each": args.rounds, "sets": {}, "linears": {},
           "hardware": hardware(threads=torch.get_num_threads())}
    for name in args.sets.split(","):
        plain = [nn.Linear(i, o) for i, o in SETS[name]]
        mods = {"onednn": [PackedLinear(m, rows_hint=8 if name == "gpt" else 128) for m in plain],
                "f32_gemm": [F32Linear(m, K) for m in plain]}
        del plain
        res["linears"][name] = len(SETS[name])
        for rows in (int(r) for r in args.rows.split(",")):
            rounds = paired_rounds(ARMS, args.rounds, lambda arm: timed(mods[arm], rows, args.passes))
            res["sets"].setdefault(name, {})[str(rows)] = {
                "rounds": rounds, **{arm: statistics.median(r[arm] for r in rounds) for arm in ARMS},
                "ratio": median_ratio(rounds, "onednn", "f32_gemm", float)}
            s = res["sets"][name][str(rows)]
            print(f"{name} rows {rows:4d}: oneDNN {s['onednn']:.2f} ms, f32_gemm {s['f32_gemm']:.2f} ms, "
                  f"{s['ratio']:.2f}x", flush=True)
    print("wrote", save(res, Path(args.out), plot))


if __name__ == "__main__":
    main()
