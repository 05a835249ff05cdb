"""PackedLinear (oneDNN-prepacked CPU weights) and F32Linear (the C++ f32_gemm) against nn.Linear."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from velocity.model.layers.packed_linear import F32Linear, PackedLinear, can_pack, pack_linears

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 17, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_nn_linear(rows, bias):
    torch.manual_seed(rows)
    lin = nn.Linear(768, 3072, bias=bias)
    x = torch.randn(rows, 768)
    with torch.inference_mode():
        want, got = lin(x), PackedLinear(lin)(x)
    assert got.shape == want.shape
    # float32 sums of 768 products in another order: |error| ~ sqrt(768) * 2^-24 * sum|x*w| ~ 1e-5 here
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def cpp():
    from velocity.model.kernels.cpu_kernels import kernels

    k = kernels()
    assert k is not None, "the C++ kernels did not build (python -m velocity.model.kernels.cpu_kernels says why)"
    return k


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 12, 13, 63])
@pytest.mark.parametrize("shape", [(768, 3072), (3072, 768), (768, 2504), (37, 21)])
@pytest.mark.parametrize("bias", [True, False])
def test_f32_gemm_matches_nn_linear(cpp, rows, shape, bias):
    """Every tile size of the kernel (one row; 2 to kRows rows sharing a load; a remainder), an
    output width not a multiple of 16 (the code heads' 4 x 626; its zero rows never show), an odd
    input width. Float32 sums of up to 3072 products in another order: ~sqrt(K) 2^-24 sum|x w|,
    about 1e-5 here at most."""
    if cpp.f32_gemm_lanes() == 0:
        pytest.skip("the C++ kernels are built without AVX2 and FMA here: F32Linear is not used")
    torch.manual_seed(rows)
    lin = nn.Linear(*shape, bias=bias)
    x = torch.randn(rows, shape[0])
    with torch.inference_mode():
        want, got = lin(x), F32Linear(lin, cpp)(x.view(1, rows, -1))
    assert got.shape == (1, *want.shape)
    torch.testing.assert_close(got[0], want, rtol=2e-5, atol=2e-5)


def test_f32_gemm_gives_a_row_the_same_output_alone_or_in_any_batch(cpp):
    """Each output is one chain of multiply-adds in input order, whatever tile its row falls in:
    bit for bit the same alone, in a full tile, or as a remainder (13 rows: 12 + 1 or 6 + 6 + 1)."""
    if cpp.f32_gemm_lanes() == 0:
        pytest.skip("the C++ kernels are built without AVX2 and FMA here: F32Linear is not used")
    torch.manual_seed(0)
    f = F32Linear(nn.Linear(768, 2304, bias=False), cpp)
    x = torch.randn(13, 768)
    with torch.inference_mode():
        whole = f(x)
        for i in (0, 5, 6, 12):
            assert torch.equal(f(x[i:i + 1]), whole[i:i + 1]), i
        assert torch.equal(f(x[3:10]), whole[3:10])


def test_f32_gemm_refuses_a_layout_that_does_not_fit(cpp):
    if cpp.f32_gemm_lanes() == 0:
        pytest.skip("the C++ kernels are built without AVX2 and FMA here: F32Linear is not used")
    f = F32Linear(nn.Linear(32, 40), cpp)                                   # 3 blocks of 16
    with pytest.raises(RuntimeError, match="K = x's columns"):
        f.gemm(torch.randn(2, 31), f.packed, f.bias, 40)
    with pytest.raises(RuntimeError, match=r"ceil\(N / 16\)"):
        f.gemm(torch.randn(2, 32), f.packed, f.bias, 32)                    # 2 blocks would do
    with pytest.raises(RuntimeError, match="bias"):
        f.gemm(torch.randn(2, 32), f.packed, torch.zeros(7), 40)


def test_pack_linears_uses_f32_gemm_where_it_is_built(cpp):
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 8))
    assert pack_linears(model, cpp) == 2
    want = F32Linear if cpp.f32_gemm_lanes() else PackedLinear
    assert all(type(m) is want for m in model)


def test_pack_linears_replaces_every_linear_and_keeps_other_modules():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.ModuleList([nn.Linear(32, 8), nn.Linear(32, 8)]),
                          nn.LayerNorm(8))
    x = torch.randn(5, 16)
    with torch.inference_mode():
        h = model[1](model[0](x))
        want = [model[3](lin(h)) for lin in model[2]]
        assert pack_linears(model) == 3
        h = model[1](model[0](x))
        got = [model[3](lin(h)) for lin in model[2]]
    assert not any(type(m) is nn.Linear for m in model.modules())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_only_cpu_float32():
    assert can_pack(torch.device("cpu"), torch.float32)
    assert not can_pack(torch.device("cpu"), torch.bfloat16)
    assert not can_pack(torch.device("cuda"), torch.float32)


@pytest.mark.parametrize("hidden", [64, 768])
def test_fused_code_heads_give_each_heads_own_prepacked_logits(hidden):
    """ChatTTSGPT.fuse_code_heads: one prepacked linear for the 4 code heads gives, bit for bit,
    the logits of the 4 heads prepacked one by one, at every batch size (oneDNN's result for an
    output does not depend on the width; MKL's and cuBLAS's may, so only packed models fuse)."""
    import copy

    from velocity.model.networks.chattts import ChatTTSGPT
    from velocity.model.networks.llama_config import LlamaConfig

    torch.manual_seed(hidden)
    cfg = LlamaConfig.from_dict(dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                                     num_attention_heads=4, vocab_size=32))
    separate = ChatTTSGPT(cfg, 100, 626, 4, None, set()).eval()
    fused = copy.deepcopy(separate)
    fused.fuse_code_heads()
    assert pack_linears(separate) == pack_linears(fused) + 3             # 4 code heads became one
    with torch.inference_mode():
        for rows in (1, 2, 3, 5, 8, 16, 33, 64):
            h = torch.randn(rows, hidden)
            assert torch.equal(fused.audio_logits(h), separate.audio_logits(h)), rows
