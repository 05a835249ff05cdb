#!/usr/bin/env python
"""The CPU linears alone, by rows a call, in paired rounds: float32, the C++ f32_gemm (F32Linear)
against oneDNN's prepacked linear (PackedLinear); `--kind int8`, the C++ int8_gemm against
fbgemm's op (Int8Linear on either, its rows scaled as the layer scales them). Two sets at the
release's sizes, random weights: the GPT's 80 layer linears (a decode step at 1 row a sequence; a
prefill's rows) and the vocoder's 64 ConvNeXt linears (DVAE, Decoder, Vocos: a chunk's frames).
Each arm's multiply-adds a second say how near it runs to the CPU's arithmetic at many rows.
Writes docs/benchmarks/engine_step/linears.{json,png} (int8: linears_int8).

    .venv/bin/python benchmarks/bench_linears.py --rows 1,4,16,64 --rounds 4
    .venv/bin/python benchmarks/bench_linears.py --kind int8 --sets gpt --rows 1,8,32,64
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
from velocity.model.layers.int8_linear import Int8Linear, activation_bits
from velocity.model.layers.packed_linear import F32Linear, PackedLinear

# (in, out) of each linear, as many as the release has
SETS = {"gpt": [(768, 2304), (768, 768), (768, 6144), (3072, 768)] * 20,
        "vocoder": [(256, 1024), (1024, 256)] * 12 + [(512, 2048), (2048, 512)] * 12
                   + [(512, 1536), (1536, 512)] * 8}
KINDS = {"float32": ("onednn", "f32_gemm"), "int8": ("fbgemm", "int8_gemm")}     # (baseline, C++ kernel)


def arms_of(kind: str, plain: list[nn.Linear], K, gpt: bool) -> dict[str, list[nn.Module]]:
    """Each arm's linears, made from the same float32 ones."""
    if kind == "int8":
        return {"fbgemm": [Int8Linear(m) for m in plain], "int8_gemm": [Int8Linear(m, kernels=K) for m in plain]}
    return {"onednn": [PackedLinear(m, rows_hint=8 if gpt else 128) for m in plain],
            "f32_gemm": [F32Linear(m, K) for m in plain]}


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
        base, arm = res["arms"]
        ax.set(xscale="log", xlabel="rows a call", ylabel=f"{arm} speed / {base}'s (median of rounds)",
               title=f"{name}: {res['linears'][name]} linears", ylim=(0, None))
    finish(fig, path, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--sets", default="gpt,vocoder")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--passes", type=int, default=3, help="passes a round; the best counts")
    ap.add_argument("--kind", choices=tuple(KINDS), default="float32")
    ap.add_argument("--out", default=None, help="default: docs/benchmarks/engine_step/linears (int8: linears_int8)")
    args = ap.parse_args()
    K = kernels()
    ARMS = KINDS[args.kind]
    base, arm = ARMS
    if K is None or (K.int8_gemm_bits() != activation_bits() if args.kind == "int8" else K.f32_gemm_lanes() == 0):
        raise SystemExit(f"no {arm} here: the C++ kernels did not build, or without the instructions it needs")
    out = args.out or str(ROOT / "docs" / "benchmarks" / "engine_step" / ("linears_int8" if args.kind == "int8" else "linears"))
    torch.manual_seed(0)
    res = {"kind": args.kind, "arms": list(ARMS), "rounds_each": args.rounds, "sets": {}, "linears": {},
           "hardware": hardware(threads=torch.get_num_threads())}
    for name in args.sets.split(","):
        plain = [nn.Linear(i, o) for i, o in SETS[name]]
        mods = arms_of(args.kind, plain, K, name == "gpt")
        del plain
        res["linears"][name] = len(SETS[name])
        macs = sum(i * o for i, o in SETS[name])
        for rows in (int(r) for r in args.rows.split(",")):
            rounds = paired_rounds(ARMS, args.rounds, lambda a: timed(mods[a], rows, args.passes))
            s = res["sets"].setdefault(name, {})[str(rows)] = {
                "rounds": rounds, **{a: statistics.median(r[a] for r in rounds) for a in ARMS},
                "ratio": median_ratio(rounds, base, arm, float)}
            s["gmacs"] = {a: rows * macs / s[a] / 1e6 for a in ARMS}          # multiply-adds a second, G
            print(f"{name} rows {rows:4d}: {base} {s[base]:.2f} ms, {arm} {s[arm]:.2f} ms, {s['ratio']:.2f}x; "
                  f"{arm} {s['gmacs'][arm]:.0f} G multiply-adds a second", flush=True)
    print("wrote", save(res, Path(out), plot))


if __name__ == "__main__":
    main()
