"""Greedy ids from velocity == greedy ids from transformers.generate, vLLM's way."""
from __future__ import annotations

import pytest
import torch

from llama_ref import VOCAB, assert_same, hf_greedy, make_llama, prompts
from velocity import LLM, SamplingParams

N = 24                                          # new tokens per prompt
LENGTHS = [1, 3, 9, 16, 17, 31, 48, 70, 100]   # mixed, several longer than many blocks


def greedy(n=N, **kw):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def mha(tmp_path_factory):
    path = tmp_path_factory.mktemp("mha")
    model = make_llama(path)
    ps = prompts(LENGTHS)
    return path, model, ps, [hf_greedy(model, p, N) for p in ps]


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    path = tmp_path_factory.mktemp("gqa")
    model = make_llama(path, seed=3, num_attention_heads=8, num_key_value_heads=2, hidden_size=128,
                       rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    ps = prompts(LENGTHS, seed=5)
    return path, model, ps, [hf_greedy(model, p, N) for p in ps]


def run(path, ps, params=None, **kw):
    kw.setdefault("device", "cpu")
    llm = LLM(str(path), **kw)
    outs = llm.generate(ps, params or greedy())
    return [o.token_ids for o in outs], llm.engine


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_batch_equals_transformers(mha, block_size, prefix_caching):
    path, _, ps, refs = mha
    ours, engine = run(path, ps, block_size=block_size, num_kv_blocks=4096 // block_size,
                       enable_prefix_caching=prefix_caching)
    assert_same(ours, refs, ps, f"block_size={block_size} prefix_caching={prefix_caching}")
    assert engine.block_manager.num_used_blocks == 0


def test_gqa_equals_transformers(gqa):
    path, _, ps, refs = gqa
    ours, _ = run(path, ps, block_size=16, num_kv_blocks=256)
    assert_same(ours, refs, ps, "GQA")


@pytest.mark.parametrize("linears", ["f32_gemm", "onednn", "plain"])
def test_cpu_linears_packed_or_plain_equal_transformers(mha, linears):
    """CPU float32 runs on the C++ f32_gemm by default where it is built (so every test here covers
    it), on oneDNN-prepacked weights without the C++ kernels; plain nn.Linear stays available and
    exact too."""
    from torch import nn
    from velocity.model.kernels.cpu_kernels import kernels
    from velocity.model.layers.packed_linear import F32Linear, PackedLinear
    if linears == "f32_gemm" and not (kernels() and kernels().f32_gemm_lanes()):
        pytest.skip("the C++ kernels are built without AVX2 and FMA here: no f32_gemm")
    path, _, ps, refs = mha
    ours, engine = run(path, ps, block_size=16, num_kv_blocks=256, pack_cpu_weights=linears != "plain",
                       cpu_kernel=linears != "onednn")
    kinds = {type(m) for m in engine.worker.model.modules()} & {F32Linear, PackedLinear, nn.Linear}
    assert kinds == {{"f32_gemm": F32Linear, "onednn": PackedLinear, "plain": nn.Linear}[linears]}
    assert_same(ours, refs, ps, f"linears={linears}")


def test_one_at_a_time_equals_batched(mha):
    path, _, ps, refs = mha
    llm = LLM(str(path), device="cpu", block_size=8, num_kv_blocks=512)
    single = [llm.generate([p], greedy())[0].token_ids for p in ps]
    batched = [o.token_ids for o in llm.generate(ps, greedy())]
    assert_same(single, refs, ps, "one at a time")
    assert_same(batched, single, ps, "batched vs one at a time")


def test_prefills_join_running_decodes(mha):
    """max_num_seqs=3 and different lengths: new prefills enter steps that also decode."""
    path, model, ps, _ = mha
    ns = [5, 30, 12, 8, 24, 3, 17, 9, 20]
    refs = [hf_greedy(model, p, n) for p, n in zip(ps, ns)]
    llm = LLM(str(path), device="cpu", block_size=4, num_kv_blocks=512, max_num_seqs=3)
    ours = [o.token_ids for o in llm.generate(ps, [greedy(n) for n in ns])]
    assert_same(ours, refs, ps, "mixed prefill/decode")


def test_shared_prefixes_hit_the_prefix_cache(mha, tmp_path):
    path, model, _, _ = mha
    ps = prompts([2, 7, 15, 20], seed=9, prefix=prompts([40], seed=8)[0])
    refs = [hf_greedy(model, p, N) for p in ps]
    llm = LLM(str(path), device="cpu", block_size=8, num_kv_blocks=512, enable_prefix_caching=True)
    first = [o.token_ids for o in llm.generate(ps[:1], greedy())]
    rest = [o.token_ids for o in llm.generate(ps[1:], greedy())]       # their prefix is cached now
    assert llm.engine.block_manager.num_prefix_hits >= 3 * 5          # 40 tokens = 5 blocks each
    assert_same(first + rest, refs, ps, "shared prefix")
    again = [o.token_ids for o in llm.generate(ps, greedy())]           # whole prompts cached
    assert_same(again, refs, ps, "cached again")


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_tiny_cache_forces_preemption(mha, mode):
    path, _, ps, refs = mha
    ours, engine = run(path, ps, block_size=4, num_kv_blocks=48, preemption_mode=mode,
                       swap_space_bytes=64 << 20)
    assert engine.scheduler.num_preemptions > 0
    assert_same(ours, refs, ps, f"preemption by {mode}")
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                                  {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                                   "rope_theta": 50000.0}])
def test_rope_scaling_and_tied_embeddings(tmp_path, rope):
    model = make_llama(tmp_path, seed=11, rope_parameters=rope, tie_word_embeddings=True)
    ps = prompts([5, 60, 90], seed=12)
    refs = [hf_greedy(model, p, N) for p in ps]
    ours, _ = run(tmp_path, ps, block_size=16, num_kv_blocks=64)
    assert_same(ours, refs, ps, f"rope {rope['rope_type']}")


@torch.no_grad()
def test_first_step_logits_within_1e_4(mha):
    path, model, ps, _ = mha
    llm = LLM(str(path), device="cpu", block_size=16, num_kv_blocks=256)
    eng = llm.engine
    for i, p in enumerate(ps):
        eng.add_request(str(i), p, greedy())
    sched = eng.scheduler.schedule()
    hidden = eng.worker.runner.run(sched.seqs)            # one mixed-length prefill batch
    logits = eng.worker.model.heads["text"].fn(hidden)[:, 0]
    for i, p in enumerate(ps):
        ref = model(torch.tensor([p])).logits[0, -1]
        err = (logits[i] - ref).abs().max().item()
        assert err < 1e-4, f"prompt {i} (len {len(p)}): max |logit diff| {err:.2e}"


def test_eos_and_stop_tokens_end_a_request(mha):
    path, _, ps, refs = mha
    llm = LLM(str(path), device="cpu", block_size=16, num_kv_blocks=256)
    stop = refs[2][5]
    first = refs[2].index(stop)
    out = llm.generate([ps[2]], greedy(stop_token_ids=[stop]))[0]
    assert out.finish_reason == "stop" and out.token_ids == refs[2][:first + 1]
    out = llm.generate([ps[2]], greedy(n=7))[0]
    assert out.finish_reason == "length" and out.token_ids == refs[2][:7]


def test_bad_requests_get_clear_errors(mha):
    path, _, ps, _ = mha
    llm = LLM(str(path), device="cpu", block_size=16, num_kv_blocks=64, max_model_len=128)
    with pytest.raises(ValueError, match="prompt length 200 must be below max_model_len=128"):
        llm.generate([list(range(200))], greedy())
    with pytest.raises(ValueError, match=rf"prompt token ids must be integers in \[0, {VOCAB}\)"):
        llm.generate([[1, VOCAB]], greedy())
    with pytest.raises(ValueError, match="at least one token"):
        llm.generate([[]], greedy())
    assert llm.generate([ps[1]], greedy(n=3))[0].finish_reason == "length"   # still serving
