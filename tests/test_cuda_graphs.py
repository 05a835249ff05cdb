"""CUDA-graph decode == eager decode. Needs a CUDA GPU; skipped (with the reason shown by -ra) without one."""
from __future__ import annotations

import pytest
import torch

from llama_ref import assert_same, hf_greedy, make_llama, prompts
from velocity import LLM, SamplingParams

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")]


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graph_decode_equals_eager(tmp_path, dtype):
    make_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2, hidden_size=128)
    ps = prompts([1, 5, 17, 33, 64, 2, 9, 40, 3, 70, 12], seed=4)   # 11: padded up to the 16 graph
    outs = {}
    for eager in (True, False):
        llm = LLM(str(tmp_path), device="cuda", dtype=dtype, block_size=16, num_kv_blocks=512,
                  max_num_seqs=16, enforce_eager=eager)
        assert bool(llm.engine.worker.runner.graphs) is not eager
        outs[eager] = [o.token_ids for o in llm.generate(ps, greedy(32))]
        # batches of every size 1..11 replay graphs as requests finish at different times
        outs[eager, "mixed"] = [o.token_ids for o in llm.generate(ps, [greedy(4 + 3 * i) for i in range(len(ps))])]
    assert_same(outs[False], outs[True], ps, f"CUDA graphs vs eager ({dtype})")
    assert_same(outs[False, "mixed"], outs[True, "mixed"], ps, f"CUDA graphs vs eager, staggered ({dtype})")


def test_cuda_float32_equals_transformers(tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    model = make_llama(tmp_path)
    ps = prompts([3, 17, 40, 90], seed=6)
    refs = [hf_greedy(model, p, 24) for p in ps]
    llm = LLM(str(tmp_path), device="cuda", dtype="float32", block_size=16, num_kv_blocks=256, max_num_seqs=8)
    assert_same([o.token_ids for o in llm.generate(ps, greedy(24))], refs, ps, "CUDA graphs fp32 vs transformers")
