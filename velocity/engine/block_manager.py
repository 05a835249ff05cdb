"""Paged KV-cache bookkeeping: block allocator, prefix caching, swap. Pure Python, no torch."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from velocity.engine.sequence import Sequence


class Block:
    """One KV block. A full block of a prompt may carry the chained hash of its tokens."""

    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple = ()

    def reset(self) -> None:
        self.ref_count = 1
        self.hash = None
        self.token_ids = ()


def chain_hash(prev: Hashable, tokens: tuple) -> int:
    """Hash of a full block, chained on everything before it (and the sequence's salt)."""
    return hash((prev, tokens))


class BlockManager:
    """Allocates KV blocks to sequences.

    Free blocks live in an LRU OrderedDict; a freed block that holds a full, hashed block
    of tokens stays findable in `cached` until it is handed out again (eviction), so a
    later prompt with the same prefix reuses its KV. A hit is verified against the tokens.
    """

    def __init__(self, num_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 watermark: float = 0.01, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}            # block hash -> block id
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_blocks)
        self.cpu_free: list[int] = list(range(num_cpu_blocks))[::-1]
        self.cpu_tables: dict[int, list[int]] = {}  # seq_id -> cpu block ids while swapped
        self.num_prefix_hits = 0                    # blocks served from the cache (stats)

    # -- queries -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _salt(self, seq: Sequence) -> Hashable:
        return ("salt", seq.cache_salt)

    def _lookup(self, h: int, tokens: tuple) -> int | None:
        bid = self.cached.get(h)
        if bid is not None and self.blocks[bid].token_ids == tokens:
            return bid
        return None

    # -- allocation ----------------------------------------------------------------
    def _take(self) -> int:
        """A free block (least recently freed first); evicts its cached hash."""
        assert self.free, "no free KV block"
        bid, _ = self.free.popitem(last=False)
        b = self.blocks[bid]
        if b.hash is not None and self.cached.get(b.hash) == bid:
            del self.cached[b.hash]
        b.reset()
        return bid

    def _ref(self, bid: int) -> None:
        b = self.blocks[bid]
        if b.ref_count == 0:
            del self.free[bid]
        b.ref_count += 1

    def _register(self, bid: int, h: int, tokens: tuple) -> None:
        b = self.blocks[bid]
        b.hash, b.token_ids = h, tokens
        self.cached.setdefault(h, bid)

    def prefix_hits(self, seq: Sequence) -> list[int]:
        """Block ids of seq's leading full blocks that are in the prefix cache."""
        if not self.enable_prefix_caching:
            return []
        hits, prev, bs = [], self._salt(seq), self.block_size
        for i in range(len(seq) // bs):
            tokens = tuple(seq.token(j) for j in range(i * bs, (i + 1) * bs))
            prev = chain_hash(prev, tokens)
            bid = self._lookup(prev, tokens)
            if bid is None:
                break
            hits.append(bid)
        return hits

    def can_allocate(self, seq: Sequence, hits: list[int] | None = None) -> bool:
        """Room for all of seq's tokens, keeping the watermark free."""
        hits = self.prefix_hits(seq) if hits is None else hits
        in_use = sum(self.blocks[b].ref_count > 0 for b in hits)  # shared: cost no free block
        needed = self.blocks_needed(len(seq)) - in_use
        return self.num_free_blocks - needed >= self.watermark_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all its tokens, reusing cached full blocks."""
        assert not seq.block_table
        bs, prev, hit_run = self.block_size, self._salt(seq), self.enable_prefix_caching
        seq.num_cached_tokens = 0
        for i in range(self.blocks_needed(len(seq))):
            full = (i + 1) * bs <= len(seq)
            tokens = tuple(seq.token(j) for j in range(i * bs, min((i + 1) * bs, len(seq))))
            bid = None
            if full and self.enable_prefix_caching:
                prev = chain_hash(prev, tokens)
                if hit_run:
                    bid = self._lookup(prev, tokens)
            if bid is not None:
                self._ref(bid)
                seq.num_cached_tokens += bs
                self.num_prefix_hits += 1
            else:
                hit_run = False
                bid = self._take()
                if full and self.enable_prefix_caching:
                    self._register(bid, prev, tokens)
            seq.block_table.append(bid)
        # The last prompt token is always computed again: its logits start generation.
        seq.num_computed_tokens = min(seq.num_cached_tokens, len(seq) - 1)

    def free_seq(self, seq: Sequence) -> None:
        """Release seq's blocks (most recent first, so early prefix blocks stay cached longest)."""
        for bid in reversed(seq.block_table):
            b = self.blocks[bid]
            b.ref_count -= 1
            assert b.ref_count >= 0
            if b.ref_count == 0:
                self.free[bid] = None
        seq.block_table = []
        cpu = self.cpu_tables.pop(seq.seq_id, None)
        if cpu:
            self.cpu_free.extend(cpu)

    # -- decoding ------------------------------------------------------------------
    def can_append(self, seq: Sequence) -> bool:
        return len(seq.block_table) >= self.blocks_needed(len(seq)) or self.num_free_blocks > 0

    def blocks_to_append(self, seqs: list[Sequence]) -> int:
        """New blocks that append_slot on each of seqs would take."""
        return sum(len(s.block_table) < self.blocks_needed(len(s)) for s in seqs)

    def append_slot(self, seq: Sequence) -> None:
        """Make room for seq's newest token; hash the block it completes."""
        if len(seq.block_table) < self.blocks_needed(len(seq)):
            seq.block_table.append(self._take())
        n, bs = len(seq), self.block_size
        if self.enable_prefix_caching and n % bs == 0:
            i = n // bs - 1
            prev = self._salt(seq) if i == 0 else self.blocks[seq.block_table[i - 1]].hash
            if prev is not None:   # chain intact: register the completed block
                tokens = tuple(seq.token(j) for j in range(i * bs, n))
                self._register(seq.block_table[i], chain_hash(prev, tokens), tokens)

    # -- swapping ------------------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        return len(self.cpu_free) >= len(seq.block_table)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move seq's blocks to CPU; returns (gpu block, cpu block) copies to make."""
        cpu = [self.cpu_free.pop() for _ in seq.block_table]
        mapping = list(zip(seq.block_table, cpu))
        computed = seq.num_computed_tokens
        self.free_seq(seq)
        seq.num_computed_tokens = computed
        self.cpu_tables[seq.seq_id] = cpu
        return mapping

    def can_swap_in(self, seq: Sequence) -> bool:
        # +1: the next decode may need a fresh block
        return self.num_free_blocks - len(self.cpu_tables[seq.seq_id]) - 1 >= self.watermark_blocks

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring seq's blocks back; returns (cpu block, gpu block) copies to make."""
        cpu = self.cpu_tables.pop(seq.seq_id)
        seq.block_table = [self._take() for _ in cpu]
        self.cpu_free.extend(cpu)
        return list(zip(cpu, seq.block_table))

    def forget_hashes(self, seq: Sequence) -> None:
        """Drop seq's blocks from the prefix cache (their KV may be incomplete)."""
        for bid in seq.block_table:
            b = self.blocks[bid]
            if b.hash is not None and self.cached.get(b.hash) == bid:
                del self.cached[b.hash]
            b.hash, b.token_ids = None, ()
