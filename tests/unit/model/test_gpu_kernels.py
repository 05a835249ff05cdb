"""The Triton kernels of the GPU decoder layer (velocity/model/kernels/gpu_kernels.py) against the eager torch
code they replace. On a CUDA GPU they run compiled; on a CPU with Triton installed (not in make test:
Triton is a GPU package) under Triton's interpreter. Skipped, with the reason shown by -ra, where
neither is there.

Tolerances: float32 differs from eager only in the order of sums (1e-5 relative); in bfloat16 a sum
summed in another order may round its last bit the other way: one bfloat16 ulp (2**-7 relative at
most). Decode attention in bfloat16 is held to float32 attention on the same rounded inputs (the
kernel computes in float32 and rounds once), not to bfloat16 SDPA, which rounds its scores too."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")       # read when the kernels are defined

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                 reason="needs Triton (a CUDA machine, or TRITON_INTERPRET=1 with triton installed)")]
DEV = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]


def kernels():
    from velocity.model.kernels import gpu_kernels
    assert gpu_kernels.load() is not None
    return gpu_kernels


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_equals_eager(dtype):
    from velocity.model.networks.llama import RMSNorm
    K = kernels()
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(5, 96, generator=g).to(DEV, dtype) for _ in range(2))
    norm = RMSNorm(96, 1e-6).to(DEV, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=g))
        out, res = K.add_rms_norm(x, r, norm.weight, 1e-6)
        assert torch.equal(res, x + r)                    # one rounding, as torch's add
        close(out, norm(x + r), dtype)
        out, res = K.add_rms_norm(x, None, norm.weight, 1e-6)
        assert res is x
        close(out, norm(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_store_equals_rotate_and_cache_write(dtype):
    from velocity.model.networks.llama import rotate
    K = kernels()
    T, Hq, Hkv, D, N, S = 6, 4, 2, 16, 8, 4
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=g).to(DEV, dtype)
    cos, sin = (torch.randn(40, D, generator=g).to(DEV, dtype) for _ in range(2))
    # positions and slots as columns of one buffer, as a CUDA graph's inputs are (strided)
    cols = torch.zeros(T, 5, dtype=torch.long)
    cols[:, 1] = torch.tensor([0, 3, 7, 39, 12, 5])
    cols[:, 3] = torch.randperm(N * S, generator=g)[:T]
    cols = cols.to(DEV)
    pos, slots = cols[:, 1], cols[:, 3]
    kc, vc = (torch.zeros(N, S, Hkv, D, device=DEV, dtype=dtype) for _ in range(2))
    want = qkv.clone()
    K.rope_store(qkv, pos, cos, sin, slots, kc, vc, Hq)
    qk = rotate(want[:, :(Hq + Hkv) * D].view(T, Hq + Hkv, D), cos[pos][:, None], sin[pos][:, None])
    close(qkv[:, :Hq * D].view(T, Hq, D), qk[:, :Hq], dtype)
    close(kc.view(N * S, Hkv, D)[slots], qk[:, Hq:], dtype)
    assert torch.equal(vc.view(N * S, Hkv, D)[slots], want[:, (Hq + Hkv) * D:].view(T, Hkv, D))
    assert torch.equal(qkv[:, Hq * D:], want[:, Hq * D:])          # k and v are left as they were


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 2)])
@pytest.mark.parametrize("one_part", [False, True])
@pytest.mark.parametrize("mha_rows", [1, 64])
def test_paged_decode_equals_gather_and_sdpa(dtype, heads, one_part, mha_rows, monkeypatch):
    """Both kernels (without GQA, _decode_mha_kernel from MHA_ROWS rows on), split and whole."""
    from velocity.model.layers.attention import AttentionMetadata, build_attn_mask, paged_attention
    K = kernels()
    monkeypatch.setattr(K, "MHA_ROWS", mha_rows)
    if one_part:                               # one part a row: no combine
        monkeypatch.setattr(K, "SPLIT", 1024)
    Hq, Hkv = heads
    D, S, N = 16, 16, 64
    lens = [1, 17, 300, 64, 513]                # across blocks and the 256-token parts
    B = len(lens)
    W = -(-max(lens) // S)
    g = torch.Generator().manual_seed(2)
    kc, vc = (torch.randn(N, S, Hkv, D, generator=g).to(DEV, dtype) for _ in range(2))
    tables = torch.stack([torch.randperm(N, generator=g)[:W] for _ in range(B)]).to(DEV)
    qkv = torch.randn(B, (Hq + 2 * Hkv) * D, generator=g).to(DEV, dtype)
    q = qkv[:, :Hq * D]                         # a view with the qkv buffer's row stride
    ctx = torch.tensor(lens, device=DEV)
    got = K.paged_decode(q, kc, vc, tables, ctx, D ** -0.5, W * S)
    # the eager path in float32 on the same (rounded) inputs; it writes this step's k, v first:
    # give it the cached ones at the last position
    pos = ctx - 1
    slot = tables.gather(1, (pos // S)[:, None])[:, 0] * S + pos % S
    kf, vf = kc.float(), vc.float()
    k_new, v_new = kf.view(N * S, Hkv, D)[slot], vf.view(N * S, Hkv, D)[slot]
    md = AttentionMetadata(slot_mapping=slot, block_tables=tables, attn_mask=build_attn_mask(pos[:, None], W * S))
    want = paged_attention(q.float().reshape(B, Hq, D), k_new, v_new, kf, vf, md, D ** -0.5)
    close(got, want, dtype)
    # a row's result is its own: alone, or in a grid sized for longer contexts, bit for bit
    assert torch.equal(K.paged_decode(q[2:3], kc, vc, tables[2:3], ctx[2:3], D ** -0.5, 4 * W * S), got[2:3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_equals_eager(dtype):
    K = kernels()
    x = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(3)).to(DEV, dtype)
    gate, up = x.split(1500, dim=-1)
    close(K.silu_and_mul(x), F.silu(gate) * up, dtype)


def test_engine_on_the_kernels_equals_transformers_and_eager(tmp_path):
    """The whole decoder on the kernels (prefill through rope_store and the gathered attention,
    decodes on paged_decode), float32: greedy ids equal transformers' and the eager layer's.
    On CUDA, through the CUDA graphs too."""
    from llama_ref import assert_same, hf_greedy, make_llama, prompts
    from velocity import LLM, SamplingParams

    model = make_llama(tmp_path, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    ps = prompts([3, 17, 40, 90, 1], seed=6)
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    refs = [hf_greedy(model, p, 24) for p in ps]
    kw = dict(device=DEV, dtype="float32", block_size=16, num_kv_blocks=128, max_num_seqs=8, cpu_kernel=False)
    if CUDA:
        torch.backends.cuda.matmul.allow_tf32 = False
    outs = {}
    for on in (True, False):
        llm = LLM(str(tmp_path), gpu_kernels=on, **kw)
        assert (llm.engine.worker.model.model.kernels is not None) is on
        assert llm.engine.worker.runner.by_length is on
        if CUDA and on:
            assert {w for _, w in llm.engine.worker.runner.graphs} == {1024 // 16}    # one width
        outs[on] = [o.token_ids for o in llm.generate(ps, params)]
    assert_same(outs[True], refs, ps, "the GPU kernels vs transformers")
    assert_same(outs[True], outs[False], ps, "the GPU kernels vs the eager layer")


def test_chattts_frames_on_the_kernels_equal_the_reference(tmp_path):
    """ChatTTS's four-codebook frames with speakers on the kernels and the fused code heads, float32:
    greedy frames equal the plain CPU reference's."""
    from chattts_ref import RefChatTTS
    from velocity import LLM, SamplingParams
    from checkpoints import tiny_checkpoint

    if CUDA:
        torch.backends.cuda.matmul.allow_tf32 = False
    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=0)
    ref = RefChatTTS(ckpt)
    ps = [ref.ids(f"[Stts][spk_emb][speed_5]{t}[Ptts]") for t in ("hello world this is speech", "你好世界", "a")]
    g = torch.Generator().manual_seed(3)
    spk = [torch.randn(64, generator=g) for _ in ps]
    llm = LLM(str(ckpt), device=DEV, dtype="float32", block_size=16, num_kv_blocks=256, max_num_seqs=4,
              cpu_kernel=False)
    assert llm.engine.worker.model.head_code_fused is not None
    got = [o.token_ids for o in llm.generate(ps, SamplingParams(temperature=0.0, max_new_tokens=12), speakers=spk)]
    for i, (p, s) in enumerate(zip(ps, spk)):
        want = ref.greedy_frames(p, 12, s)
        assert got[i] == want, f"prompt {i}:\n velocity:  {got[i]}\n reference: {want}"
