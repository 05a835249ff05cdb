#!/usr/bin/env python
"""Engine benchmark: velocity vs transformers on a ChatTTS-size Llama body (random weights).

Same weights and requests for all: 64 requests, prompt lengths 8-64, output lengths 32-256
(end token ignored). velocity at 1, 8 and 32 concurrent requests (max_num_seqs), transformers
`generate` one request at a time, and transformers batched with left padding. Also the batch-1
decode step time of both against the memory-bandwidth bound (weight bytes / bandwidth measured
in the same run). Writes JSON and a PNG under docs/benchmarks/.

    .venv/bin/python benchmarks/bench_engine.py            # full run (~10 min on 2 CPU cores)
    .venv/bin/python benchmarks/bench_engine.py --quick    # smaller, for a smoke check
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import tempfile
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a file: the repository's packages

from benchmarks.harness import cpu_model, finish, save  # noqa: E402

import torch
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from velocity import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench_engine")


def chattts_body(path: Path, layers: int) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=21178, hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                      num_key_value_heads=12, num_hidden_layers=layers, max_position_embeddings=4096,
                      eos_token_id=None, bos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


def workload(n: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    g = torch.Generator().manual_seed(seed)
    plens = torch.randint(8, 65, (n,), generator=g).tolist()
    olens = torch.randint(32, 257, (n,), generator=g).tolist()
    prompts = [torch.randint(1, 21178, (p,), generator=g).tolist() for p in plens]
    return prompts, olens


def params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def bandwidth_gbs(device: str) -> float:
    """Read bandwidth: best of 5 sums over a 512 MiB tensor."""
    x = torch.ones(128 << 20, device=device)
    best = min(_timed(lambda: x.sum()) for _ in range(5))
    return x.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    _sync()
    t = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.no_grad()
def hf_generate(model, prompts: list[list[int]], n: int) -> None:
    """Greedy generate of exactly n tokens for a batch, left-padded."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)


def resident_gib() -> float:
    """This process's resident memory (Linux)."""
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**30


def decode_step_time(gen_n) -> float:
    """(T(n=65) - T(n=1)) / 64: per-token decode time without the prefill, median of 3."""
    return statistics.median((_timed(lambda: gen_n(65)) - _timed(lambda: gen_n(1))) / 64 for _ in range(3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 layers, fewer requests")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "engine_cpu"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_grad_enabled(False)
    layers = 4 if args.quick else 20
    n_req, n_single = (16, 4) if args.quick else (64, 8)
    prompts, olens = workload(n_req)
    dev_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    res: dict = {"hardware": {"cpu": cpu_model(), "threads": torch.get_num_threads(),
                              "device": args.device, "device_name": dev_name, "torch": torch.__version__},
                 "model": {"hidden": 768, "mlp": 3072, "heads": 12, "layers": layers, "vocab": 21178,
                           "dtype": args.dtype},
                 "workload": {"requests": n_req, "prompt_len": "8-64", "output_len": "32-256",
                              "total_output_tokens": sum(olens)}}
    with tempfile.TemporaryDirectory() as tmp:
        hf = chattts_body(Path(tmp), layers).to(args.device, getattr(torch, args.dtype))
        weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())
        res["model"]["weight_bytes"] = weight_bytes
        bw = bandwidth_gbs(args.device)
        res["bandwidth_GBs"] = bw
        log.info("weights %.0f MB, read bandwidth %.1f GB/s", weight_bytes / 1e6, bw)
        runs, steps = {}, {}

        # transformers, one request at a time (a subset: it is slow)
        t = time.perf_counter()
        for p, n in tqdm(list(zip(prompts, olens))[:n_single], desc="transformers 1-at-a-time"):
            hf_generate(hf, [p], n)
        runs["transformers_one_at_a_time"] = sum(olens[:n_single]) / (time.perf_counter() - t)
        # transformers, padded batches of 32 (each batch runs to its longest output)
        bs = min(32, n_req)
        t = time.perf_counter()
        for i in tqdm(range(0, n_req, bs), desc="transformers padded batches"):
            hf_generate(hf, prompts[i:i + bs], max(olens[i:i + bs]))
        runs["transformers_padded_b32"] = sum(olens) / (time.perf_counter() - t)

        cuda = args.device.startswith("cuda")
        # CUDA: graphs against eager at 32. CPU float32: oneDNN-prepacked weights (the default)
        # against plain nn.Linear at every level.
        extra = [(32, True, True)] if cuda else [(c, False, False) for c in (1, 8, 32)] if args.dtype == "float32" else []
        for c, eager, packed in [(1, False, True), (8, False, True), (32, False, True)] + extra:
            llm = LLM(tmp, device=args.device, dtype=args.dtype, max_num_seqs=c, block_size=16, num_kv_blocks=2048,
                      enforce_eager=eager, pack_cpu_weights=packed)
            sub = n_single if c == 1 else n_req
            llm.generate([prompts[0]], params(4))                     # warm up
            t = time.perf_counter()
            llm.generate(prompts[:sub], [params(n) for n in olens[:sub]], use_tqdm=True)
            name = f"velocity_c{c}" + ("_eager" if eager else "") + ("" if packed else "_unpacked")
            runs[name] = sum(olens[:sub]) / (time.perf_counter() - t)
            if c == 1:
                steps[name] = decode_step_time(lambda n, llm=llm: llm.generate([prompts[0]], params(n)))
            del llm
            gc.collect()
            log.info("%s: resident %.2f GiB after", name, resident_gib())
        v_step = steps["velocity_c1"]
        h_step = decode_step_time(lambda n: hf_generate(hf, [prompts[0]], n))

    bound = weight_bytes / (bw * 1e9)
    res["tokens_per_s"] = runs
    res["ratios"] = {
        "velocity_c32_vs_transformers_one_at_a_time": runs["velocity_c32"] / runs["transformers_one_at_a_time"],
        "velocity_c32_vs_transformers_padded_b32": runs["velocity_c32"] / runs["transformers_padded_b32"],
        "velocity_c8_vs_transformers_one_at_a_time": runs["velocity_c8"] / runs["transformers_one_at_a_time"],
        "velocity_c1_vs_transformers_one_at_a_time": runs["velocity_c1"] / runs["transformers_one_at_a_time"],
    }
    if "velocity_c32_unpacked" in runs:
        res["ratios"] |= {f"velocity_c{c}_packed_vs_unpacked": runs[f"velocity_c{c}"] / runs[f"velocity_c{c}_unpacked"]
                          for c in (1, 8, 32)}
        res["ratios"]["velocity_c32_vs_c1"] = runs["velocity_c32"] / runs["velocity_c1"]
        res["ratios"]["velocity_c32_vs_c1_unpacked"] = runs["velocity_c32_unpacked"] / runs["velocity_c1_unpacked"]
    if "velocity_c32_eager" in runs:
        res["ratios"]["velocity_c32_cuda_graphs_vs_eager"] = runs["velocity_c32"] / runs["velocity_c32_eager"]
    res["batch1_decode"] = {
        "velocity_ms": v_step * 1e3, "transformers_ms": h_step * 1e3, "bandwidth_bound_ms": bound * 1e3,
        "velocity_vs_transformers": v_step / h_step,
        "velocity_fraction_of_bound": bound / v_step, "transformers_fraction_of_bound": bound / h_step,
        "velocity_implied_GBs": weight_bytes / v_step / 1e9,
    }
    if "velocity_c1_unpacked" in steps:
        res["batch1_decode"]["velocity_unpacked_ms"] = steps["velocity_c1_unpacked"] * 1e3
    out = Path(args.out)
    save(res, out, plot)
    log.info(json.dumps({k: res[k] for k in ("tokens_per_s", "ratios", "batch1_decode")}, indent=2))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    runs = res["tokens_per_s"]
    names = list(runs)
    colors = ["#999999" if n.startswith("transformers") else "#aec7e8" if n.endswith("_unpacked") else "#1f77b4"
              for n in names]
    a.bar(range(len(names)), [runs[n] for n in names], color=colors)
    a.set_xticks(range(len(names)), [n.replace("_", "\n", 1).replace("_unpacked", "\nunpacked") for n in names],
                 fontsize=8)
    a.set_ylabel("output tokens / s")
    a.set_title(f"Throughput, {res['workload']['requests']} requests, {res['model']['layers']}-layer body")
    for i, n in enumerate(names):
        a.text(i, runs[n], f"{runs[n]:.0f}", ha="center", va="bottom", fontsize=8)
    d = res["batch1_decode"]
    keys = ["bandwidth_bound_ms", "velocity_ms", "transformers_ms"]
    b.bar(range(3), [d[k] for k in keys], color=["#2ca02c", "#1f77b4", "#999999"])
    b.set_xticks(range(3), ["bandwidth\nbound", "velocity", "transformers"])
    b.set_ylabel("ms per decode step (batch 1)")
    b.set_title(f"Batch-1 decode vs bound ({res['bandwidth_GBs']:.1f} GB/s read)")
    for i, k in enumerate(keys):
        b.text(i, d[k], f"{d[k]:.1f}", ha="center", va="bottom", fontsize=8)
    hw = res["hardware"]
    where = hw.get("device_name") if hw["device"] != "cpu" else f"cpu ({hw['threads']} threads)"
    fig.suptitle(f"velocity engine on {where}, {res['model']['dtype']}")
    finish(fig, path, res)


if __name__ == "__main__":
    main()
