"""VELOCITY_QUANTIZE=int8: the transformer layers' linears on int8 weights (velocity.model.layers.int8_linear).
Quantization changes the output, so these tests bound the error instead of asking for equality."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from llama_ref import make_llama, prompts
from triton_server import ROOT
from velocity import LLM, SamplingParams
from velocity.config import EngineConfig
from velocity.model.layers.int8_linear import Int8Linear


@pytest.mark.parametrize("inp,out,bias", [(768, 2304, False), (3072, 768, True)])
def test_an_int8_linear_is_within_its_quantization_error(inp, out, bias):
    """8-bit weights per output channel and 8-bit input rows (7-bit without VNNI): about 1% relative
    error on Gaussian inputs (measured 1.0-1.2% with 8-bit rows; 1.6-2.1% with the former 7-bit
    per-call scale); bounded here at 4%, and above 0 (it is quantized)."""
    torch.manual_seed(0)
    lin = nn.Linear(inp, out, bias=bias)
    nn.init.normal_(lin.weight, 0, 0.02)
    q = Int8Linear(lin)
    for shape in ((1, inp), (8, inp), (2, 5, inp)):
        x = torch.randn(shape)
        y, yq = lin(x), q(x)
        assert yq.shape == y.shape
        rel = ((yq - y).norm() / y.norm()).item()
        assert 0 < rel < 0.04, (shape, rel)


@pytest.mark.parametrize("bits", [8, 7])
def test_an_int8_linear_quantizes_each_row_on_its_own(bits):
    """A row's output is the same alone as in any batch, bit for bit: its activations' scale is
    its own (one scale per call let the batch's largest value set every row's step)."""
    torch.manual_seed(0)
    q = Int8Linear(nn.Linear(768, 2304), bits)
    x = torch.randn(2, 5, 768)
    x[0, 1] *= 100                                   # an outlier row
    x[1, 2] = 0                                      # a row of zeros
    y = q(x)
    assert torch.equal(y[1, 2], q.bias)
    for i in range(2):
        for j in range(5):
            assert torch.equal(q(x[i, j:j + 1]), y[i, j:j + 1]), (i, j)
    assert torch.equal(q(x[:, ::2].contiguous()), y[:, ::2])


def test_the_engine_on_int8_layers_picks_what_float32_ranks_at_the_top(tmp_path):
    """Greedy generation with int8 layers, checked token by token against the float32 model
    (transformers) fed the same tokens: random weights leave near ties that quantization may
    flip, so each int8 choice must be within 10% of the logit range of float32's best (measured:
    at most 0.8%, the best itself 97% of the time), and most must be float32's best."""
    model = make_llama(tmp_path)
    ps = prompts([1, 3, 9, 16, 31, 70])
    llm = LLM(str(tmp_path), device="cpu", quantize="int8")
    kinds = [type(m) for m in llm.engine.worker.model.modules()]
    assert kinds.count(Int8Linear) == 4 * model.config.num_hidden_layers     # qkv, o, gate_up, down per layer
    outs = [o.token_ids for o in llm.generate(ps, SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True))]
    assert llm.engine.block_manager.num_used_blocks == 0
    best = total = 0
    with torch.no_grad():
        for p, out in zip(ps, outs):
            logits = model(torch.tensor([p + out])).logits[0, len(p) - 1:-1]   # what chose each new token
            for t, row in zip(out, logits):
                gap = float((row.max() - row[t]) / (row.max() - row.min()))
                assert gap < 0.10, (p, out, gap)
                best += gap == 0
                total += 1
    assert best / total >= 0.8, best / total


def test_int8_needs_the_cpu_and_float32():
    with pytest.raises(ValueError, match="quantize must be 'none' or 'int8'"):
        EngineConfig(model="x", quantize="int4")
    from velocity.engine.worker import Worker
    with pytest.raises(ValueError, match="needs the CPU and float32.*unset VELOCITY_QUANTIZE"):
        Worker(EngineConfig(model="unused", device="cpu", dtype="bfloat16", quantize="int8"))


def test_capped_to_avx2_int8_rows_get_7_bits_and_stay_within_their_error():
    """scripts/serve.sh --cpu-isa avx2 caps torch, fbgemm, oneDNN and MKL to AVX2 code, as an
    AVX2-only machine runs it: there fbgemm sums pairs of products in 16 bits, so rows must get 7
    bits (8-bit rows could saturate). In a process under the cap (the variables serve.sh sets),
    rows get 7 bits, the C++ kernels are built without AVX-512, and fbgemm's AVX2 kernel gives an
    error as small as the native one (measured about 1.6% relative; bound 4%)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    from velocity.model.kernels.cpu_isa import CAP_VARIABLES

    serve = (ROOT / "scripts" / "serve.sh").read_text()
    line = re.search(r"avx2\) export (.*) ;;", serve).group(1)
    assert dict(kv.split("=") for kv in line.split()) == CAP_VARIABLES["avx2"]
    code = """
import torch
from torch import nn
from velocity.model.kernels import cpu_isa
from velocity.model.kernels.cpu_kernels import CFLAGS
from velocity.model.layers.int8_linear import Int8Linear, activation_bits
torch.manual_seed(0)
lin = nn.Linear(768, 2304)
nn.init.normal_(lin.weight, 0, 0.02)
x = torch.randn(8, 768)
q = Int8Linear(lin)
rel = ((q(x) - lin(x)).norm() / lin(x).norm()).item()
print(cpu_isa.capability(), activation_bits(), q.bits, "-march=native" in CFLAGS, "-mno-avx512f" in CFLAGS, rel)
"""
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **CAP_VARIABLES["avx2"]},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] in ("AVX2", "DEFAULT") and out[1:5] == ["7", "7", "True", "True"], out
    assert 0 < float(out[5]) < 0.04, out


def linears_on_the_cpp_kernels(model, kind: str) -> None:
    """The layers' linears as the engine makes them for `kind`: int8 (Int8Linear on int8_gemm) or
    float32 (F32Linear on f32_gemm)."""
    from velocity.model.kernels.cpu_kernels import kernels
    from velocity.model.layers.int8_linear import quantize_linears
    from velocity.model.networks.llama import LlamaLayer
    from velocity.model.layers.packed_linear import pack_linears

    K = kernels()
    assert K is not None, "the C++ kernels did not build"
    if kind == "int8":
        quantize_linears(model, LlamaLayer, K)
    elif K.f32_gemm_lanes() == 0:
        pytest.skip("the C++ kernels are built without AVX2 and FMA here: no f32_gemm, no float32 rows")
    else:
        pack_linears(model, K)


# the C++ rows against torch's operations on the same linears: int8 within the step an int8 row can
# move by (see below), float32 within float rounding alone
ROW_BOUNDS = {"int8": 1e-4, "float32": 1e-5}


@pytest.mark.parametrize("kind", ["int8", "float32"])
def test_the_cpp_decode_step_equals_the_torch_step(tmp_path, kind):
    """LlamaBody.forward_rows (velocity/model/kernels/csrc/layer_rows.cpp: the operations between the linears in
    C++) against the same linears on torch's operations, one decode step of 6 sequences over
    paged caches: the same arithmetic in another order, so equal within float rounding, except
    where that rounding moves an int8 row across a step (a step of max |x| / 127 in one input
    value of one linear). Measured for int8: a relative error of 4e-8 on the hidden states, and
    3e-2 with RoPE's sign flipped in one half; bounded at 1e-4 (float32: 1e-5)."""
    from checkpoints import tiny_checkpoint
    from velocity.model.layers.attention import AttentionMetadata
    from velocity.model.kernels.cpu_kernels import paged_decode_kernel
    from velocity.model.networks.llama import row_kernels
    from velocity.model.loading.loader import load_model

    model = load_model(tiny_checkpoint(tmp_path / "tiny", seed=0), torch.device("cpu"), torch.float32)
    linears_on_the_cpp_kernels(model, kind)
    body = model.model
    K = row_kernels(body)
    assert K is not None, "the C++ kernels did not build"
    g = torch.Generator().manual_seed(0)
    a = body.layers[0].self_attn
    B, S, W, N = 6, 16, 4, 32
    caches = [(torch.randn(N, S, a.num_kv_heads, a.head_dim, generator=g),
               torch.randn(N, S, a.num_kv_heads, a.head_dim, generator=g)) for _ in body.layers]
    tables = torch.stack([torch.randperm(N, generator=g)[:W] for _ in range(B)])
    ctx = torch.randint(1, W * S + 1, (B,), generator=g)
    pos = ctx - 1
    slots = tables.gather(1, (pos // S)[:, None])[:, 0] * S + pos % S
    md = AttentionMetadata(slot_mapping=slots, block_tables=tables, attn_mask=None, context_lens=ctx,
                           kernel=paged_decode_kernel())
    x = torch.randn(B, body.norm.weight.shape[0], generator=g)
    out = {}
    for name, rows in (("torch", None), ("cpp", K)):
        for layer, (k, v) in zip(body.layers, caches):
            layer.self_attn.k_cache, layer.self_attn.v_cache = k.clone(), v.clone()
        body.rows = rows
        with torch.no_grad():
            out[name] = body(x.clone(), pos, md)
        out[name + " cache"] = body.layers[-1].self_attn.k_cache
    err = float((out["cpp"] - out["torch"]).norm() / out["torch"].norm())
    assert err < ROW_BOUNDS[kind], err
    torch.testing.assert_close(out["cpp cache"], out["torch cache"], rtol=1e-4, atol=1e-4)   # RoPE'd keys written alike


def test_the_int8_engine_decodes_on_the_cpp_rows(tmp_path):
    make_llama(tmp_path)
    from velocity.model.kernels.cpu_kernels import kernels

    llm = LLM(str(tmp_path), device="cpu", quantize="int8")
    assert llm.engine.worker.model.model.rows is not None
    linears = [m for m in llm.engine.worker.model.modules() if isinstance(m, Int8Linear)]
    assert linears and all((m.gemm is not None) == (kernels().int8_gemm_bits() == m.bits) for m in linears)
    off = LLM(str(tmp_path), device="cpu", quantize="int8", cpu_kernel=False).engine.worker.model
    assert off.model.rows is None
    assert all(m.gemm is None for m in off.modules() if isinstance(m, Int8Linear))


@pytest.mark.parametrize("inp,out", [(768, 2304), (3072, 768), (64, 192)])
def test_the_cpp_int8_gemm_is_fbgemms_op_where_it_is_built(inp, out):
    """Int8Linear on the C++ kernels' int8_gemm (AVX-512 VNNI builds: 8-bit rows; AVX2: 7-bit)
    against fbgemm's op on the same weights: each row quantized and rounded as fbgemm does, the
    same int8 products summed in int32, scaled in another order: equal within float rounding
    (measured 2e-7 of the peak; bounded at 1e-5). A row's output is the same alone as in a batch,
    bit for bit. Where the kernels have no int8_gemm for these rows' width, Int8Linear keeps fbgemm's op."""
    from velocity.model.kernels.cpu_kernels import kernels

    K = kernels()
    assert K is not None, "the C++ kernels did not build"
    torch.manual_seed(0)
    lin = nn.Linear(inp, out, bias=False)
    nn.init.normal_(lin.weight, 0, 0.02)
    fb, ours = Int8Linear(lin), Int8Linear(lin, kernels=K)
    if K.int8_gemm_bits() != fb.bits:
        assert ours.gemm is None and not isinstance(ours.packed, torch.Tensor)
        return
    assert ours.gemm is not None and fb.gemm is None
    x = torch.randn(3, 11, inp)
    x[0, 1] *= 100                                   # an outlier row
    a, b = fb(x), ours(x)
    peak = float(a.abs().max())
    assert float((a - b).abs().max()) < 1e-5 * peak, float((a - b).abs().max()) / peak
    for i, j in ((0, 0), (0, 1), (2, 10)):
        assert torch.equal(ours(x[i, j:j + 1]), b[i, j:j + 1]), (i, j)
    assert torch.equal(ours(x[:, ::3].contiguous()), b[:, ::3])


@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_in_one_call_is_the_layers_torch_steps_bit_for_bit(bias):
    """Int8Linear.forward on the C++ kernels is one call (int8_linear: each row's scale, the rows
    scaled, int8_gemm, the output rows scaled back, the bias): its outputs are those of the same
    steps in torch around int8_gemm (x.abs().amax(), x / r, y * r, + bias), bit for bit, rows of
    any size, an all-zero row among them."""
    from velocity.model.kernels.cpu_kernels import kernels

    K = kernels()
    assert K is not None, "the C++ kernels did not build"
    torch.manual_seed(0)
    lin = nn.Linear(256, 1024, bias=bias)
    nn.init.normal_(lin.weight, 0, 0.02)
    ours = Int8Linear(lin, kernels=K)
    if ours.gemm is None:
        pytest.skip("the C++ kernels have no int8_gemm for these rows' width here: Int8Linear keeps fbgemm's op")
    x = torch.randn(2, 37, 256) * torch.logspace(-3, 3, 37)[:, None]
    x[1, 5] = 0
    r = x.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    want = ours.scaled(x / r) * r
    want = want + lin.bias.detach() if bias else want
    assert torch.equal(ours(x), want)


def int8_gemm_reference(x, w, bits: int):
    """int8_gemm's arithmetic in numpy: each row rounded as fbgemm rounds it (x L + Z, rounded once
    to float32 as a fused multiply-add is, then to the nearest integer, ties to even), the
    products summed exactly, less each channel's zero point, converted to float32 and scaled."""
    import numpy as np

    L = 2 ** (bits - 1) - 1
    q = np.clip(np.rint((x.astype(np.float64) * L + (L + 1)).astype(np.float32)), 0, 2 * L + 1).astype(np.int64)
    w64 = w.astype(np.int64)
    ws = (np.arange(1, w.shape[0] + 1, dtype=np.float32) / 1000).astype(np.float32)
    acc = (q @ w64.T - w64.sum(1) * (L + 1)).astype(np.int32)
    return acc.astype(np.float32) * ws, ws


# (rows, inputs, outputs): one row and a few, whole and partial blocks of 16 rows (AMX's), one and
# two of its row blocks, an odd count of 16-channel blocks, inputs not a multiple of 64
GEMM_SHAPES = [(t, k, n) for t in (1, 2, 15, 16, 17, 32, 33, 40) for k, n in ((64, 48), (68, 16), (768, 784))]


def run_int8_gemm(K, shapes=GEMM_SHAPES) -> list:
    """int8_gemm's outputs on seeded rows and weights of each shape, beside numpy's reference."""
    import numpy as np

    rng, out = np.random.default_rng(0), []
    for t, k, n in shapes:
        x = rng.uniform(-1, 1, (t, k)).astype(np.float32)
        w = rng.integers(-127, 128, (n, k), dtype=np.int8)
        ref, ws = int8_gemm_reference(x, w, K.int8_gemm_bits())
        wt = torch.from_numpy(w)
        got = K.int8_gemm(torch.from_numpy(x), K.int8_pack(wt), wt.to(torch.int64).sum(1).to(torch.int32),
                          torch.from_numpy(ws)).numpy()
        out.append((got, ref))
    return out


def test_int8_gemm_is_the_exact_integer_sums_on_every_path():
    """The C++ int8_gemm against numpy's exact arithmetic, bit for bit, at every shape: one row on
    the VNNI (or AVX2) code, more on AMX's tiles where the CPU has them, in blocks of 16 rows with
    the padding's sums left out. Where the CPU has AMX (and no cap leaves it out), the kernels
    use it."""
    import numpy as np

    from velocity.model.kernels.cpu_isa import has_amx
    from velocity.model.kernels.cpu_kernels import kernels

    K = kernels()
    assert K is not None, "the C++ kernels did not build"
    if K.int8_gemm_bits() == 0:
        pytest.skip("the C++ kernels are built without AVX-512 VNNI or AVX2 here: no int8_gemm")
    assert bool(K.int8_gemm_amx()) == has_amx(), (
        "the CPU's AMX and the kernels disagree: built without it, or Linux refused the tiles (arch_prctl)")
    for (got, ref), shape in zip(run_int8_gemm(K), GEMM_SHAPES):
        assert np.array_equal(got, ref), (shape, float(np.abs(got - ref).max()))


def test_capped_to_avx512_the_int8_gemm_leaves_amx_and_gives_the_same_outputs():
    """scripts/serve.sh --cpu-isa avx512 leaves AVX-512 and VNNI but not AMX: in a process under
    that cap the kernels are built without AMX's tiles (int8_gemm_amx() is 0), and int8_gemm's
    outputs are the uncapped process's, bit for bit (exact integer sums either way)."""
    import os
    import re
    import subprocess
    import sys

    import numpy as np

    from velocity.model.kernels.cpu_isa import CAP_VARIABLES
    from velocity.model.kernels.cpu_kernels import kernels

    serve = (ROOT / "scripts" / "serve.sh").read_text()
    line = re.search(r"avx512\) export (.*) ;;", serve).group(1)
    assert dict(kv.split("=") for kv in line.split()) == CAP_VARIABLES["avx512"]
    K = kernels()
    assert K is not None, "the C++ kernels did not build"
    if K.int8_gemm_bits() != 8:
        pytest.skip("the C++ kernels' int8_gemm is not built with AVX-512 VNNI here: no AVX-512 cap to test")
    code = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_int8 import run_int8_gemm
from velocity.model.kernels.cpu_kernels import CFLAGS, kernels
K = kernels()
print(K.int8_gemm_amx(), "-mno-amx-int8" in CFLAGS or "amx_int8" not in open("/proc/cpuinfo").read())
np.save(sys.argv[2], np.concatenate([g.ravel() for g, _ in run_int8_gemm(K)]))
"""
    saved = ROOT / ".pytest_cache" / "int8_gemm_avx512.npy"
    saved.parent.mkdir(exist_ok=True)
    env = {**os.environ, **CAP_VARIABLES["avx512"], "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(saved)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "True"], out
    mine = np.concatenate([g.ravel() for g, _ in run_int8_gemm(K)])
    assert np.array_equal(np.load(saved), mine)


@pytest.mark.parametrize("kind", ["int8", "float32"])
def test_the_prefill_runs_on_the_cpp_rows_as_the_torch_prefill_does(tmp_path, kind):
    """A prefill through ModelRunner with row_prefill (each new token a row that reads the
    cache up to its own position: LlamaBody.forward_rows, velocity/model/kernels/csrc/layer_rows.cpp) against the same
    prefill on torch's operations (a causal mask over the tables): two sequences, one with 5 tokens
    already in the cache. Equal within float rounding, bounded as the decode step above; the keys
    written alike. Without the kernels' rows the flag takes no effect."""
    from checkpoints import tiny_checkpoint
    from velocity.engine.cache_engine import CacheEngine
    from velocity.engine.model_runner import ModelRunner
    from velocity.engine.sequence import Sequence
    from velocity.model.kernels.cpu_kernels import paged_decode_kernel
    from velocity.model.networks.llama import row_kernels
    from velocity.model.loading.loader import load_model

    cpu = torch.device("cpu")
    model = load_model(tiny_checkpoint(tmp_path / "tiny", seed=0), cpu, torch.float32)
    linears_on_the_cpp_kernels(model, kind)
    body = model.model
    body.rows = row_kernels(body)
    assert body.rows is not None, "the C++ kernels did not build"
    S, N = 16, 8
    cache = CacheEngine(model, N, 0, S, cpu, torch.float32)
    g = torch.Generator().manual_seed(0)
    start = [(torch.randn_like(layer.self_attn.k_cache), torch.randn_like(layer.self_attn.v_cache))
              for layer in body.layers]
    a = Sequence("a", torch.randint(3, 200, (21,), generator=g).tolist(), SamplingParams())
    b = Sequence("b", torch.randint(3, 200, (9,), generator=g).tolist(), SamplingParams())
    a.block_table, b.block_table = [5, 2], [7]
    a.num_computed_tokens = 5                       # a prefix already in the cache
    out = {}
    for flag in (False, True):
        for layer, (k, v) in zip(body.layers, start):
            layer.self_attn.k_cache.copy_(k)
            layer.self_attn.v_cache.copy_(v)
        runner = ModelRunner(model, S, cache.scratch_block, N * S, 4, cpu, False, paged_decode_kernel(),
                             row_prefill=flag)
        assert runner.row_prefill == flag
        out[flag] = (runner.run([a, b]), body.layers[-1].self_attn.k_cache.clone())
    err = float((out[True][0] - out[False][0]).norm() / out[False][0].norm())
    assert 0 <= err < ROW_BOUNDS[kind], err
    torch.testing.assert_close(out[True][1], out[False][1], rtol=1e-4, atol=1e-4)
    assert not ModelRunner(model, S, cache.scratch_block, N * S, 4, cpu, False, None,
                           row_prefill=True).row_prefill


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_threads_changed_between_layers_change_no_token(tmp_path, quantize):
    """The server's thread lender changes torch's threads before any layer of a CPU step
    (Worker.between_layers); every C++ kernel splits its work by rows or output channels, so the
    sampled tokens (seeded, temperature 1) are the same as on fixed threads, and the hook runs
    before each layer."""
    make_llama(tmp_path)
    ps = prompts([3, 9, 17], seed=4)
    params = [SamplingParams(temperature=1.0, max_new_tokens=12, ignore_eos=True, seed=i) for i in range(len(ps))]
    kw = {"quantize": quantize} if quantize else {}
    threads = torch.get_num_threads()
    calls = []

    def flip():
        calls.append(1)
        torch.set_num_threads(1 if len(calls) % 2 else 2)
    try:
        fixed = [o.token_ids for o in LLM(str(tmp_path), device="cpu", **kw).generate(ps, params)]
        llm = LLM(str(tmp_path), device="cpu", **kw)
        assert llm.engine.worker.model.model.rows is not None
        llm.engine.worker.between_layers(flip)
        flipped = [o.token_ids for o in llm.generate(ps, params)]
    finally:
        torch.set_num_threads(threads)
    assert flipped == fixed
    layers = len(llm.engine.worker.model.model.layers)
    assert calls and len(calls) % layers == 0
