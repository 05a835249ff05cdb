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
CHATTTS_MIN_KEEP = 3                       # the reference's top-p and top-k keep at least 3 candidates


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


def candidates(x: torch.Tensor, ks: torch.Tensor, ps: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' order: top-k, then top-p on the renormalised rest (each keeps at least one).
    The c highest logits of each row and their ids, those the filters drop set to -inf.
    x: [R, V]; ks: [R] top-k (V = off, c >= every k); ps: [R] top-p (1 = off) -> ([R, c], [R, c])"""
    vals, ids = x.topk(c, dim=-1)                                  # descending
    vals = vals.masked_fill(torch.arange(c, device=x.device)[None] >= ks[:, None], float("-inf"))
    probs = vals.softmax(dim=-1)
    return vals.masked_fill(probs.cumsum(dim=-1) - probs >= ps[:, None], float("-inf")), ids   # keeps the top token


def chattts_candidates(x: torch.Tensor, ks: torch.Tensor, tails: torch.Tensor, c: int,
                       min_keep: int = CHATTTS_MIN_KEEP) -> tuple[torch.Tensor, torch.Tensor]:
    """The ChatTTS reference's order and arithmetic: transformers' TopPLogitsWarper on the whole
    distribution (ascending sort and cumsum, drop where the cumulative probability <= 1 - top_p),
    then TopKLogitsWarper (drop what is below the k-th value), each keeping at least `min_keep`
    (the reference's 3). x: [R, V]; ks: [R] (V = off); tails: [R] float32 1 - top_p, computed in
    Python as the warper does; c >= every max(k, min_keep) -> the c best of the rest, ([R, c], [R, c])."""
    asc, order = x.sort(dim=-1)
    drop = asc.softmax(dim=-1).cumsum(dim=-1) <= tails[:, None]
    drop[:, -min_keep:] = False
    x = x.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    ks = ks.clamp(min=min_keep)
    kth = x.topk(int(ks.max()), dim=-1).values.gather(1, ks[:, None] - 1)      # each row's k-th value
    return x.masked_fill(x < kth, float("-inf")).topk(c, dim=-1)


def top_k_top_p(x: torch.Tensor, ks: torch.Tensor, ps: torch.Tensor) -> torch.Tensor:
    """Per-row top-k (ks: [R], V = off) and top-p (ps: [R], 1 = off) as -inf masks. x: [R, V]"""
    vals, ids = candidates(x, ks, ps, int(ks.max()))
    return torch.full_like(x, float("-inf")).scatter(1, ids, vals)


class Sampler:
    """logits [B, K, V] + the batch's sequences -> one token (int, or K-tuple) per row.

    style "transformers" (Hugging Face generate's order): repetition penalty and the min-tokens
    stop mask, then for sampled rows temperature (one per codebook if given), top-k, top-p.
    style "chattts" (the reference's): temperature, repetition penalty, top-p then top-k (both
    keep at least 3, `chattts_candidates`), then the stop mask, which also keeps an unseeded
    row's first token from being a stop token (the reference draws such a first frame again:
    with independent codebooks that is the same distribution).
    Then an exponential-race draw over the candidates. A seeded row's noise is a function of
    its seed and step alone (`exponential_noise`), so its tokens don't depend on its
    neighbours. Greedy rows take the exact argmax.
    """

    @staticmethod
    def row_key(seq: Sequence) -> int:
        """A seeded row's key for this step: its seed and how many tokens it has generated."""
        return mix64(mix64(seq.params.seed) + len(seq.output_token_ids) * GOLDEN)

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int],
                 style: str = "transformers", window: int | None = None) -> list[Token]:
        """window: the repetition window of requests that set none (the head's default)."""
        greedy, rows, x, ids = self.filter(logits, seqs, stop_ids, style, window)
        tokens = greedy
        if rows:
            probs = x.softmax(dim=-1)                                    # [R, K, c]
            keys = [self.row_key(seqs[i]) if seqs[i].params.seed is not None else _entropy.getrandbits(64)
                    for i in rows]
            noise = exponential_noise(keys, x.shape[1], x.shape[-1]).to(x.device)
            pick = (probs / noise).argmax(dim=-1, keepdim=True)          # exponential race = categorical draw
            pick = pick[..., 0] if ids is None else ids.gather(-1, pick)[..., 0]           # [R, K]
            if tokens is None:
                tokens = pick
            else:
                tokens[torch.tensor(rows, device=x.device)] = pick
        return [t[0] if len(t) == 1 else tuple(t) for t in tokens.tolist()]     # tokens: [B, K]

    def filter(self, logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int], style: str = "transformers",
               window: int | None = None) -> tuple[torch.Tensor | None, list[int], torch.Tensor | None,
                                                     torch.Tensor | None]:
        """Everything before the draw -> (greedy rows' argmax [B, K] or None, the sampled rows,
        their candidates' logits [R, K, c] (-inf: filtered out) and vocabulary ids [R, K, c], or
        all V logits and None when no filter is on)."""
        if logits.dim() == 2:
            logits = logits[:, None]
        B, K, V = logits.shape
        dev = logits.device
        chattts = style == "chattts"
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        ps = [seqs[i].params for i in rows]
        # one host-to-device copy: [R, K + 2] = temperatures, top-k, top-p (1 - top-p in ChatTTS style)
        ks = [p.top_k if 0 < p.top_k < V else V for p in ps]
        filt = torch.tensor([[*p.temperatures(K), k, (1 - p.top_p) if chattts else p.top_p]
                             for p, k in zip(ps, ks)], device=dev) if rows else None
        idx = torch.tensor(rows, device=dev) if 0 < len(rows) < B else None
        if chattts and rows:                      # the reference divides by the temperature first
            logits = logits.clone()
            if idx is None:
                logits /= filt[:, :K, None]
            else:
                logits[idx] /= filt[:, :K, None]
        logits = self.penalise(logits, seqs, window)
        if not chattts:
            logits = self.mask_stops(logits, seqs, stop_ids)
        greedy = None
        if len(rows) < B:
            greedy = (self.mask_stops(logits, seqs, stop_ids) if chattts else logits).argmax(dim=-1)
        if not rows:
            return greedy, rows, None, None
        R = len(rows)
        x = logits if idx is None else logits[idx]
        ids = None
        if chattts:
            c = max(max(ks), CHATTTS_MIN_KEEP) if any(k < V for k in ks) else V
            x, ids = chattts_candidates(x.reshape(-1, V), filt[:, K].long().repeat_interleave(K),
                                        filt[:, K + 1].repeat_interleave(K), c)
            x, ids = x.view(R, K, c), ids.view(R, K, c)
            x = self.mask_stops(x, [seqs[i] for i in rows], stop_ids, ids, first_too=True)
        else:
            x = x / filt[:, :K, None]                                    # [R, K, V]
            if any(k < V or p.top_p < 1 for p, k in zip(ps, ks)):
                x, ids = candidates(x.view(-1, V), filt[:, K].long().repeat_interleave(K),
                                    filt[:, K + 1].repeat_interleave(K), max(ks))
                x, ids = x.view(R, K, -1), ids.view(R, K, -1)
        return greedy, rows, x, ids

    def apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int],
                        window: int | None = None) -> torch.Tensor:
        """Repetition penalty and min_new_tokens' stop mask (transformers' order). logits: [B, K, V]"""
        return self.mask_stops(self.penalise(logits, seqs, window), seqs, stop_ids)

    @staticmethod
    def mask_stops(x: torch.Tensor, seqs: list[Sequence], stop_ids: set[int], ids: torch.Tensor | None = None,
                   first_too: bool = False) -> torch.Tensor:
        """Stop tokens -inf for rows below min_new_tokens (and, first_too, for an unseeded row's first
        token). x: [B, K, V], or candidates [B, K, c] with their vocabulary ids `ids`."""
        masked = [(i, s) for i, s in enumerate(seqs) if len(s.output_token_ids) < s.params.min_new_tokens
                  or (first_too and not s.output_token_ids and s.params.seed is None)]
        if not masked:
            return x
        x = x.clone()
        for i, s in masked:
            stop = sorted((set() if s.params.ignore_eos else stop_ids) | set(s.params.stop_token_ids))
            if not stop:
                continue
            if ids is None:
                x[i, :, stop] = float("-inf")
            else:
                x[i] = x[i].masked_fill(torch.isin(ids[i], torch.tensor(stop, device=x.device)), float("-inf"))
        return x

    def penalise(self, logits: torch.Tensor, seqs: list[Sequence], window: int | None = None) -> torch.Tensor:
        """Repetition penalty. logits: [B, K, V]"""
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
        return logits
