"""The samplers' inputs, made from a batch's sequences so that the samplers see only tensors:
the eager sampler's batch (sampling_batch: SamplingBatch), and the graph sampler's int64 rows of
`GraphSampler`'s columns (SamplingRows), written into the runner's pinned host buffer and copied
with the model's inputs."""
from __future__ import annotations

import numpy as np
import torch

from velocity.engine.graph_sampler import MAX_STOPS, GraphSampler
from velocity.engine.sampler import CHATTTS_MIN_KEEP, M64, SamplingBatch, noise_keys, random_key, to_device
from velocity.engine.sequence import Sequence


def sampling_batch(seqs: list[Sequence], K: int, V: int, stop_ids: set[int], style: str = "transformers",
                   window: int | None = None, device: torch.device | str = "cpu") -> SamplingBatch:
    """The sampler's tensors for one head's rows: K codebooks of V tokens; stop_ids: the head's
    stop tokens; window: the repetition window of requests that set none (the head's default)."""
    chattts = style == "chattts"
    rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
    ps = [seqs[i].params for i in rows]
    ks = [p.top_k if 0 < p.top_k < V else V for p in ps]
    R = len(rows)
    if chattts:
        width = max(max(ks), CHATTTS_MIN_KEEP) if any(k < V for k in ks) else V
    else:
        width = max(ks, default=V)
    seeds = [seqs[i].params.seed for i in rows]
    keys = noise_keys(np.array([0 if x is None else x & M64 for x in seeds], dtype=np.uint64),
                      np.array([len(seqs[i].output_token_ids) for i in rows], dtype=np.uint64))
    for j, x in enumerate(seeds):
        if x is None:
            keys[j] = random_key()
    # every number goes over in two host-to-device copies, one of integers and one of floats:
    # ints = rows [R], top-k [R], then with penalties rows [P], once [P], histories [P, L, K];
    # floats = temperatures and top-p (1 - top-p in ChatTTS style) [R, K + 1], then penalties [P]
    ints: list = [np.array(rows, dtype=np.int64), np.array(ks, dtype=np.int64)]
    floats: list = [np.array([[*p.temperatures(K), (1 - p.top_p) if chattts else p.top_p] for p in ps],
                             dtype=np.float32).reshape(R * (K + 1))]
    pen = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1.0]
    if pen:
        hists, once = [], []
        for i in pen:
            s = seqs[i]
            w = s.params.repetition_window or window
            # audio frames: only generated frames count (the prompt is text)
            if w is not None:
                hists.append(s.output_array()[-w:])
            elif K == 1:                                # text: the prompt counts too
                hists.append(np.array(s.token_ids, dtype=np.int64)[:, None])
            else:
                hists.append(s.output_array())
            once.append(w is None)   # transformers' rule: every earlier token penalised once
        L = max(1, *map(len, hists))
        ids = np.full((len(pen), L, K), V, dtype=np.int64)                       # padded with V
        for j, h in enumerate(hists):
            ids[j, :len(h)] = h[:, :K]
        ints += [np.array(pen, dtype=np.int64), np.array(once, dtype=np.int64), ids.reshape(-1)]
        floats.append(np.array([seqs[i].params.repetition_penalty for i in pen], dtype=np.float32))
    ints_t = to_device(torch.from_numpy(np.concatenate(ints)), device)
    floats_t = to_device(torch.from_numpy(np.concatenate(floats)), device)
    filt = floats_t[:R * (K + 1)].view(R, K + 1)
    batch = SamplingBatch(style, ints_t[:R], filt[:, :K], ints_t[R:2 * R], filt[:, K], width,
                          any(k < V or p.top_p < 1 for p, k in zip(ps, ks)), keys)
    if pen:
        P = len(pen)
        at = 2 * R
        batch.penalty_rows = ints_t[at:at + P]
        batch.penalty_once = ints_t[at + P:at + 2 * P].bool()
        batch.penalty_ids = ints_t[at + 2 * P:].view(P, L, K).transpose(1, 2)          # [P, K, L]
        batch.penalty = floats_t[R * (K + 1):]

    def stops(s: Sequence) -> list[int]:
        return [t for t in s.params.stops(stop_ids) if t < V]

    def stop_mask(some: list[Sequence], first_too: bool) -> torch.Tensor | None:
        masked = [(i, stops(s)) for i, s in enumerate(some) if len(s.output_token_ids) < s.params.min_new_tokens
                  or (first_too and not s.output_token_ids and s.params.seed is None)]
        if not any(stop for _, stop in masked):
            return None
        mask = torch.zeros(len(some), V, dtype=torch.bool)
        for i, stop in masked:
            mask[i, stop] = True
        return to_device(mask, device)

    batch.stop_mask = stop_mask(seqs, False)
    batch.first_stop_mask = stop_mask([seqs[i] for i in rows], True) if chattts and rows else None
    return batch


class SamplingBatches:
    """The eager sampler's batch of each head, kept from one step to the next (a persistent batch,
    as vLLM V1's InputBatch keeps its sampling tensors). While a head's batch holds the same
    sequences in the same order as the step before (a run of decodes), each one token further, its
    fixed parts (which rows sample, temperatures, top-k, top-p, the penalties) are the last
    step's, the seeded rows' noise keys advance a step (numpy, all at once), and each penalty
    row's history takes the token it sampled into a ring of its window (the penalty counts the
    window's tokens, in any order). Any other batch is made whole (sampling_batch), and is kept
    only where that holds for the next step too: no stop mask in play (min_new_tokens passed, no
    first token) and every penalty over a window."""

    def __init__(self) -> None:
        self.kept: dict[str, _Kept] = {}

    def batch(self, head: str, seqs: list[Sequence], K: int, V: int, stop_ids: set[int], style: str = "transformers",
              window: int | None = None, device: torch.device | str = "cpu") -> SamplingBatch:
        """sampling_batch's batch for this head's rows (the same values, made faster where kept)."""
        kept = self.kept.get(head)
        if kept is not None and kept.follows(seqs):
            return kept.next_batch(device)
        b = sampling_batch(seqs, K, V, stop_ids, style, window, device)
        self.kept[head] = _Kept.of(seqs, b, K, V, window)
        return b

    def sampled(self, head: str, tokens: np.ndarray) -> None:
        """This step's tokens of the head's rows, [b, K] (the penalty histories take them)."""
        if (kept := self.kept.get(head)) is not None:
            kept.take(tokens)


class _Kept:
    """One head's batch as SamplingBatches keeps it (see there)."""

    def __init__(self, seqs: list[Sequence], batch: SamplingBatch, seeds: np.ndarray, unseeded: np.ndarray,
                 rows: np.ndarray, pen: np.ndarray, windows: np.ndarray, ring: np.ndarray | None) -> None:
        self.ids = [s.seq_id for s in seqs]
        self.n_out = np.array([len(s.output_token_ids) for s in seqs], dtype=np.int64)   # [B] at this batch
        self.batch, self.seeds, self.unseeded, self.rows = batch, seeds, unseeded, rows
        self.pen, self.windows, self.ring = pen, windows, ring
        self.taken = False

    @classmethod
    def of(cls, seqs: list[Sequence], b: SamplingBatch, K: int, V: int, window: int | None) -> "_Kept | None":
        """The batch kept for the next step, or None where the next one must be made whole."""
        if b.stop_mask is not None or b.first_stop_mask is not None:
            return None
        if any(len(s.output_token_ids) + 1 < s.params.min_new_tokens for s in seqs):
            return None                          # a stop mask comes back while under min_new_tokens
        rows = np.array([i for i, s in enumerate(seqs) if not s.params.greedy], dtype=np.int64)
        seeds = np.array([0 if seqs[i].params.seed is None else seqs[i].params.seed & M64 for i in rows],
                         dtype=np.uint64)
        unseeded = np.array([j for j, i in enumerate(rows) if seqs[i].params.seed is None], dtype=np.int64)
        pen = np.array([i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1.0], dtype=np.int64)
        windows = np.array([seqs[i].params.repetition_window or window or 0 for i in pen], dtype=np.int64)
        ring = None
        if len(pen):
            if not windows.all():                # a history without a window: made whole each step
                return None
            ring = np.full((len(pen), int(windows.max()), K), V, dtype=np.int64)
            for j, i in enumerate(pen):
                h, n = seqs[i].output_array()[-windows[j]:], len(seqs[i].output_token_ids)
                ring[j, np.arange(n - len(h), n) % windows[j]] = h[:, :K]
        return cls(seqs, b, seeds, unseeded, rows, pen, windows, ring)

    def follows(self, seqs: list[Sequence]) -> bool:
        """seqs are the kept batch's, in its order, each one token further (its tokens taken)."""
        return self.taken and len(seqs) == len(self.ids) and all(
            s.seq_id == i for s, i in zip(seqs, self.ids))

    def take(self, tokens: np.ndarray) -> None:
        """The tokens the kept batch's rows sampled [B, K]: into the penalty rings."""
        if self.ring is not None:
            slot = self.n_out[self.pen] % self.windows
            self.ring[np.arange(len(self.pen)), slot] = tokens[self.pen, :self.ring.shape[2]]
        self.n_out += 1
        self.taken = True

    def next_batch(self, device: torch.device | str) -> SamplingBatch:
        """The next step's batch: the kept one with this step's noise keys and histories."""
        self.taken = False
        b = self.batch
        keys = noise_keys(self.seeds, self.n_out[self.rows].astype(np.uint64)) if len(self.rows) else b.keys
        for j in self.unseeded:
            keys[j] = random_key()
        out = SamplingBatch(b.style, b.rows, b.temperatures, b.top_k, b.top_p, b.width, b.filtered, keys,
                            None, None, b.penalty_rows, b.penalty_ids, b.penalty_once, b.penalty)
        if self.ring is not None:
            # (on a GPU a copy; on the CPU the ring itself, which the next take() writes once this step is done)
            out.penalty_ids = to_device(torch.from_numpy(self.ring), device).transpose(1, 2)    # [P, K, L]
        return out


class SamplingRows:
    """Fills `GraphSampler` rows from sequences; the parts of a row that do not change from step to
    step are kept for the sequences of the last step only."""

    def __init__(self, gs: GraphSampler) -> None:
        self.gs = gs
        self.rows: dict[int, tuple] = {}        # seq_id -> (its fixed row, seed, min tokens, history frames)
        self.pad = self._row_of(None)[0]

    def _row_of(self, s: Sequence | None) -> tuple | None:
        """A sequence's row of the columns that do not change from step to step, or None where it
        cannot be sampled here. s None: a padding row (greedy, no penalty)."""
        gs = self.gs
        K, V = gs.K, gs.V
        row = np.full(gs.columns, V, dtype=np.int64)
        row[0], row[2], row[3] = 0, 1, 0
        floats = np.ones(K + 2, dtype=np.float32)
        floats[K] = 0.0
        window = None
        if s is not None:
            p = s.params
            stops = [t for t in p.stops(gs.stop_ids) if t < V]
            window = p.repetition_window or gs.L
            if s.head != gs.head_name or len(stops) > MAX_STOPS or (p.repetition_penalty != 1.0 and window > gs.L):
                return None
            row[4:4 + len(stops)] = sorted(stops)
            if not p.greedy:
                row[1] = p.top_k if 0 < p.top_k < V else V
                row[2] = 0
                floats[:K] = p.temperatures(K)
                floats[K] = 1 - p.top_p                     # in Python, as the warper computes it
            floats[K + 1] = p.repetition_penalty
            if p.repetition_penalty == 1.0:
                window = 0                                  # no history needed
        row[gs.floats:] = floats.view(np.int32)
        return row, None if s is None else s.params.seed, 0 if s is None else s.params.min_new_tokens, window

    def fill(self, rows: np.ndarray, seqs: list[Sequence]) -> bool:
        """Write the batch's inputs into rows [B, columns] (a view of the runner's host buffer), and
        padding rows after them up to rows' end. False: some row cannot be sampled here."""
        got = []
        for s in seqs:
            r = self.rows.get(s.seq_id)
            if r is None and (r := self._row_of(s)) is None:
                return False
            got.append(r)
        self.rows = {s.seq_id: r for s, r in zip(seqs, got)}       # only this step's: bounded
        B = len(seqs)
        n_out = np.array([len(s.output_token_ids) for s in seqs], dtype=np.int64)
        if not n_out.all():             # a first token: an unseeded one must not stop (the eager sampler)
            return False
        rows[:B] = np.stack([r[0] for r in got])
        rows[B:] = self.pad
        seeded = [i for i, r in enumerate(got) if r[1] is not None and r[0][2] == 0]
        if seeded:
            seeds = np.array([got[i][1] & ((1 << 64) - 1) for i in seeded], dtype=np.uint64)
            rows[seeded, 0] = noise_keys(seeds, n_out[seeded].astype(np.uint64)).view(np.int64)
        for i, r in enumerate(got):
            if r[1] is None and r[0][2] == 0:
                rows[i, 0] = np.array(random_key(), dtype=np.uint64).view(np.int64)
            if n_out[i] < r[2]:
                rows[i, 3] = 1
            if r[3]:                                                # the penalty's history, frames [L, K]
                h = seqs[i].output_array()[-r[3]:]
                rows[i, self.gs.hist:self.gs.hist + h.size] = h.reshape(-1)
        return True

