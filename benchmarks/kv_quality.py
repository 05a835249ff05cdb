#!/usr/bin/env python
"""What a float16 or int8 KV cache (VELOCITY_KV_CACHE_DTYPE) does to a real model's output.

SmolLM2-135M (benchmarks.smollm) through velocity's own engine on CPU, greedy, on the English
sentences of benchmarks/texts.txt: each text's first 8 tokens as the prompt, then 48 new tokens.
Arms: float32 weights and int8 (VELOCITY_QUANTIZE), each with the model's float32 cache, a
float16 one and an int8 one. Each smaller cache is compared with the same weights' float32 cache,
and int8 with float32 beside them, for scale (int8's rows move a whole rounding step where an
input moves by float rounding, so its output follows any small change far: what int8 with a
smaller cache is to float32 says whether the cache adds to int8's own error):
- the texts whose 48 tokens are all the same;
- the new tokens that match before the first difference, as a share of all;
- the largest difference of the last hidden state over the matching tokens, relative to its size.
Writes docs/benchmarks/kv_cache/quality.{json,png}.

    .venv/bin/python benchmarks/kv_quality.py
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a file: the repository's packages

import numpy as np

from benchmarks.harness import bench_texts, finish, hardware, save
from benchmarks.smollm import write_llama_folder
from velocity import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("kv_quality")
ARMS = {"float32": ("none", "float32"), "float32, float16 cache": ("none", "float16"),
        "float32, int8 cache": ("none", "int8"), "int8": ("int8", "float32"),
        "int8, float16 cache": ("int8", "float16"), "int8, int8 cache": ("int8", "int8")}
PAIRS = [("float32, float16 cache", "float32"), ("float32, int8 cache", "float32"), ("int8", "float32"),
         ("int8, float16 cache", "float32"), ("int8, int8 cache", "float32"), ("int8, float16 cache", "int8"),
         ("int8, int8 cache", "int8")]


def compare(a: list, b: list) -> dict:
    """a, b: per text (token ids, hidden [n, H]) -> how far a's output is b's."""
    same, kept, total, rel = 0, 0, 0, 0.0
    for (ta, ha), (tb, hb) in zip(a, b):
        n = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta))
        same += n == len(ta)
        kept += n
        total += len(ta)
        if n:
            d = np.abs(ha[:n] - hb[:n]).max(axis=1) / np.abs(hb[:n]).max(axis=1)
            rel = max(rel, float(d.max()))
    return {"texts_all_same": same, "texts": len(a), "tokens_before_first_difference": kept / total,
            "hidden_max_relative_difference": rel}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "kv_cache" / "quality"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_llama_folder(Path(tmp) / "smollm2")
        tok = AutoTokenizer.from_pretrained(folder)
        texts = [t for t in bench_texts() if t.isascii()]
        prompts = [tok(t)["input_ids"][:args.prompt_tokens] for t in texts]
        params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True)
        outs = {}
        for name, (quantize, kv) in ARMS.items():
            llm = LLM(str(folder), device="cpu", quantize=quantize, kv_cache_dtype=kv)
            outs[name] = [(o.token_ids, o.hidden) for o in llm.generate(prompts, params, return_hidden=True)]
            del llm
    res = {"model": "SmolLM2-135M-Instruct (Q4_1 dequantized to float32)", "texts": len(prompts),
           "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
           "pairs": {f"{a} against {b}": compare(outs[a], outs[b]) for a, b in PAIRS}, "hardware": hardware()}
    for k, v in res["pairs"].items():
        log.info("%-40s all same %d/%d, tokens before the first difference %.3f, hidden %.1e", k,
                 v["texts_all_same"], v["texts"], v["tokens_before_first_difference"],
                 v["hidden_max_relative_difference"])
    log.info("wrote %s", save(res, Path(args.out), plot))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["pairs"])
    fig, ax = plt.subplots(figsize=(8.5, 4.4))
    shares = [res["pairs"][n]["tokens_before_first_difference"] for n in names]
    ax.barh(names, shares, color=["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c"])
    for i, s in enumerate(shares):
        ax.text(s, i, f" {s:.3f}", va="center")
    ax.set_xlim(0, 1.12)
    ax.set_xlabel(f"tokens before the first difference (share of {res['new_tokens']} a text, {res['texts']} texts)")
    ax.set_title("float16 and int8 KV caches, and int8: greedy output against another arm (SmolLM2-135M)", fontsize=10)
    ax.invert_yaxis()
    finish(fig, path, res)


if __name__ == "__main__":
    main()
