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

