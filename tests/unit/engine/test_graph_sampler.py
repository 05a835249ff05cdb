"""The fixed-shape sampler of the decode graph (velocity/engine/graph_sampler.py) draws exactly the
eager Sampler's tokens, on the CPU here (on the GPU it runs inside the CUDA graph:
tests/unit/engine/test_cuda_graphs.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import velocity.engine.sampler as sampler_module
from velocity.engine.graph_sampler import MAX_STOPS, GraphSampler, device_noise
from velocity.engine.sampling_rows import sampling_batch
from velocity.engine.sampler import Sampler, exponential_noise
from velocity.engine.sampling_rows import SamplingRows
from velocity.engine.sequence import Sequence
from velocity.sampling_params import SamplingParams

K, V, WINDOW = 4, 626, 16
STOP = {V - 1}


def test_device_noise_equals_the_host_generator():
    keys = np.random.default_rng(0).integers(0, 2 ** 63, size=64, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    keys[:3] = [0, 2 ** 64 - 1, 2 ** 63]                      # the edges of the 64-bit range
    got = device_noise(torch.from_numpy(keys.view(np.int64)), K, V)
    assert torch.equal(got, exponential_noise(keys, K, V))


def batch(rng: np.random.Generator, n: int) -> list[Sequence]:
    """Requests as the service mixes them: seeded and not, greedy, top-k on and off, per-codebook
    temperatures, penalties with and without a window, rows under min_new_tokens."""
    seqs = []
    for i in range(n):
        kind = rng.integers(0, 6)
        if kind == 0:
            p = SamplingParams(temperature=0.0, max_new_tokens=500, repetition_penalty=float(rng.choice([1.0, 1.1])))
        else:
            p = SamplingParams(temperature=[float(x) for x in rng.uniform(0.1, 1.5, K)] if kind == 1
                               else float(rng.uniform(0.1, 1.5)),
                               top_p=float(rng.choice([1.0, 0.7, 0.95, 0.2])),
                               top_k=int(rng.choice([0, 1, 2, 20, 100])),
                               repetition_penalty=float(rng.choice([1.0, 1.05, 1.3])),
                               repetition_window=None if kind != 2 else int(rng.integers(1, WINDOW + 1)),
                               seed=None if kind == 3 else int(rng.integers(0, 2 ** 40)),
                               min_new_tokens=int(rng.integers(0, 40)), max_new_tokens=500,
                               stop_token_ids=[int(rng.integers(0, V))] if kind == 4 else [])
        s = Sequence(f"r{i}", [1, 2, 3], p, head="audio")
        for t in rng.integers(0, V - 1, size=(int(rng.integers(1, 40)), K)):
            s.append(tuple(int(x) for x in t))
        seqs.append(s)
    return seqs


@pytest.mark.parametrize("seed", range(6))
def test_graph_sampler_draws_the_eager_samplers_tokens(seed):
    rng = np.random.default_rng(seed)
    B, pad = int(rng.integers(1, 24)), int(rng.integers(0, 5))
    seqs = batch(rng, B)
    logits = torch.randn(B + pad, K, V, generator=torch.Generator().manual_seed(seed)) * 3
    gs = GraphSampler("audio", K, V, WINDOW, STOP)
    rows = np.zeros((B + pad, gs.columns), dtype=np.int64)
    sampler_module._entropy.seed(seed)                     # unseeded rows: the same fresh keys for both
    assert SamplingRows(gs).fill(rows, seqs)
    got = gs.sample(logits, torch.from_numpy(rows))
    sampler_module._entropy.seed(seed)
    want = Sampler()(logits[:B], sampling_batch(seqs, K, V, STOP, "chattts", WINDOW))
    assert torch.equal(got[:B], want)
    assert torch.equal(got[B:], logits[B:].argmax(-1))       # padding rows: plain greedy


def test_rows_it_cannot_take_go_to_the_eager_sampler():
    gs = GraphSampler("audio", K, V, WINDOW, STOP)
    rows = np.zeros((1, gs.columns), dtype=np.int64)

    def one(p, head="audio", frames=1):
        s = Sequence("r", [1], p, head=head)
        for _ in range(frames):
            s.append((1,) * K)
        return SamplingRows(gs).fill(rows, [s])

    assert one(SamplingParams(temperature=0.3, seed=1))
    assert not one(SamplingParams(temperature=0.3, seed=1), head="text")
    assert not one(SamplingParams(temperature=0.3, repetition_penalty=1.1, repetition_window=WINDOW + 1))
    assert one(SamplingParams(temperature=0.3, repetition_window=WINDOW + 1))          # no penalty: no history
    assert not one(SamplingParams(temperature=0.3, stop_token_ids=list(range(MAX_STOPS + 1))))
    assert not one(SamplingParams(temperature=0.3), frames=0)                          # a first token
