"""Batched sampling where every row keeps its own parameters and its own random stream.

Logits are [B, K, V]: K = 1 for text, K = num_vq codebooks for an audio frame. One step's
sampling is a fixed handful of tensor ops whatever the batch (no per-row ops: on a GPU each
would be a kernel launch), and with top-k the draw runs over each row's k candidates, not all V.
"""
from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15                # splitmix64's increment
MUL1, MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB   # splitmix64's finaliser multipliers
_entropy = random.Random()                 # keys of unseeded rows
CHATTTS_MIN_KEEP = 3                       # the reference's top-p and top-k keep at least 3 candidates


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device`, without waiting for the work queued there: on CUDA through pinned
    memory and a non-blocking copy (a copy from pageable memory synchronizes the stream, so the
    host would sit idle while the model runs); on the CPU the tensor itself."""
    if torch.device(device).type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def noise_key(seed: int, step: int) -> int:
    """A seeded row's noise key at one step (how many tokens it has generated so far)."""
    return mix64(mix64(seed) + step * GOLDEN)


def noise_keys(seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """noise_key of each row at once: seeds and steps uint64 [R] -> [R] (numpy's uint64 wraps as & M64 does)."""
    return mix64_array(mix64_array(seeds) + steps * np.uint64(GOLDEN))


def random_key() -> int:
    """An unseeded row's noise key: fresh entropy."""
    return _entropy.getrandbits(64)


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


def exponential_noise(keys: list[int] | np.ndarray, K: int, c: int) -> torch.Tensor:
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
                       min_keep: int = CHATTTS_MIN_KEEP, sort_rows: Callable | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ChatTTS reference's order and arithmetic: transformers' TopPLogitsWarper on the whole
    distribution (ascending sort and cumsum, drop where the cumulative probability <= 1 - top_p),
    then TopKLogitsWarper (drop what is below the k-th value), each keeping at least `min_keep`
    (the reference's 3). x: [R, V]; ks: [R] (V = off); tails: [R] float32 1 - top_p, computed in
    Python as the warper does; c >= every max(k, min_keep) -> the c best of the rest, ([R, c], [R, c]).
    sort_rows: the C++ kernel (`cpu_kernels.sort_rows_kernel`), CPU float32 only.

    The cumulative sum only grows, so top-p drops a row's n lowest logits: its threshold is the
    (n+1)-th lowest (a tie across that line keeps both tokens; the warper's unstable sort keeps
    an arbitrary one). Both filters keep a row's best tokens, so they act on its c best alone:
    one sort of values and the c best, with no scatter back over V."""
    V = x.shape[-1]
    if sort_rows is not None:       # one radix sort gives both, rows in parallel
        asc, vals, ids = sort_rows(x.detach().contiguous(), c)
    else:
        if x.device.type == "cpu":      # numpy sorts values alone, torch always orders indices too
            asc = torch.from_numpy(np.sort(x.detach().contiguous().numpy(), axis=-1))
        else:
            asc = x.sort(dim=-1).values                                      # [R, V] ascending
        vals, ids = x.topk(c, dim=-1)                                        # [R, c] descending
    n = (asc.softmax(dim=-1).cumsum(dim=-1) <= tails[:, None]).sum(dim=-1).clamp(max=V - min_keep)
    vals = vals.masked_fill(vals < asc.gather(1, n[:, None]), float("-inf"))   # top-p
    kth = vals.gather(1, ks.clamp(min=min_keep, max=c)[:, None] - 1)         # each row's k-th kept value
    return vals.masked_fill(vals < kth, float("-inf")), ids                  # top-k


@dataclass(slots=True)
class SamplingBatch:
    """What the sampler needs of one head's batch of B rows, prepared by the runner
    (`sampling_rows.sampling_batch`): tensors and plain numbers, no sequences."""
    style: str                                 # "transformers" or "chattts" (see Sampler)
    rows: torch.Tensor                         # [R] the rows that sample; the others are greedy
    temperatures: torch.Tensor                 # [R, K]
    top_k: torch.Tensor                        # [R] long, V = off
    top_p: torch.Tensor                        # [R] top-p (1 = off); in ChatTTS style the tail 1 - top_p
    width: int                                 # candidates drawn over: the largest k in play (V: none)
    filtered: bool                             # some row has top-k or top-p on (transformers style)
    keys: np.ndarray                           # [R] uint64 noise keys (`noise_key`, `random_key`)
    stop_mask: torch.Tensor | None = None      # [B, V] bool: the stop tokens of rows under min_new_tokens
    first_stop_mask: torch.Tensor | None = None   # [R, V] ChatTTS, the sampled rows: also an unseeded first token
    penalty_rows: torch.Tensor | None = None   # [P] rows with a repetition penalty
    penalty_ids: torch.Tensor | None = None    # [P, K, L] long: each row's history, padded with V
    penalty_once: torch.Tensor | None = None   # [P] bool: transformers' rule, each earlier token once
    penalty: torch.Tensor | None = None        # [P] the penalties


class Sampler:
    """logits [B, K, V] + a SamplingBatch -> one token per row and codebook, [B, K] long.

    style "transformers" (Hugging Face generate's order): repetition penalty and the min-tokens
    stop mask, then for sampled rows temperature (one per codebook if given), top-k, top-p.
    style "chattts" (the reference's): temperature, repetition penalty, top-p then top-k (both
    keep at least 3, `chattts_candidates`), then the stop mask, which also keeps an unseeded
    row's first token from being a stop token (the reference draws such a first frame again:
    with independent codebooks that is the same distribution).
    Then an exponential-race draw over the candidates. A seeded row's noise is a function of
    its seed and step alone (`exponential_noise`), so its tokens don't depend on its
    neighbours. Greedy rows take the exact argmax. sort_rows: the C++ sort for ChatTTS's filters
    on CPU float32 (`cpu_kernels.sort_rows_kernel`; None: numpy's sort and torch's topk).
    """

    def __init__(self, sort_rows: Callable | None = None) -> None:
        self.sort_rows = sort_rows

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
        greedy, x, ids = self.filter(logits, b)
        if x is None:
            return greedy
        noise = to_device(exponential_noise(b.keys, x.shape[1], x.shape[-1]), x.device)
        pick = race(x, noise)                                            # [R, K]
        pick = pick if ids is None else ids.gather(-1, pick[..., None])[..., 0]
        if greedy is None:
            return pick
        greedy[b.rows] = pick
        return greedy

    def filter(self, logits: torch.Tensor, b: SamplingBatch) -> tuple[torch.Tensor | None, torch.Tensor | None,
                                                                      torch.Tensor | None]:
        """Everything before the draw -> (greedy argmax [B, K] or None when every row samples,
        the sampled rows' candidates' logits [R, K, c] (-inf: filtered out) and vocabulary ids
        [R, K, c], or all V logits and None when no filter is on; None, None when none samples)."""
        if logits.dim() == 2:
            logits = logits[:, None]
        B, K, V = logits.shape
        R = b.rows.numel()
        chattts = b.style == "chattts"
        if chattts and R:                           # the reference divides by the temperature first
            logits = logits.clone()
            if R == B:
                logits /= b.temperatures[:, :, None]
            else:
                logits[b.rows] /= b.temperatures[:, :, None]
        logits = self.penalise(logits, b)
        if not chattts:
            logits = self.mask_stops(logits, b.stop_mask)
        greedy = None
        if R < B:
            greedy = (self.mask_stops(logits, b.stop_mask) if chattts else logits).argmax(dim=-1)
        if not R:
            return greedy, None, None
        x = logits if R == B else logits[b.rows]
        ids = None
        if chattts:
            c = b.width
            flat = x.reshape(-1, V)
            x, ids = chattts_candidates(flat, b.top_k.repeat_interleave(K), b.top_p.repeat_interleave(K), c,
                                        sort_rows=self.sort_rows if flat.dtype == torch.float32 and
                                        flat.device.type == "cpu" else None)
            x, ids = x.view(R, K, c), ids.view(R, K, c)
            x = self.mask_stops(x, b.first_stop_mask, ids)
        else:
            x = x / b.temperatures[:, :, None]                           # [R, K, V]
            if b.filtered:
                x, ids = candidates(x.view(-1, V), b.top_k.repeat_interleave(K), b.top_p.repeat_interleave(K),
                                    b.width)
                x, ids = x.view(R, K, -1), ids.view(R, K, -1)
        return greedy, x, ids

    @staticmethod
    def mask_stops(x: torch.Tensor, mask: torch.Tensor | None, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Masked tokens -inf. x: [B, K, V] and mask [B, V], or candidates [B, K, c] with their
        vocabulary ids `ids`."""
        if mask is None:
            return x
        mask = mask[:, None, :].expand(-1, x.shape[1], -1)                # [B, K, V]
        return x.masked_fill(mask if ids is None else mask.gather(2, ids), float("-inf"))

    @staticmethod
    def penalise(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
        """Repetition penalty. logits: [B, K, V]"""
        if b.penalty_rows is None:
            return logits
        P = b.penalty_rows.numel()
        sub = logits if P == logits.shape[0] else logits[b.penalty_rows]
        sub = penalise_rows(sub, b.penalty_ids, b.penalty, b.penalty_once)
        if P == logits.shape[0]:
            return sub
        logits = logits.clone()
        logits[b.penalty_rows] = sub
        return logits


def penalise_rows(x: torch.Tensor, ids: torch.Tensor, penalty: torch.Tensor,
                  once: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's repetition penalty over its history, as a new tensor: a logit of a token seen n
    times is multiplied (< 0) or divided (>= 0) by penalty ** n (n at most 1 where `once`).
    x: [P, K, V]; ids: [P, K, L] long, padded with V; penalty: [P]; once: [P] bool or None"""
    P, K, V = x.shape
    counts = torch.zeros(P, K, V + 1, device=x.device).scatter_add_(
        2, ids, torch.ones(ids.shape, device=x.device))                    # pad: an extra column V, dropped
    n = counts.gather(2, ids)                                              # [P, K, L] occurrences of each
    if once is not None:
        n = torch.where(once[:, None, None], n.clamp(max=1), n)
    alpha = penalty[:, None, None] ** n
    sub = torch.cat([x, x.new_zeros(P, K, 1)], dim=-1)                     # a copy, with the pad column
    got = sub.gather(2, ids)                        # only the history's logits change: a repeat writes the same
    return sub.scatter_(2, ids, torch.where(got < 0, got * alpha, got / alpha))[..., :V]


def race(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The exponential race, a categorical draw from softmax(x): argmax of exp(x - max) / noise.
    (Left unnormalised: the sum's rounding would depend on how many candidates there are, and the
    draw should not.) x: [..., c] (-inf: not a candidate); noise: Exp(1) [..., c] -> [...] index"""
    return ((x - x.amax(dim=-1, keepdim=True)).exp() / noise).argmax(dim=-1)
