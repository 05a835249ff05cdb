"""The ChatTTS sampler at fixed shapes, for the decode step's CUDA graph: no host sync, no per-row
ops, its inputs one block of int64 columns that the runner copies with the model's.

Like `sampler`, it sees tensors, not sequences (`sampling_rows` turns those into its columns).
Every row runs the same ops whatever its parameters (temperature 1 for a greedy row, penalty 1 for
none, top-k V for off), over all V candidates, with the noise made on the device by the host
sampler's counter-based generator (`sampler.exponential_noise`), so it draws exactly the eager
`Sampler`'s tokens (tests/unit/engine/test_graph_sampler.py). A batch it cannot take (another head, a penalty
window longer than the head's, many stop tokens, an unseeded first token) goes to the eager sampler.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from velocity.engine.sampler import GOLDEN, MUL1, MUL2, chattts_candidates, penalise_rows, race

MAX_STOPS = 8           # stop tokens a row may mask while under its min_new_tokens


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 that holds it."""
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """sampler.mix64 on int64 (the products wrap as uint64's do)."""
    x = (x ^ _shr(x, 30)) * _signed(MUL1)
    x = (x ^ _shr(x, 27)) * _signed(MUL2)
    return x ^ _shr(x, 31)


@functools.lru_cache(maxsize=8)
def _steps(K: int, c: int, device: torch.device) -> torch.Tensor:
    """[K, c] int64: sampler._steps' increments, on the device."""
    counter = (np.arange(K, dtype=np.uint64)[:, None] << np.uint64(32)) + np.arange(c, dtype=np.uint64)
    return torch.from_numpy((counter * np.uint64(GOLDEN)).view(np.int64)).to(device)


def device_noise(keys: torch.Tensor, K: int, c: int) -> torch.Tensor:
    """sampler.exponential_noise made on the keys' device: keys int64 [B] -> Exp(1) [B, K, c] float32."""
    bits = _mix64(keys[:, None, None] + _steps(K, c, keys.device))
    u = (_shr(bits, 11).double() + 0.5) / 2.0 ** 53
    return (-u.log()).float()


class GraphSampler:
    """The ChatTTS-style head `head_name` (K codebooks of V tokens, a repetition window of L frames)
    sampled at fixed shapes from int64 columns (`sampling_rows.SamplingRows` fills them on the host):
    key, top-k (V: off), greedy, masked, stop ids [MAX_STOPS] (V: none), history [L, K] (V: none),
    then the float32 bits of the temperatures [K], 1 - top_p and the penalty."""

    def __init__(self, head_name: str, K: int, V: int, window: int, stop_ids: set[int]) -> None:
        self.head_name, self.K, self.V, self.L = head_name, K, V, window
        self.stop_ids = stop_ids
        self.hist = 4 + MAX_STOPS                  # first column of the history
        self.floats = self.hist + window * K       # first column of the floats
        self.columns = self.floats + K + 2

    def sample(self, logits: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """logits [B, K, V] float32; cols [B, columns] int64 (fill's rows on the device) -> [B, K] long.
        The eager Sampler's ChatTTS style, every row through the same fixed-shape ops."""
        B, K, V = logits.shape
        L = self.L
        fl = cols[:, self.floats:].to(torch.int32).view(torch.float32)            # [B, K + 2]
        temps, tail, penalty = fl[:, :K], fl[:, K], fl[:, K + 1]
        x = logits / temps[:, :, None]                           # a greedy row's temperature is 1: x / 1 == x
        hist = cols[:, self.hist:self.floats].view(B, L, K).transpose(1, 2)        # [B, K, L], padded with V
        x = penalise_rows(x, hist, penalty)                      # penalty 1 leaves a row as it was
        mask = torch.zeros(B, V + 1, dtype=torch.bool, device=x.device).scatter_(
            1, cols[:, 4:4 + MAX_STOPS], cols[:, 3:4].bool().expand(B, MAX_STOPS))[:, :V]      # [B, V]
        greedy = x.masked_fill(mask[:, None], float("-inf")).argmax(dim=-1)       # [B, K]
        ks = cols[:, 1:2].expand(B, K).reshape(-1)
        tails = tail[:, None].expand(B, K).reshape(-1)
        cand, ids = chattts_candidates(x.reshape(B * K, V), ks, tails, V)          # [B K, V] each
        cand, ids = cand.view(B, K, V), ids.view(B, K, V)
        cand = cand.masked_fill(mask[:, None].expand(B, K, V).gather(2, ids), float("-inf"))
        pick = ids.gather(-1, race(cand, device_noise(cols[:, 0], K, V))[..., None])[..., 0]
        return torch.where(cols[:, 2:3].bool(), greedy, pick)
