"""Block manager: pure Python bookkeeping of KV blocks."""
import subprocess
import sys

import pytest

from velocity.engine.block_manager import BlockManager
from velocity.engine.sequence import Sequence
from velocity.sampling_params import SamplingParams


def seq(tokens, salt=None, rid="r"):
    return Sequence(rid, list(tokens), SamplingParams(), cache_salt=salt)


def test_block_manager_and_scheduler_import_without_torch():
    code = ("import sys, velocity.engine.block_manager, velocity.engine.scheduler; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_allocate_and_free_return_every_block():
    bm = BlockManager(num_blocks=10, block_size=4, watermark=0.0)
    s = seq(range(10))                              # 3 blocks: 4 + 4 + 2
    assert bm.can_allocate(s)
    bm.allocate(s)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3
    assert bm.num_free_blocks == 7
    assert s.num_computed_tokens == 0
    bm.free_seq(s)
    assert bm.num_free_blocks == 10 and s.block_table == []


def test_append_slot_takes_a_block_only_at_a_boundary():
    bm = BlockManager(num_blocks=10, block_size=4, watermark=0.0)
    s = seq(range(4))
    bm.allocate(s)
    assert len(s.block_table) == 1
    s.append(99)                                    # 5 tokens: needs a second block
    bm.append_slot(s)
    assert len(s.block_table) == 2
    s.append(98)
    bm.append_slot(s)
    assert len(s.block_table) == 2 and bm.num_free_blocks == 8


def test_prefix_hit_shares_blocks_and_counts_refs():
    bm = BlockManager(num_blocks=10, block_size=4, watermark=0.0)
    a, b = seq(range(10), rid="a"), seq([*range(8), 50, 51, 52], rid="b")
    bm.allocate(a)
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]     # the two full shared blocks
    assert b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    bm.free_seq(a)
    assert [bm.blocks[i].ref_count for i in b.block_table] == [1, 1, 1]
    bm.free_seq(b)
    assert bm.num_free_blocks == 10


def test_prefix_hit_after_free_and_whole_prompt_hit_recomputes_last_token():
    bm = BlockManager(num_blocks=10, block_size=4, watermark=0.0)
    a = seq(range(8))
    bm.allocate(a)
    blocks = list(a.block_table)
    bm.free_seq(a)                                    # freed but still cached
    b = seq(range(8))
    bm.allocate(b)
    assert b.block_table == blocks and b.num_cached_tokens == 8
    assert b.num_computed_tokens == 7                 # the last token runs again for its logits


def test_prefix_miss_on_different_tokens_salt_or_hash_collision():
    bm = BlockManager(num_blocks=20, block_size=4, watermark=0.0)
    a = seq(range(8), salt="spk-a")
    bm.allocate(a)
    assert bm.prefix_hits(seq(range(8), salt="spk-b")) == []        # other speaker: no sharing
    assert bm.prefix_hits(seq([0, 1, 2, 7, 4, 5, 6, 7], salt="spk-a")) == []
    assert len(bm.prefix_hits(seq(range(8), salt="spk-a"))) == 2
    # a forged hash entry pointing at a block with other tokens must not count as a hit
    h = next(iter(bm.cached))
    bm.blocks[bm.cached[h]].token_ids = (9, 9, 9, 9)
    assert bm.prefix_hits(seq(range(8), salt="spk-a")) == []


def test_cached_blocks_are_evicted_least_recently_freed_first():
    bm = BlockManager(num_blocks=4, block_size=2, watermark=0.0)
    a, b = seq([1, 2], rid="a"), seq([3, 4], rid="b")
    bm.allocate(a)
    bm.allocate(b)
    bm.free_seq(a)
    bm.free_seq(b)
    assert len(bm.cached) == 2
    c = seq([5, 6, 7, 8, 9, 10], rid="c")             # needs 3 of the 4 blocks: evicts a's, not b's
    bm.allocate(c)
    assert bm.prefix_hits(seq([1, 2])) == []
    assert len(bm.prefix_hits(seq([3, 4]))) == 1


def test_watermark_blocks_admission():
    bm = BlockManager(num_blocks=10, block_size=4, watermark=0.2)    # keep 2 free
    assert bm.can_allocate(seq(range(32)))                           # 8 blocks, leaves 2
    assert not bm.can_allocate(seq(range(33)))                       # 9 blocks


def test_swap_round_trip():
    bm = BlockManager(num_blocks=8, block_size=4, num_cpu_blocks=8, watermark=0.0)
    s = seq(range(10))
    bm.allocate(s)
    s.num_computed_tokens = 10
    gpu_blocks = list(s.block_table)
    assert bm.can_swap_out(s)
    out = bm.swap_out(s)
    assert [g for g, _ in out] == gpu_blocks and s.block_table == []
    assert bm.num_free_blocks == 8 and s.num_computed_tokens == 10
    assert bm.can_swap_in(s)
    back = bm.swap_in(s)
    assert [c for c, _ in back] == [c for _, c in out]                # same cpu blocks come back
    assert s.block_table == [g for _, g in back] and bm.num_free_blocks == 5
    bm.free_seq(s)
    assert bm.num_free_blocks == 8 and len(bm.cpu_free) == 8


def test_forget_hashes_drops_cached_blocks():
    bm = BlockManager(num_blocks=8, block_size=4, watermark=0.0)
    a = seq(range(8))
    bm.allocate(a)
    bm.forget_hashes(a)
    bm.free_seq(a)
    assert bm.prefix_hits(seq(range(8))) == []


@pytest.mark.parametrize("caching", [True, False])
def test_prefix_caching_switch(caching):
    bm = BlockManager(num_blocks=8, block_size=4, watermark=0.0, enable_prefix_caching=caching)
    a = seq(range(8))
    bm.allocate(a)
    b = seq(range(8))
    bm.allocate(b)
    assert (b.block_table == a.block_table) is caching


def test_prefix_hits_key_on_audio_frames_too():
    """A voice sample's frames are prompt tokens like text ids: requests with one cloned voice
    share its blocks, and another sample (one code differs) misses from the block holding it."""
    bm = BlockManager(num_blocks=12, block_size=4, watermark=0.0)
    frames = [(i, i + 1, i + 2, i + 3) for i in range(6)]
    other = frames[:5] + [(9, 9, 9, 8)]
    a = seq([1, 2, *frames, 7], rid="a")
    b = seq([1, 2, *frames, 8], rid="b")
    c = seq([1, 2, *other, 7], rid="c")
    for s in (a, b, c):
        bm.allocate(s)
    assert b.block_table[:2] == a.block_table[:2] and b.num_cached_tokens == 8
    assert c.block_table[:1] == a.block_table[:1] and c.block_table[1] != a.block_table[1]
    assert c.num_cached_tokens == 4
