"""Sampler: per-row parameters, filters as in transformers, seeds independent of the batch."""
import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from velocity.engine.sequence import Sequence
from velocity.sampling_params import SamplingParams
from velocity.engine.sampling_rows import sampling_batch
from velocity.engine.sampler import (CHATTTS_MIN_KEEP, M64, Sampler, candidates, chattts_candidates, noise_key,
                                     noise_keys)

V = 50


def seq(params, prompt=(1, 2, 3), out=()):
    s = Sequence("r", list(prompt), params)
    for t in out:
        s.append(t)
    return s


def top_k_top_p(x, ks, ps):
    """Per-row top-k (ks: [R], V = off) and top-p (ps: [R], 1 = off) of `candidates`, as -inf masks. x: [R, V]"""
    vals, ids = candidates(x, ks, ps, int(ks.max()))
    return torch.full_like(x, float("-inf")).scatter(1, ids, vals)


def sample(sm, logits, seqs, stop_ids=frozenset(), style="transformers", window=None):
    """The worker's path: the runner's tensors, the sampler, then a token (int or K-tuple) per row."""
    lg = logits if logits.dim() == 3 else logits[:, None]
    out = sm(lg, sampling_batch(seqs, lg.shape[1], lg.shape[2], set(stop_ids), style, window)).tolist()
    return [t[0] if len(t) == 1 else tuple(t) for t in out]


def penalised(logits, seqs, window=None):
    """The repetition penalty alone. logits: [B, K, V]"""
    return Sampler.penalise(logits, sampling_batch(seqs, logits.shape[1], logits.shape[2], set(), window=window))


def step(sm, logits, seqs, **kw):
    """Sample one step and append the tokens, as the engine does (seeded draws are keyed by the step)."""
    out = sample(sm, logits, seqs, **kw)
    for s, t in zip(seqs, out):
        s.append(t)
    return out


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, V, generator=g) * 3


@pytest.mark.parametrize("k,p", [(1, 1.0), (5, 1.0), (V, 0.5), (10, 0.9), (V, 0.05), (3, 0.3)])
def test_top_k_top_p_match_transformers(logits, k, p):
    ours = top_k_top_p(logits, torch.full((6,), k), torch.full((6,), p))
    ref = TopPLogitsWarper(p)(None, TopKLogitsWarper(k)(None, logits.clone())) if p < 1 else \
        TopKLogitsWarper(k)(None, logits.clone())
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    assert torch.equal(ours[~torch.isinf(ours)], logits[~torch.isinf(ref)])


def test_top_k_top_p_per_row(logits):
    ks, ps = torch.tensor([1, 3, V, V, 7, V]), torch.tensor([1.0, 1.0, 0.5, 1.0, 0.8, 0.999])
    ours = top_k_top_p(logits, ks, ps)
    for i in range(6):
        row = top_k_top_p(logits[i:i + 1], ks[i:i + 1], ps[i:i + 1])
        assert torch.equal(ours[i:i + 1], row)
    assert (~torch.isinf(ours[0])).sum() == 1 and (~torch.isinf(ours[1])).sum() == 3
    assert (~torch.isinf(ours[3])).sum() == V


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])
def test_chattts_filters_match_the_references_warpers(scale):
    """ChatTTS order: top-p on the whole distribution, then top-k, each keeping at least 3
    (transformers' warpers with min_tokens_to_keep=3, as the reference builds them), per row,
    whatever the neighbours' settings; the candidates come best first."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 626, generator=g) * scale
    ks = torch.tensor([20, 1, 626, 5, 20, 2, 626, 50])
    ps = [0.7, 0.7, 0.7, 0.05, 0.999, 1e-4, 0.95, 0.5]
    vals, ids = chattts_candidates(x, ks, torch.tensor([1 - p for p in ps]), 626)
    assert torch.equal(ids, x.argsort(dim=-1, descending=True))
    for i, p in enumerate(ps):
        ref = x[i:i + 1].clone()
        ref = TopPLogitsWarper(p, min_tokens_to_keep=CHATTTS_MIN_KEEP)(None, ref)
        ref = TopKLogitsWarper(int(ks[i]), min_tokens_to_keep=CHATTTS_MIN_KEEP)(None, ref)[0]
        assert torch.equal(vals[i], ref[ids[i]]), i
        assert vals[i].isfinite().sum() >= CHATTTS_MIN_KEEP
    narrow, _ = chattts_candidates(x, ks.clamp(max=50), torch.tensor([1 - p for p in ps]), 50)
    assert torch.equal(narrow[:, :50][ks < 626], vals[:, :50][ks < 626])   # the c best are enough


def test_greedy_is_exact_argmax_whatever_the_neighbours(logits):
    seqs = [seq(SamplingParams(temperature=0)), seq(SamplingParams(temperature=1.5, top_k=5)),
            seq(SamplingParams(temperature=0)), seq(SamplingParams(temperature=0.7, top_p=0.5)),
            seq(SamplingParams(temperature=0)), seq(SamplingParams(temperature=1.0))]
    out = sample(Sampler(), logits, seqs)
    for i in (0, 2, 4):
        assert out[i] == int(logits[i].argmax())


def test_repetition_penalty_matches_transformers(logits):
    hist = [[1, 2, 3, 4], [5, 5, 6], [7], [8, 9, 10, 11, 12], [1], [2]]
    pens = [1.3, 1.0, 0.8, 2.0, 1.3, 1.0]
    seqs = [seq(SamplingParams(temperature=0, repetition_penalty=r), prompt=h) for h, r in zip(hist, pens)]
    ours = penalised(logits[:, None], seqs)[:, 0]
    for i, (h, r) in enumerate(zip(hist, pens)):
        ref = RepetitionPenaltyLogitsProcessor(r)(torch.tensor([h]), logits[i:i + 1].clone())
        assert torch.equal(ours[i:i + 1], ref)


def test_min_new_tokens_masks_stop_tokens_until_reached(logits):
    stop = int(logits[0].argmax())
    s_early = seq(SamplingParams(temperature=0, min_new_tokens=3), out=[1, 2])
    s_done = seq(SamplingParams(temperature=0, min_new_tokens=3), out=[1, 2, 3])
    out = sample(Sampler(), logits[:1].repeat(2, 1), [s_early, s_done], {stop})
    assert out[0] != stop and out[1] == stop


def test_seeded_rows_reproducible_whatever_else_is_in_the_batch(logits):
    def draw(batch_params, steps=5):
        sm = Sampler()
        seqs = [seq(p) for p in batch_params]
        got = []
        for _ in range(steps):
            got.append(step(sm, logits[:len(seqs)], seqs))
        return [g[0] for g in got]

    p = SamplingParams(temperature=1.0, seed=1234)
    alone = draw([p])
    crowded = draw([SamplingParams(temperature=1.0, seed=1234), SamplingParams(temperature=0.5),
                    SamplingParams(temperature=2.0, seed=7), SamplingParams(temperature=0)])
    assert alone == crowded
    assert draw([SamplingParams(temperature=1.0, seed=99)]) != alone or \
        draw([SamplingParams(temperature=1.0, seed=98)]) != alone


def test_sampling_follows_the_distribution():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sm, n = Sampler(), 4000
    s = seq(SamplingParams(temperature=1.0))
    counts = torch.bincount(torch.tensor([sample(sm, logits, [s])[0] for _ in range(n)]), minlength=4)
    # 4000 draws: binomial standard deviation <= 0.008; 0.03 is over 3.5 of them
    assert torch.allclose(counts / n, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)
    s2 = seq(SamplingParams(temperature=1.0, top_k=2))
    assert set(sample(sm, logits, [s2])[0] for _ in range(300)) == {0, 1}


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1),
                                 dict(max_new_tokens=0), dict(min_new_tokens=5, max_new_tokens=2),
                                 dict(repetition_penalty=0)])
def test_bad_params_name_the_parameter(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_windowed_penalty_counts_each_occurrence_per_codebook():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 2, 10, generator=g)
    s = seq(SamplingParams(temperature=0, repetition_penalty=2.0), prompt=[7], out=[(1, 2), (1, 3), (4, 2)])

    def expect(counts):
        e = logits.clone()
        for (k, t), n in counts.items():
            v = e[0, k, t]
            e[0, k, t] = v * 2.0 ** n if v < 0 else v / 2.0 ** n
        return e

    # the head's default window (2): frames (1, 3), (4, 2)
    torch.testing.assert_close(penalised(logits, [s], window=2),
                               expect({(0, 1): 1, (0, 4): 1, (1, 3): 1, (1, 2): 1}), rtol=0, atol=0)
    # a request's own window (3) wins: code 1 twice in codebook 0, code 2 twice in codebook 1
    s.params.repetition_window = 3
    torch.testing.assert_close(penalised(logits, [s], window=2),
                               expect({(0, 1): 2, (0, 4): 1, (1, 2): 2, (1, 3): 1}), rtol=0, atol=0)


def test_batched_penalties_equal_each_row_alone():
    """One scatter for the batch == the rule applied to each row on its own (exact)."""
    g = torch.Generator().manual_seed(3)
    lg = torch.randn(5, 4, 30, generator=g)
    frames = [tuple(int(c) for c in torch.randint(0, 30, (4,), generator=g)) for _ in range(9)]
    params = [SamplingParams(repetition_penalty=1.3), SamplingParams(repetition_penalty=1.0),
              SamplingParams(repetition_penalty=0.7, repetition_window=3), SamplingParams(repetition_penalty=2.0),
              SamplingParams(repetition_penalty=1.1, repetition_window=20)]
    seqs = [seq(p, out=frames[:n]) for p, n in zip(params, [9, 4, 9, 0, 5])]
    batch = penalised(lg, seqs, window=4)
    for i, s in enumerate(seqs):
        assert torch.equal(batch[i:i + 1], penalised(lg[i:i + 1], [s], window=4))
    assert torch.equal(batch[1], lg[1]) and torch.equal(batch[3], lg[3])     # no penalty / no history
    assert not torch.equal(batch[0], lg[0])


def test_seeded_row_ignores_the_neighbours_top_k(logits):
    """The draw runs over the batch's largest k; a seeded row still draws over its own k only."""
    def draw(neighbour_k):
        sm = Sampler()
        seqs = [seq(SamplingParams(temperature=1.0, top_k=8, seed=5)), seq(SamplingParams(temperature=1.0, top_k=neighbour_k))]
        return [step(sm, logits[:2], seqs)[0] for _ in range(20)]

    assert draw(3) == draw(0) == draw(30)


def test_top_k_top_p_draws_follow_the_filtered_distribution():
    """ChatTTS order (top-p on the whole distribution, then top-k), drawn over the candidates only."""
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    sm, n = Sampler(), 4000
    s = seq(SamplingParams(temperature=1.0, top_k=3, top_p=0.75, seed=11))
    got = torch.bincount(torch.tensor([step(sm, torch.log(probs)[None, None], [s], style="chattts")[0]
                                       for _ in range(n)]), minlength=6)
    # top-p 0.75 keeps 0.4, 0.25, 0.15 (0.65 < 0.75 before the third); top-k 3 keeps the same three.
    # 4000 draws: binomial standard deviation <= 0.008; 0.03 is over 3.5 of them
    assert torch.allclose(got / n, torch.tensor([0.5, 0.3125, 0.1875, 0, 0, 0]), atol=0.03)
    assert got[3:].sum() == 0


def test_noise_generator_is_splitmix64_and_exponential():
    """The array mix equals splitmix64 on Python ints bit for bit; the noise is Exp(1); a row's
    numbers don't depend on the width drawn (so not on the batch's largest top-k)."""
    from velocity.engine.sampler import exponential_noise, mix64, mix64_array
    xs = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15, 123456789]
    assert mix64_array(np.array(xs, dtype=np.uint64)).tolist() == [mix64(x) for x in xs]
    keys = np.random.default_rng(0).integers(0, 2**64, 2000, dtype=np.uint64).tolist()
    e = exponential_noise(keys, 4, 32).double()                                  # 256,000 draws
    # Exp(1): mean 1, variance 1, P(X > 1) = 1/e; standard errors 0.002, 0.0056 and 0.001: bounds at
    # over 3.5 of them (the keys are seeded, so this is one fixed draw, not a flaky one)
    assert abs(e.mean() - 1) < 0.01 and abs(e.var() - 1) < 0.02
    assert abs(float((e > 1).double().mean()) - math.exp(-1)) < 0.004
    assert torch.equal(exponential_noise(keys[:5], 4, 626)[..., :32], exponential_noise(keys[:5], 4, 32))


def test_an_unseeded_rows_first_token_is_never_a_stop_beside_greedy_rows():
    """ChatTTS style: an unseeded sampled row's first token cannot be a stop token (the reference
    draws such a frame again), whichever rows around it are greedy; a greedy row still may stop."""
    logits = torch.full((4, 1, 6), -5.0)
    logits[:, 0, 5] = 5.0                               # the stop token is by far the likeliest
    seqs = [seq(SamplingParams(temperature=0)), seq(SamplingParams(temperature=1.0, top_k=3)),
            seq(SamplingParams(temperature=0)), seq(SamplingParams(temperature=1.0, top_k=3))]
    for _ in range(20):
        out = sample(Sampler(), logits, seqs, {5}, style="chattts")
        assert out[0] == 5 and out[2] == 5 and out[1] != 5 and out[3] != 5, out


def test_noise_keys_equal_noise_key_row_by_row():
    """The runner makes all rows' keys at once in numpy; each is the scalar definition's."""
    import random
    rng = random.Random(3)
    seeds = [0, 1, -1, 2**63, 2**64 - 1, 2**70 + 5] + [rng.getrandbits(64) for _ in range(50)]
    steps = [rng.randrange(0, 5000) for _ in seeds]
    got = noise_keys(np.array([s & M64 for s in seeds], dtype=np.uint64), np.array(steps, dtype=np.uint64))
    assert got.tolist() == [noise_key(s, n) for s, n in zip(seeds, steps)]


def test_sequence_output_array_mirrors_its_tokens():
    from velocity.engine.sequence import Sequence
    for tokens in ([5, 7, 9] * 20, [(1, 2, 3, 4), (5, 6, 7, 8)] * 30):
        seq = Sequence("r", [1, 2], SamplingParams())
        for i, t in enumerate(tokens):
            seq.append(t)
            got = seq.output_array()
            assert got.dtype == np.int64 and got.tolist() == [list(x) if isinstance(x, tuple) else [x]
                                                              for x in tokens[:i + 1]]


def test_audio_penalty_without_a_window_before_any_frame():
    """A codebook head whose requests set no window penalises every generated frame: at the first
    step there are none, and the history is all padding (V)."""
    p = SamplingParams(temperature=0.3, repetition_penalty=1.05)
    fresh, later = seq(p), seq(p, out=[(1, 2, 3, 4), (5, 6, 7, 8)])
    b = sampling_batch([fresh, later], 4, V, set(), "chattts", None)
    assert (b.penalty_ids[0] == V).all()
    assert b.penalty_ids[1, :, :2].tolist() == [[1, 5], [2, 6], [3, 7], [4, 8]]
