"""A float16 KV cache on CPU (EngineConfig.kv_cache_dtype, VELOCITY_KV_CACHE_DTYPE): the C++ kernel
and the torch path write the same rounded rows and read them as float32, the engine sizes the
cache by its bytes, and settings that cannot hold are refused with what to do."""
from __future__ import annotations

import pytest
import torch

from llama_ref import assert_same, make_llama, prompts
from velocity import LLM, SamplingParams
from velocity.config import EngineConfig
from velocity.device import kv_dtype
from velocity.model.layers.attention import AttentionMetadata, build_attn_mask, paged_attention
from velocity.model.kernels.cpu_kernels import paged_decode_kernel
from velocity.serving.settings import Settings


def case(seed: int, B: int = 5, Hq: int = 8, Hkv: int = 4, W: int = 6, S: int = 4, D: int = 64):
    g = torch.Generator().manual_seed(seed)
    N = 8 * W
    kc, vc = (torch.randn(N + 1, S, Hkv, D, generator=g) * 3 for _ in range(2))
    tables = torch.stack([torch.randperm(N, generator=g)[:W] for _ in range(B)])
    ctx = torch.randint(1, W * S + 1, (B,), generator=g)
    pos = ctx - 1
    slots = tables.gather(1, (pos // S)[:, None])[:, 0] * S + pos % S
    q, k, v = (torch.randn(B, Hq + 2 * Hkv, D, generator=g) * 3).split([Hq, Hkv, Hkv], dim=1)
    k[0, 0, :3] = torch.tensor([1e6, -1e6, 70000.0])         # past float16's range: clamped, not inf
    return q, k, v, slots, kc, vc, tables, ctx, pos


def test_the_kernel_on_a_float16_cache_is_the_kernel_on_its_rows_as_float32():
    """The rows written are rounded as torch rounds them; read back, each converts exactly, and the
    float32 arithmetic after is the same but for its order (AVX2: two sums a head, and o's rows in
    registers)."""
    q, k, v, slots, kc, vc, tables, ctx, _ = case(1)
    kernel = paged_decode_kernel()
    half = (kc.half(), vc.half())
    got = kernel(q, k, v, slots, *half, tables, ctx, 0.125)
    k16, v16 = (x.clamp(-65504, 65504).half().float() for x in (k, v))
    want_caches = (kc.half().float(), vc.half().float())
    want = kernel(q, k16, v16, slots, *want_caches, tables, ctx, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)   # float32 sums reordered; values of order 10
    assert all(torch.equal(h.float(), w) for h, w in zip(half, want_caches))   # this step's rows, rounded alike
    assert half[0].view(-1, 64)[slots[0] * 4, :3].tolist() == [65504.0, -65504.0, 65504.0]
    assert torch.isfinite(got).all()


def test_the_torch_path_writes_the_same_rows_and_attends_alike():
    q, k, v, slots, kc, vc, tables, ctx, pos = case(2)
    W, S = tables.shape[1], kc.shape[1]
    torch_caches, kernel_caches = (kc.half(), vc.half()), (kc.half(), vc.half())
    md = AttentionMetadata(slot_mapping=slots, block_tables=tables, attn_mask=build_attn_mask(pos[:, None], W * S))
    ref = paged_attention(q, k, v, *torch_caches, md, 0.125)
    md_k = AttentionMetadata(slot_mapping=slots, block_tables=tables, attn_mask=None, context_lens=ctx,
                             kernel=paged_decode_kernel())
    got = paged_attention(q, k, v, *kernel_caches, md_k, 0.125)
    assert all(torch.equal(a, b) for a, b in zip(torch_caches, kernel_caches))
    # float32 sums in another order (as test_cpu_kernel's float32 caches): values of order 10 here
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-5)


def both_paths(folder, kv_cache_dtype: str, quantize: str, budget: int, seed: int) -> tuple[list, list, list]:
    """The kernel's and the torch path's greedy runs of an engine with this KV cache: (prompts,
    [kernel outputs, torch outputs], [their workers]), each checked to leak no block."""
    ps = prompts([1, 7, 30, 65], seed=seed)
    params = SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True)
    outs, workers = [], []
    for use_kernel in (True, False):
        llm = LLM(str(folder), device="cpu", block_size=4, kv_cache_bytes=budget, quantize=quantize,
                  kv_cache_dtype=kv_cache_dtype)
        worker = llm.engine.worker
        if not use_kernel:                   # the torch path: a mask over gathered blocks
            worker.runner.decode_kernel = None
        outs.append(llm.generate(ps, params, return_hidden=True))
        assert llm.engine.block_manager.num_free_blocks == worker.num_blocks   # none leaked
        workers.append(worker)
    return ps, outs, workers


def assert_alike_until_parting(outs: list, share: float) -> None:
    """The same tokens up to where the two runs part, and the hidden states that sampled them, the
    parting one too, within share of their largest value."""
    for i, (a, b) in enumerate(zip(*outs)):
        at = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
        h, g = a.hidden[:at + 1], b.hidden[:at + 1]
        assert abs(h - g).max() <= share * abs(g).max(), f"prompt {i}: the paths' hidden states differ before token {at}"


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_the_engine_holds_twice_the_tokens_and_its_paths_agree(tmp_path, quantize):
    make_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2, hidden_size=128)
    budget = 1 << 20
    full = LLM(str(tmp_path), device="cpu", block_size=4, kv_cache_bytes=budget, quantize=quantize,
               kv_cache_dtype="float32").engine.worker
    assert full.cache.gpu[0][0].dtype == torch.float32
    ps, outs, workers = both_paths(tmp_path, "float16", quantize, budget, seed=31)
    for worker in workers:
        assert worker.cache.gpu[0][0].dtype == torch.float16
        assert worker.num_blocks == 2 * full.num_blocks
    if quantize == "none":
        assert_same(*([o.token_ids for o in out] for out in outs), ps, "float16 cache: kernel vs torch path")
        return
    # int8: the paths sum float32 in other orders (the C++ rows' RMSNorm in the compiler's vector
    # width, torch's in its own; equal on AVX2, not on AVX-512), about 3e-7 of the hidden states,
    # and now and then that moves an activation across an int8 rounding step, which moves the
    # step's hidden state by about 1% (0.5-1.1% measured on AVX-512): where a near tie then flips
    # a token the sequences part. So: the same tokens up to where they part, and the hidden states
    # that sampled them, the parting one too, within 2% of their largest value.
    assert_alike_until_parting(outs, 0.02)


def test_settings_that_cannot_hold_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="kv_cache_dtype must be 'auto', 'float32', 'float16' or 'int8', got 'int4'"):
        EngineConfig(model="x", kv_cache_dtype="int4")
    for name in ("float16", "int8"):
        with pytest.raises(ValueError, match=f"a {name} KV cache is for a float32 model on CPU.*leave the KV cache dtype at auto"):
            kv_dtype(name, torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ValueError, match="float32 KV cache is for a float32 model.*leave the KV cache dtype at auto"):
        kv_dtype("float32", torch.device("cpu"), torch.bfloat16)
    cpu = torch.device("cpu")
    assert kv_dtype("auto", cpu, torch.float32) == torch.float32
    assert kv_dtype("auto", cpu, torch.bfloat16, "none") == torch.bfloat16
    assert kv_dtype("auto", cpu, torch.float32, "int8") == torch.float16      # int8's default
    assert kv_dtype("float32", cpu, torch.float32, "int8") == torch.float32
    assert kv_dtype("float16", cpu, torch.float32) == torch.float16
    assert kv_dtype("int8", cpu, torch.float32, "int8") == torch.int8


def test_int8_takes_a_float16_cache_by_default_and_float32_stays_the_references(tmp_path):
    """auto: int8's linears already part from the reference, and a float16 cache adds no error
    measured past int8's own (docs/benchmarks.md, "A float16 KV cache on CPU"); float32 weights keep
    the model's dtype, the reference's."""
    make_llama(tmp_path)
    dtypes = {q: LLM(str(tmp_path), device="cpu", quantize=q).engine.worker.cache.gpu[0][0].dtype
              for q in ("none", "int8")}
    assert dtypes == {"none": torch.float32, "int8": torch.float16}


def test_the_setting_reaches_the_engine(monkeypatch):
    monkeypatch.setenv("VELOCITY_KV_CACHE_DTYPE", "float16")
    assert Settings.from_env().engine_config().kv_cache_dtype == "float16"
