"""The graph sampler's inputs: a decode batch's sequences as int64 rows of `GraphSampler`'s
columns, written into the runner's pinned host buffer and copied with the model's inputs."""
from __future__ import annotations

import numpy as np

from velocity.engine.graph_sampler import MAX_STOPS, GraphSampler
from velocity.engine.sampler import noise_keys, random_key
from velocity.engine.sequence import Sequence


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

