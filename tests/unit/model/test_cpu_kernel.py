"""The C++ paged decode-attention kernel against the torch reference path."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from llama_ref import assert_same, make_llama, prompts
from velocity import LLM, SamplingParams
from velocity.model.layers.attention import AttentionMetadata, build_attn_mask, paged_attention
from velocity.engine.sampler import chattts_candidates
from velocity.model.kernels.cpu_kernels import paged_decode_kernel, sort_rows_kernel


def test_kernel_builds_on_this_machine():
    assert paged_decode_kernel() is not None, "the C++ kernel did not build (needs g++ and ninja)"


def test_kernels_run_on_every_thread():
    """Built without OpenMP, at::parallel_for quietly runs on one thread (it did, until 2026-11-24)."""
    from velocity.model.kernels.cpu_kernels import kernels
    assert kernels().built_with_openmp()


@pytest.mark.parametrize("B,Hq,Hkv,W,S", [(1, 4, 4, 3, 16), (7, 8, 2, 5, 4), (32, 12, 12, 12, 16), (3, 6, 3, 9, 1)])
def test_kernel_equals_torch_paged_attention(B, Hq, Hkv, W, S):
    g = torch.Generator().manual_seed(B * 100 + W)
    D, N = 64, 64 * W
    kc, vc = torch.randn(N + 1, S, Hkv, D, generator=g), torch.randn(N + 1, S, Hkv, D, generator=g)
    tables = torch.stack([torch.randperm(N, generator=g)[:W] for _ in range(B)])
    ctx = torch.randint(1, W * S + 1, (B,), generator=g)
    pos = ctx - 1
    slots = tables.gather(1, (pos // S)[:, None])[:, 0] * S + pos % S
    # q, k, v as the layer gives them: row slices of one [B, Hq + 2 Hkv, D] (the kernel reads strides)
    q, k, v = torch.randn(B, Hq + 2 * Hkv, D, generator=g).split([Hq, Hkv, Hkv], dim=1)
    ref_md = AttentionMetadata(slot_mapping=slots, block_tables=tables, attn_mask=build_attn_mask(pos[:, None], W * S))
    ref_caches, caches = (kc.clone(), vc.clone()), (kc.clone(), vc.clone())
    ref = paged_attention(q, k, v, *ref_caches, ref_md, D ** -0.5)
    md = AttentionMetadata(slot_mapping=slots, block_tables=tables, attn_mask=None, context_lens=ctx,
                           kernel=paged_decode_kernel())
    got = paged_attention(q, k, v, *caches, md, D ** -0.5)
    # float32 sums in another order: a few ulps of values of order 1
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-6)
    assert all(torch.equal(a, b) for a, b in zip(caches, ref_caches))      # this step's k, v written alike
    assert not torch.equal(caches[0], kc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_sequences_attention_is_the_same_alone_in_a_batch_and_on_one_thread(dtype):
    """The kernel splits each sequence's tokens into ranges by its length alone, so a sequence's
    output is bit-equal alone, beside others, and on any number of threads (float16: a
    kv_cache_dtype=float16 cache)."""
    g = torch.Generator().manual_seed(5)
    B, Hq, Hkv, D, S, W = 3, 12, 12, 64, 16, 10
    kc, vc = (torch.randn(64, S, Hkv, D, generator=g).to(dtype) for _ in range(2))
    tables = torch.stack([torch.randperm(64, generator=g)[:W] for _ in range(B)])
    ctx = torch.tensor([1, 77, 150])
    slots = tables.gather(1, ((ctx - 1) // S)[:, None])[:, 0] * S + (ctx - 1) % S
    q, k, v = torch.randn(B, Hq + 2 * Hkv, D, generator=g).split([Hq, Hkv, Hkv], dim=1)
    kernel = paged_decode_kernel()

    def run(rows):
        return kernel(q[rows], k[rows], v[rows], slots[rows], kc.clone(), vc.clone(), tables[rows], ctx[rows], D ** -0.5)

    together = run(slice(None))
    threads = torch.get_num_threads()
    try:
        for n in {1, 2, threads}:
            torch.set_num_threads(n)
            for b in range(B):
                assert torch.equal(run(slice(b, b + 1))[0], together[b]), (n, b)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("R,V,c", [(1, 626, 20), (128, 626, 20), (7, 21178, 50), (5, 3, 3), (9, 626, 626)])
def test_sort_rows_equals_numpy_sort_and_torch_topk(R, V, c):
    g = torch.Generator().manual_seed(R * V + c)
    x = torch.randn(R, V, generator=g) * 5
    if R > 4 and V > 20:                             # what logits can hold: -inf, signed zeros, ties
        x[0, :10] = float("-inf")
        x[1, 5], x[1, 6] = -0.0, 0.0
        x[2, :V // 2] = 1.5
        x[3] = torch.randn(V, generator=g) * 1e-38   # subnormals
    asc, top, ids = sort_rows_kernel()(x, c)
    assert torch.equal(asc, torch.from_numpy(np.sort(x.numpy(), axis=-1)))
    assert torch.equal(top, x.topk(c, dim=-1).values)
    assert torch.equal(x.gather(1, ids), top)
    assert all(len(set(row)) == c for row in ids.tolist())     # c distinct ids: ties are not repeated


def test_chattts_filters_same_with_the_sort_kernel():
    """The sampler's filters with the C++ sort give the same candidates as with numpy's sort and
    torch's topk (the same values; ids differ only among equal values, none here)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(128, 626, generator=g) / 0.3
    ks = torch.randint(1, 40, (128,), generator=g)
    tails = 1 - torch.rand(128, generator=g)
    want = chattts_candidates(x, ks, tails, 40)
    got = chattts_candidates(x, ks, tails, 40, sort_rows=sort_rows_kernel())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_engine_greedy_same_with_and_without_kernel(tmp_path):
    make_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2, hidden_size=128)
    ps = prompts([1, 7, 30, 65], seed=31)
    params = SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True)
    outs = []
    for use in (True, False):
        llm = LLM(str(tmp_path), device="cpu", block_size=4, num_kv_blocks=256)
        assert llm.engine.worker.runner.decode_kernel is not None
        if not use:
            llm.engine.worker.runner.decode_kernel = None
        outs.append([o.token_ids for o in llm.generate(ps, params)])
    assert_same(outs[0], outs[1], ps, "kernel vs torch path")


def test_the_build_is_cached_in_this_environment():
    """Not in ~/.cache/torch_extensions, which checkouts with other sources shared and rebuilt."""
    import sys

    from velocity.model.kernels.cpu_kernels import build_directory
    d = build_directory()
    assert d is not None and d.startswith(sys.prefix) and list(Path(d).glob("*.so")), d


WITHOUT_COMPILER = """
import logging, sys
sys.prefix = sys.argv[1]                  # a fresh cache folder: nothing built there yet
from velocity.model.kernels.cpu_kernels import paged_decode_kernel
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
sys.exit(0 if paged_decode_kernel() is None else 3)
"""


def test_without_a_compiler_the_fallback_is_a_warning_that_says_what_to_do(tmp_path):
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", WITHOUT_COMPILER, str(tmp_path)], capture_output=True, text=True,
                       env={**os.environ, "CXX": "/nonexistent/g++"}, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "WARNING C++ CPU kernels unavailable" in p.stderr and "apt-get install g++" in p.stderr


LOAD = """
import logging, time
import torch
logging.basicConfig(level=logging.INFO, format="%(message)s")
from velocity.model.kernels import cpu_kernels
t = time.perf_counter()
assert cpu_kernels.kernels() is not None
print(time.perf_counter() - t)
"""


@pytest.mark.parametrize("first_on_path", ["/usr/bin", "venv"])
def test_a_new_process_loads_the_built_kernels_without_building(first_on_path):
    """Built once (scripts/setup.sh), the kernels load in a new process from their file in well under
    a few seconds, with no build step, whichever ninja comes first on PATH (Debian's 1.11 and the
    venv's 1.13 rebuilt each other's builds: 40 s a start)."""
    import os
    import subprocess
    import sys

    from velocity.model.kernels.cpu_kernels import build_directory, kernels, module_name
    assert kernels() is not None                              # built (by setup, or now)
    so = Path(build_directory()) / f"{module_name()}.so"
    built_at = so.stat().st_mtime
    venv_bin = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p not in ("/usr/bin", venv_bin)]
    path = ["/usr/bin", venv_bin, *path] if first_on_path == "/usr/bin" else [venv_bin, "/usr/bin", *path]
    p = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PATH": os.pathsep.join(path)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert float(p.stdout.strip()) < 3.0, p.stdout
    assert "building" not in p.stderr and so.stat().st_mtime == built_at, p.stderr
