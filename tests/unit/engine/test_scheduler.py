"""Scheduler: FCFS continuous batching, budgets, preemption, abort, the fair share between clients. Pure Python."""
import pytest

from velocity.engine.block_manager import BlockManager
from velocity.engine.scheduler import Scheduler
from velocity.engine.sequence import Sequence, SequenceStatus
from velocity.sampling_params import SamplingParams


def make(num_blocks=16, block_size=4, max_num_seqs=8, max_tokens=64, mode="recompute", cpu=0):
    bm = BlockManager(num_blocks, block_size, num_cpu_blocks=cpu, watermark=0.0)
    return Scheduler(bm, max_num_seqs, max_tokens, mode), bm


def add(s, rid, n, t0, client=None):
    q = Sequence(rid, list(range(100 * t0, 100 * t0 + n)), SamplingParams(), client=client)
    q.arrival_time = t0
    s.add(q)
    return q


def step(s):
    """Schedule and pretend the model ran: every scheduled sequence gets one token."""
    out = s.schedule()
    for q in out.seqs:
        q.num_computed_tokens = len(q)
        q.append(7)
    return out


def test_fcfs_and_prefills_join_running_decodes():
    s, _ = make(max_num_seqs=2)
    a, b, c = add(s, "a", 5, 0), add(s, "b", 3, 1), add(s, "c", 4, 2)
    out = s.schedule()
    assert [q.request_id for q in out.seqs] == ["a", "b"] and out.num_tokens == 8
    for q in out.seqs:
        q.num_computed_tokens = len(q)
        q.append(7)
    s.finish(a, "stop")
    out = s.schedule()
    assert [q.request_id for q in out.seqs] == ["b", "c"]
    assert [q.num_new_tokens for q in out.seqs] == [1, 4]    # b decodes, c prefills in the same step


def test_token_budget_holds_back_a_prefill():
    s, _ = make(max_tokens=10)
    add(s, "a", 6, 0)
    add(s, "b", 6, 1)
    out = step(s)
    assert [q.request_id for q in out.seqs] == ["a"]
    out = s.schedule()                                       # a decodes (1) + b prefills (6) <= 10
    assert [q.request_id for q in out.seqs] == ["a", "b"]


def test_preempts_newest_by_recompute_when_blocks_run_out():
    s, bm = make(num_blocks=4, block_size=2)
    a, b = add(s, "a", 4, 0), add(s, "b", 4, 1)                # 2 blocks each: cache full
    step(s)
    out = step(s)                                             # a needs a 3rd block: b goes
    assert out.preempted == [b] and [q.request_id for q in out.seqs] == ["a"]
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert s.waiting[0] is b and s.num_preemptions == 1
    assert len(b.output_token_ids) == 1                       # its output is kept and recomputed
    s.finish(a, "stop")
    out = s.schedule()
    assert out.seqs == [b]
    # prompt + output prefilled again, less its first block, still in the prefix cache
    assert b.num_cached_tokens == 2 and b.num_new_tokens == 3


def test_preempts_by_swap_and_swaps_back_in_first():
    s, bm = make(num_blocks=4, block_size=2, mode="swap", cpu=8)
    a, b = add(s, "a", 4, 0), add(s, "b", 4, 1)
    step(s)
    out = step(s)
    assert out.preempted == [b] and b.status is SequenceStatus.SWAPPED and len(out.swap_out) == 2
    add(s, "c", 2, 2)
    s.finish(a, "stop")
    out = s.schedule()
    assert [q.request_id for q in out.seqs] == ["b", "c"]     # b back before the newer c joins
    assert len(out.swap_in) == 2 and b.num_new_tokens == 1    # resumes decoding, no recompute


def test_a_lone_sequence_that_cannot_grow_preempts_itself():
    s, bm = make(num_blocks=2, block_size=2)
    a = add(s, "a", 4, 0)
    step(s)
    out = s.schedule()
    assert out.preempted == [a] and out.seqs == []
    assert bm.num_free_blocks == 2


def test_abort_frees_every_block_wherever_the_sequence_is():
    s, bm = make(num_blocks=5, block_size=2, mode="swap", cpu=4)
    a, b, c = add(s, "a", 4, 0), add(s, "b", 4, 1), add(s, "c", 4, 2)
    step(s)                                                    # a, b running; c waits
    assert bm.num_free_blocks == 1 and c.status is SequenceStatus.WAITING
    step(s)                                                    # a takes the last block, b is swapped
    assert a.status is SequenceStatus.RUNNING and b.status is SequenceStatus.SWAPPED
    for q in (a, b, c):
        s.finish(q, "abort")
        assert q.status is SequenceStatus.FINISHED and q.finish_reason == "abort"
    assert bm.num_free_blocks == 5 and len(bm.cpu_free) == 4
    assert not s.has_unfinished()


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_many_sequences_on_a_tiny_cache_all_finish(mode):
    s, bm = make(num_blocks=6, block_size=2, max_num_seqs=4, mode=mode, cpu=12)
    seqs = [add(s, f"r{i}", 3, i) for i in range(6)]
    for _ in range(500):
        if not s.has_unfinished():
            break
        out = step(s)
        for q in out.seqs:
            if len(q.output_token_ids) >= 6:
                s.finish(q, "length")
    assert all(q.is_finished and len(q.output_token_ids) == 6 for q in seqs)
    assert s.num_preemptions > 0 and bm.num_free_blocks == 6


def test_a_paused_sequence_sits_out_keeps_its_blocks_and_is_never_preempted():
    """Backpressure: a paused sequence is left out of every step, holds its blocks, is not the
    victim when blocks run out (the one that needs the block is), and comes back where it was."""
    s, bm = make(num_blocks=2, block_size=4)
    a, b = add(s, "a", 4, 0), add(s, "b", 4, 1)
    step(s)                                           # both prefilled: a block each, none free
    a.paused = True
    blocks = list(a.block_table)
    out = step(s)
    assert [q.request_id for q in out.seqs] == [] and out.preempted == [b]   # b needed a block: b, not a
    assert a.block_table == blocks and a.status is SequenceStatus.RUNNING and len(a) == 5
    assert b.status is SequenceStatus.WAITING and not step(s).seqs        # b waits for a's blocks
    a.paused = False
    assert [q.request_id for q in step(s).seqs] == ["a"] and len(a) == 6
    c = add(s, "c", 3, 2)
    c.paused = True                                   # a paused waiting sequence is not admitted
    s.finish(a, "stop")
    assert [q.request_id for q in step(s).seqs] == ["b"] and c.status is SequenceStatus.WAITING


def test_beside_decodes_a_burst_of_prompts_spreads_over_steps():
    """max_prefill_tokens: beside running decodes a step takes at most that many prompt tokens (a
    longer prompt alone), so a burst of new requests is admitted over several steps instead of
    one step that stalls the running streams; with nothing running, all the budget allows."""
    bm = BlockManager(256, 4, watermark=0.0)
    s = Scheduler(bm, 64, 4096, max_prefill_tokens=10)
    first = [add(s, f"r{i}", 6, i) for i in range(3)]
    out = step(s)
    assert [q.request_id for q in out.seqs] == ["r0", "r1", "r2"]       # nothing ran: no cap
    burst = [add(s, f"b{i}", 4, 10 + i) for i in range(6)]
    admitted = []
    for _ in range(3):
        out = step(s)
        new = [q.request_id for q in out.seqs if q in burst and len(q.output_token_ids) == 1]
        assert all(q in out.seqs for q in first)                          # the running ones every step
        assert sum(len(q.prompt_token_ids) for q in burst if q.request_id in new) <= 10
        admitted.append(new)
    assert admitted == [["b0", "b1"], ["b2", "b3"], ["b4", "b5"]]
    long = add(s, "long", 30, 20)                                          # over the cap: alone
    out = step(s)
    assert long in out.seqs and long.num_computed_tokens == 30


def test_a_new_client_takes_its_share_of_a_batch_that_one_client_fills():
    s, bm = make(num_blocks=64, max_num_seqs=4)
    flood = [add(s, f"a{i}", 3, i, client="a") for i in range(12)]
    step(s)
    assert {q.request_id for q in s.running} == {"a0", "a1", "a2", "a3"}
    b0, b1, b2 = (add(s, f"b{i}", 3, 20 + i, client="b") for i in range(3))
    out = step(s)                       # a runs 4, b none: a's newest two make room, one at a time
    assert out.preempted == [flood[3], flood[2]]
    assert [q.request_id for q in out.seqs] == ["a0", "a1", "b0", "b1"]
    assert flood[3].num_computed_tokens == 0 and flood[3] in s.waiting      # recomputed later
    out = step(s)                       # 2 and 2: b takes no more, and a none of b's
    assert not out.preempted and [q.request_id for q in out.seqs] == ["a0", "a1", "b0", "b1"]
    s.finish(b0, "stop")
    out = step(s)                       # a slot is free: b runs fewer, so b2 goes first
    assert [q.request_id for q in out.seqs] == ["a0", "a1", "b1", "b2"]
    for q in [*flood, b1, b2]:
        s.finish(q, "stop")
    assert bm.num_free_blocks == 64 and not s.has_unfinished()


def test_between_clients_admission_takes_turns_and_one_client_is_fcfs():
    s, _ = make(num_blocks=64, max_num_seqs=8)
    for i in range(4):
        add(s, f"a{i}", 3, i, client="a")
    for i in range(2):
        add(s, f"b{i}", 3, 10 + i, client="b")
    out = s.schedule()
    assert [q.request_id for q in out.seqs] == ["a0", "b0", "a1", "b1", "a2", "a3"]
    s2, _ = make(num_blocks=64, max_num_seqs=3)
    for i in range(5):
        add(s2, f"q{i}", 3, i)
    out = step(s2)
    assert [q.request_id for q in out.seqs] == ["q0", "q1", "q2"] and not out.preempted


def test_a_client_whose_blocks_fill_the_cache_gives_a_new_client_room():
    s, bm = make(num_blocks=4, block_size=4, max_num_seqs=8)
    a = [add(s, f"a{i}", 3, i, client="a") for i in range(4)]      # one block each: the cache is full
    step(s)
    b = add(s, "b", 3, 10, client="b")
    out = step(s)
    assert out.preempted == [a[3]] and b in out.seqs and bm.num_free_blocks == 0
