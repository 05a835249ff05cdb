"""Batched sampling where every row keeps its own parameters and its own random stream.

Logits are [B, K, V]: K = 1 for text, K = num_vq codebooks for an audio frame. One step's
sampling is a fixed handful of tensor ops whatever the batch (no per-row ops: on a GPU each
would be a kernel launch), and with top-k the draw runs over each row's k candidates, not all V.
"""
from __future__ import annotations

import functools
import random

import numpy as np
import torch

from velocity.engine.sequence import Sequence, Token


M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15                # splitmix64's increment
MUL1, MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB   # splitmix64's finaliser multipliers
_entropy = random.Random()                 # keys of unseeded rows


def mix64(x: int) -> int:
    """splitmix64's finaliser on a Python int (64 bits)."""
    x &= M64
    x = ((x ^ (x >> 30)) * MUL1) & M64
    x = ((x ^ (x >> 27)) * MUL2) & M64
    return x ^ (x >> 31)


def mix64_array(x: np.ndarray) -> np.ndarray:
    """mix64 on a uint64 array (numpy's uint64 array arithmetic wraps, shifts are logical)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(MUL1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(MUL2)
    return x ^ (x >> np.uint64(31))


@functools.lru_cache(maxsize=32)
def _steps(K: int, c: int) -> np.ndarray:
    """[K, c] splitmix64 increments of element (k, j): counter (k << 32) + j times GOLDEN."""
    counter = (np.arange(K, dtype=np.uint64)[:, None] << np.uint64(32)) + np.arange(c, dtype=np.uint64)
    return counter * np.uint64(GOLDEN)


def exponential_noise(keys: list[int], K: int, c: int) -> torch.Tensor:
    """keys (64-bit) -> Exp(1) noise [R, K, c] (float32, on the host), element (k, j) of a row a
    function of its key, k and j alone: a counter-based generator (splitmix64), so a row draws
    the same numbers in any batch, any top-k width and for any device, and all rows draw in one
    go. Made on the host: a few numpy ops and one copy instead of ~20 kernels on a GPU."""
    bits = mix64_array(np.array(keys, dtype=np.uint64)[:, None, None] + _steps(K, c))
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0 ** 53           # uniform in (0, 1)
    return torch.from_numpy((-np.log(u)).astype(np.float32))


def candidates(x: torch.Tensor, ks: torch.Tensor, ps: torch.Tensor, c: int,
               p_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The c highest logits of each row and their ids, those a row's filters drop set to -inf.
    x: [R, V]; ks: [R] top-k (V = off, c >= every k); ps: [R] top-p (1 = off) -> ([R, c], [R, c])

    Default order is transformers' (top-k, then top-p on the renormalised rest);
    p_first=True is the ChatTTS reference's (top-p on the whole distribution, then top-k).
    """
    vals, ids = x.topk(c, dim=-1)                                  # descending
    beyond_k = torch.arange(c, device=x.device)[None] >= ks[:, None]
    if p_first:
        probs = x.softmax(dim=-1).gather(1, ids)
    else:
        vals = vals.masked_fill(beyond_k, float("-inf"))
        probs = vals.softmax(dim=-1)
    vals = vals.masked_fill(probs.cumsum(dim=-1) - probs >= ps[:, None], float("-inf"))  # keeps the top token
    return (vals.masked_fill(beyond_k, float("-inf")) if p_first else vals), ids


def top_k_top_p(x: torch.Tensor, ks: torch.Tensor, ps: torch.Tensor, p_first: bool = False) -> torch.Tensor:
    """Per-row top-k (ks: [R], V = off) and top-p (ps: [R], 1 = off) as -inf masks. x: [R, V]"""
    vals, ids = candidates(x, ks, ps, int(ks.max()), p_first)
    return torch.full_like(x, float("-inf")).scatter(1, ids, vals)


class Sampler:
    """logits [B, K, V] + the batch's sequences -> one token (int, or K-tuple) per row.

    Repetition penalty and the min-tokens stop mask first, then for sampled rows temperature
    (one per codebook if given), top-k/top-p, and an exponential-race draw. A seeded row's noise
    is a function of its seed and step alone (`exponential_noise`), so its tokens don't depend
    on its neighbours. Greedy rows take the exact argmax.
    """

    @staticmethod
    def row_key(seq: Sequence) -> int:
        """A seeded row's key for this step: its seed and how many tokens it has generated."""
        return mix64(mix64(seq.params.seed) + len(seq.output_token_ids) * GOLDEN)

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int],
                 p_first: bool = False, window: int | None = None) -> list[Token]:
        """window: the repetition window of requests that set none (the head's default)."""
        if logits.dim() == 2:
            logits = logits[:, None]
        B, K, V = logits.shape
        dev = logits.device
        logits = self.apply_penalties(logits, seqs, stop_ids, window)
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        tokens = logits.argmax(dim=-1) if len(rows) < B else None        # [B, K] greedy rows
        if rows:
            R, ps = len(rows), [seqs[i].params for i in rows]
            ks = [p.top_k if 0 < p.top_k < V else V for p in ps]
            c = max(ks)
            # one host-to-device copy: [R, K + 2] = temperatures, top-k, top-p
            filt = torch.tensor([[*p.temperatures(K), k, p.top_p] for p, k in zip(ps, ks)], device=dev)
            idx = torch.tensor(rows, device=dev) if R < B else None
            x = (logits if idx is None else logits[idx]) / filt[:, :K, None]       # [R, K, V]
            ids = None
            if any(k < V or p.top_p < 1 for p, k in zip(ps, ks)):
                x, ids = candidates(x.view(-1, V), filt[:, K].long().repeat_interleave(K),
                                    filt[:, K + 1].repeat_interleave(K), c, p_first)
                x, ids = x.view(R, K, c), ids.view(R, K, c)
            probs = x.softmax(dim=-1)                                    # [R, K, c]
            keys = [self.row_key(seqs[i]) if p.seed is not None else _entropy.getrandbits(64) for i, p in zip(rows, ps)]
            noise = exponential_noise(keys, K, x.shape[-1]).to(dev)
            pick = (probs / noise).argmax(dim=-1, keepdim=True)          # exponential race = categorical draw
            pick = pick[..., 0] if ids is None else ids.gather(-1, pick)[..., 0]           # [R, K]
            if idx is None:
                tokens = pick
            else:
                tokens[idx] = pick
        return [t[0] if K == 1 else tuple(t) for t in tokens.tolist()]

    def apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int],
                        window: int | None = None) -> torch.Tensor:
        """Repetition penalty and min_new_tokens' stop mask. logits: [B, K, V]"""
        B, K, V = logits.shape
        dev = logits.device
        pen = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1.0]
        if pen:
            hists, once = [], []
            for i in pen:
                s = seqs[i]
                w = s.params.repetition_window or window
                # audio frames: only generated frames count (the prompt is text)
                hist = (s.token_ids if K == 1 else s.output_token_ids) if w is None else s.output_token_ids[-w:]
                hists.append([t[:K] if isinstance(t, tuple) else (t,) for t in hist])
                once.append(w is None)   # transformers' rule: every earlier token penalised once
            L, pad = max(1, *map(len, hists)), [(V,) * K]                # pad: an extra column V, dropped
            ids = torch.from_numpy(np.array([h + pad * (L - len(h)) for h in hists])).to(dev).transpose(1, 2)  # [P, K, L]
            counts = torch.zeros(len(pen), K, V + 1, device=dev).scatter_add_(2, ids, torch.ones(ids.shape, device=dev))
            n = counts.gather(2, ids)                                      # [P, K, L] occurrences of each
            if all(once):
                n = n.clamp(max=1)
            elif any(once):
                n = torch.where(torch.tensor(once, device=dev)[:, None, None], n.clamp(max=1), n)
            alpha = torch.tensor([seqs[i].params.repetition_penalty for i in pen], device=dev)[:, None, None] ** n
            rows = None if len(pen) == B else torch.tensor(pen, device=dev)
            sub = logits if rows is None else logits[rows]
            sub = torch.cat([sub, sub.new_zeros(len(pen), K, 1)], dim=-1)  # a copy, with the pad column
            got = sub.gather(2, ids)                # only the history's logits change: a repeat writes the same
            sub = sub.scatter_(2, ids, torch.where(got < 0, got * alpha, got / alpha))[..., :V]
            if rows is None:
                logits = sub
            else:
                logits = logits.clone()
                logits[rows] = sub
        masked = [(i, s) for i, s in enumerate(seqs) if len(s.output_token_ids) < s.params.min_new_tokens]
        if masked:
            logits = logits.clone() if not pen else logits
            for i, s in masked:
                stop = list((set() if s.params.ignore_eos else stop_ids) | set(s.params.stop_token_ids))
                if stop:
                    logits[i, :, stop] = float("-inf")
        return logits
