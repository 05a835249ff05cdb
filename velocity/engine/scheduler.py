"""Continuous-batching scheduler: FCFS within a client, a fair share between clients, preemption.
Pure Python, no torch."""
from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from velocity.engine.block_manager import BlockManager
from velocity.engine.sequence import Sequence, SequenceStatus

logger = logging.getLogger(__name__)


@dataclass
class SchedulerOutput:
    """What one engine step computes: each sequence's uncomputed tokens, plus block copies."""

    seqs: list[Sequence] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)   # (cpu, gpu)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu, cpu)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


class Scheduler:
    """Decodes of running sequences first, then swapped-in sequences, then new prefills
    join the same step while budgets and blocks allow (beside decodes, max_prefill_tokens of
    them), shared fairly between clients (`seq.client`: see _admit). When a running sequence
    needs a block and none is free, the newest running sequence is preempted (recompute or swap).
    A paused sequence (`seq.paused`: its stream has enough audio waiting for the vocoder) is
    left out of every step until resumed: it keeps its blocks and is never preempted.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption_mode: str = "recompute", max_prefill_tokens: int = 0) -> None:
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefill_tokens = max_prefill_tokens     # beside decodes (0: no cap); a longer prompt goes alone
        self.preemption_mode = preemption_mode
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        # 1. running decodes, oldest first; preempt the newest when blocks run out
        paused = [s for s in self.running if s.paused]
        running = sorted((s for s in self.running if not s.paused), key=lambda s: s.arrival_time)
        kept: list[Sequence] = []
        lo, hi = 0, len(running)            # running[lo:hi] to place; victims come from its end
        while lo < hi:
            seq = running[lo]
            lo += 1
            while not self.bm.can_append(seq):
                if hi > lo:
                    hi -= 1
                    victim = running[hi]
                else:
                    victim = seq
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                self.bm.append_slot(seq)
                kept.append(seq)
        self.running = kept
        budget = self.max_num_batched_tokens - len(kept)
        # 2. swapped sequences come back before anything new (FCFS)
        swapped = [s for s in self.swapped if not s.paused]
        while swapped and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = swapped[0]
            if not self.bm.can_swap_in(seq) or budget < 1:
                break
            self.swapped.remove(swapped.pop(0))
            out.swap_in += self.bm.swap_in(seq)
            self.bm.append_slot(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget -= 1
        # 3. new prefills join while budgets and blocks allow (none while others are swapped out);
        #    beside decodes at most max_prefill_tokens of them (a longer prompt alone): a burst of
        #    new requests spreads over several steps, each a little longer, instead of one that
        #    stalls every running stream
        waiting = [s for s in self.waiting if not s.paused] if self.waiting else []
        if waiting and not swapped:
            self._admit(waiting, budget, self.max_prefill_tokens if kept and self.max_prefill_tokens else budget, out)
        out.seqs = list(self.running)
        self.running += paused
        return out

    def _admit(self, waiting: list[Sequence], budget: int, cap: int, out: SchedulerOutput) -> None:
        """Waiting sequences into the step, the client with the fewest running first (FCFS within
        a client, and among clients running as many). A client that finds no room (no slot, or no
        blocks) takes it from the client running the most, if that one runs at least two more:
        its newest sequence is preempted (recompute). So the counts move towards equal and never
        swap places, and one client alone is plain FCFS. The first sequence that does not fit
        ends the admissions (none is skipped)."""
        counts = Counter(s.client for s in self.running)
        queues: dict[Hashable, deque[tuple[int, Sequence]]] = {}
        for i, seq in enumerate(waiting):
            queues.setdefault(seq.client, deque()).append((i, seq))
        taken = 0
        while queues:
            client = min(queues, key=lambda c: (counts[c], queues[c][0][0]))
            seq = queues[client][0][1]
            hits = self.bm.prefix_hits(seq)
            new_tokens = max(len(seq) - len(hits) * self.bm.block_size, 1)
            if (new_tokens > budget and self.running) or (taken and taken + new_tokens > cap):
                break
            while (len(self.running) >= self.max_num_seqs or not self.bm.can_allocate(seq, hits)) \
                    and (victim := self._fair_victim(counts, counts[client])) is not None:
                self.running.remove(victim)
                counts[victim.client] -= 1
                self._preempt(victim, out, swap=False)
                hits = self.bm.prefix_hits(seq)
            if len(self.running) >= self.max_num_seqs or not self.bm.can_allocate(seq, hits):
                break
            self.bm.allocate(seq)
            self.waiting.remove(seq)
            queues[client].popleft()
            if not queues[client]:
                del queues[client]
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            counts[client] += 1
            budget -= seq.num_new_tokens
            taken += seq.num_new_tokens

    def _fair_victim(self, counts: Counter, fewer: int) -> Sequence | None:
        """The newest running sequence of the client running the most, if that is at least two
        more than `fewer` (what the client that needs room runs)."""
        client, n = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
        if n < fewer + 2:
            return None
        return max((s for s in self.running if s.client == client), key=lambda s: s.arrival_time)

    def _preempt(self, seq: Sequence, out: SchedulerOutput, swap: bool = True) -> None:
        self.num_preemptions += 1
        out.preempted.append(seq)
        if swap and self.preemption_mode == "swap" and self.bm.can_swap_out(seq):
            out.swap_out += self.bm.swap_out(seq)
            seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(seq)
            logger.debug("preempted %s by swap", seq.request_id)
        else:  # recompute: drop the KV, prefill prompt + outputs again later
            self.bm.free_seq(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)
            logger.debug("preempted %s by recompute", seq.request_id)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Finish seq (stop, length or abort) and free its blocks at once."""
        seq.finish(reason)
        self.bm.free_seq(seq)
        for q in (self.waiting, self.swapped):
            if seq in q:
                q.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
