"""Turns a scheduled batch into tensors, runs the model (eager or CUDA-graph replay), returns the
hidden states. The samplers' tensors are velocity.engine.sampling_rows's; the graphs' shapes
velocity.engine.graph_shapes's."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from velocity.engine.graph_sampler import GraphSampler
from velocity.engine.graph_shapes import graph_batch_sizes, graph_context_blocks
from velocity.engine.sampling_rows import SamplingRows
from velocity.engine.sequence import Sequence
from velocity.model.layers.attention import AttentionMetadata, build_attn_mask

logger = logging.getLogger(__name__)


DECODE_ROOM_BLOCKS = 8    # columns a decode's block tables keep for blocks taken by later decodes


@dataclass(slots=True)
class DecodeInputs:
    """A decode step's inputs that the next decode of the same sequences updates (next_decode)."""
    ids: list[int]             # row -> seq_id
    pos: torch.Tensor          # [B] the position each row computed
    tables: torch.Tensor       # [B, W + room] block tables, padded with the scratch block
    lens: list[int]            # blocks in each row's table
    last: torch.Tensor         # [B] 0..B-1: each row's last token


class ModelRunner:
    """Prepares positions, slot mapping, block tables and masks for a mixed prefill/decode batch.

    On CUDA (unless enforce_eager) decode-only steps replay CUDA graphs, largest first with one
    memory pool; a batch is padded up to the next captured size (and width), its padding rows
    writing to the scratch block. Where the decode reads the cache in place (the GPU kernels),
    one graph per batch size (graph_batch_sizes' fine buckets) serves every context length;
    else there is one per batch size 1, 2, 4, ... and context width 64, 128, ... tokens.
    """

    def __init__(self, model: nn.Module, block_size: int, scratch_block: int, max_model_len: int,
                 max_num_seqs: int, device: torch.device, use_cuda_graphs: bool,
                 decode_kernel: Callable | None = None, gpu_kernels_in_place: bool = False,
                 graph_sampler: GraphSampler | None = None, row_prefill: bool = False) -> None:
        self.model = model
        self.decode_kernel = decode_kernel
        # prefills too as rows that each read the cache in place up to their own position (the
        # decode kernel's metadata, a table per row): the CPU layer's C++ rows' one path (forward_rows)
        self.asked_row_prefill = row_prefill
        self.gpu_kernels_in_place = gpu_kernels_in_place   # the model's GPU kernels read the cache in place
        # the decode graphs sample too (one graph per batch size: with the GPU kernels only): see codes
        self.graph_sampler = graph_sampler if gpu_kernels_in_place else None
        self.sampling_rows = SamplingRows(graph_sampler) if self.graph_sampler else None
        self.codes: torch.Tensor | None = None   # [B, K] the last run's tokens, where its graph sampled them
        self.graph_sampled = 0                   # decode steps sampled inside the graphs
        self.sample_graphs: dict[int, torch.cuda.CUDAGraph] = {}    # batch size ->
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.device = device
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.reuse_decode_inputs = True         # False: every step's inputs built from the sequences
        self.decode: DecodeInputs | None = None
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}   # (batch, context blocks) ->
        if use_cuda_graphs:
            self.capture(max_num_seqs)

    @property
    def row_prefill(self) -> bool:
        """Prefills as rows (above); the layer takes that path only with the decode kernel."""
        return self.asked_row_prefill and self.decode_kernel is not None

    # -- inputs ----------------------------------------------------------------------
    def token_tensor(self, tokens: list) -> torch.Tensor:
        return self.model.token_tensor(tokens, self.device)

    def prepare(self, seqs: list[Sequence], is_decode: bool = False) -> tuple:
        """-> input ids [T, ...], positions [T], attention metadata, last-token index [B], overrides"""
        if is_decode and (follow := self.next_decode(seqs)) is not None:
            return follow
        S, dev = self.block_size, self.device
        tokens, positions, slots, last = [], [], [], []
        q_rows: list[range] = []
        ov_index, ov_vecs = [], []
        for seq in seqs:
            start, end = seq.num_computed_tokens, len(seq)
            for pos, vec in self.model.embed_overrides(seq, start, end):
                ov_index.append(len(positions) + pos - start)
                ov_vecs.append(vec)
            q_rows.append(range(len(positions), len(positions) + end - start))
            tokens += [seq.token(i) for i in range(start, end)]
            positions += range(start, end)
            bt = seq.block_table
            slots += [bt[p // S] * S + p % S for p in range(start, end)]
            last.append(len(positions) - 1)
        W = max(len(s.block_table) for s in seqs)
        tables = [s.block_table + [self.scratch_block] * (W - len(s.block_table)) for s in seqs]
        pos_t = torch.tensor(positions, device=dev)
        md = AttentionMetadata(slot_mapping=torch.tensor(slots, device=dev),
                               block_tables=torch.tensor(tables, device=dev), attn_mask=None)
        Q = max(len(r) for r in q_rows)
        if Q == 1 and self.by_length:   # decode only, read in place: no mask needed
            self.length_md(md, pos_t)
        elif self.row_prefill:    # every token a row with its sequence's table, read up to its position
            rows = torch.tensor([b for b, r in enumerate(q_rows) for _ in r], device=dev)
            md.block_tables = md.block_tables[rows]                                 # [T, W]
            self.length_md(md, pos_t)
        elif Q == 1:   # decode only
            md.attn_mask = build_attn_mask(pos_t[:, None], W * S)
        else:
            q_index = torch.tensor([[r[min(i, len(r) - 1)] for i in range(Q)] for r in q_rows], device=dev)
            md.q_index = q_index
            md.out_index = torch.tensor([b * Q + i for b, r in enumerate(q_rows) for i in range(len(r))], device=dev)
            md.attn_mask = build_attn_mask(pos_t[q_index], W * S)
        overrides = (torch.tensor(ov_index, device=dev), torch.stack(ov_vecs).to(dev)) if ov_index else None
        last_t = torch.tensor(last, device=dev)
        self.decode = None
        if Q == 1 and self.reuse_decode_inputs:      # the next decode of these sequences starts from here
            room = torch.full((len(seqs), W + DECODE_ROOM_BLOCKS), self.scratch_block, device=dev)
            room[:, :W] = md.block_tables
            self.decode = DecodeInputs([s.seq_id for s in seqs], pos_t, room, [len(s.block_table) for s in seqs],
                                       last_t)
        return self.token_tensor(tokens), pos_t, md, last_t, overrides

    def next_decode(self, seqs: list[Sequence]) -> tuple | None:
        """The inputs of a decode whose sequences all decoded in the last step (some may have left),
        updated from that step's tensors instead of built again: positions + 1, new blocks written
        into the tables, slots read from them. The same values as prepare's. None: build them."""
        d = self.decode
        if d is None:
            return None
        ids = [s.seq_id for s in seqs]
        if same := ids == d.ids:                 # the usual case: the batch of the step before
            rows = range(len(ids))
        else:
            at = {sid: i for i, sid in enumerate(d.ids)}
            rows = [at.get(sid) for sid in ids]
            if None in rows:
                return None
        lens = [len(s.block_table) for s in seqs]
        W = max(lens)
        if W > d.tables.shape[1]:
            return None
        pos = d.pos + 1 if same else d.pos[rows] + 1                                # [B]
        tables = d.tables if same else d.tables[rows]                               # [B, W + room]
        for i, (n, was) in enumerate(zip(lens, d.lens if same else [d.lens[r] for r in rows])):
            if n > was:                                 # a block taken since: write it in
                tables[i, was:n] = torch.tensor(seqs[i].block_table[was:n])
        S = self.block_size
        md = AttentionMetadata(slot_mapping=tables.gather(1, (pos // S)[:, None])[:, 0] * S + pos % S,
                               block_tables=tables, attn_mask=None)
        if self.by_length:                       # reads each row's blocks up to its length: the room is not read
            self.length_md(md, pos)
        else:                                   # attends over the whole width: prepare's
            md.block_tables, md.attn_mask = tables[:, :W], build_attn_mask(pos[:, None], W * S)
        last = d.last if same else d.last[:len(seqs)]
        self.decode = DecodeInputs(ids, pos, tables, lens, last)
        tokens = self.token_tensor([s.output_token_ids[-1] for s in seqs])
        return tokens, pos, md, last, None

    @property
    def by_length(self) -> bool:
        """Decodes read each row's cache up to its length (the C++ kernel's or the GPU kernels'):
        context lengths instead of a mask over the tables' width."""
        return self.decode_kernel is not None or self.gpu_kernels_in_place

    def length_md(self, md: AttentionMetadata, pos: torch.Tensor) -> AttentionMetadata:
        """A decode's metadata for reading the cache in place: each row's length, no mask."""
        md.kernel, md.context_lens = self.decode_kernel, pos + 1
        md.max_len = self.max_blocks_per_seq * self.block_size
        return md

    # -- running ---------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, seqs: list[Sequence]) -> torch.Tensor:
        """-> hidden state [B, H] of the last token of each sequence"""
        self.codes = None
        is_decode = all(s.num_new_tokens == 1 for s in seqs)
        if is_decode and self.graphs and len(seqs) <= self.graph_sizes[-1]:
            self.decode = None                   # next_decode follows only steps that prepare made
            return self._replay(seqs)
        ids, pos, md, last, overrides = self.prepare(seqs, is_decode)
        return self.model(ids, pos, md, overrides)[last]

    # -- CUDA graphs -----------------------------------------------------------------
    def _static_forward(self, bs: int, width: int) -> torch.Tensor:
        st = self.static
        md = AttentionMetadata(slot_mapping=st["slots"][:bs], block_tables=st["tables"][:bs, :width], attn_mask=None)
        if self.by_length:
            self.length_md(md, st["pos"][:bs])
        else:
            md.attn_mask = build_attn_mask(st["pos"][:bs, None], width * self.block_size)
        return self.model(st["ids"][:bs], st["pos"][:bs], md)

    @torch.inference_mode()
    def capture(self, max_num_seqs: int) -> None:
        self.graph_sizes = sizes = graph_batch_sizes(max_num_seqs, fine=self.by_length)
        self.graph_widths = widths = ([self.max_blocks_per_seq] if self.by_length else
                                      graph_context_blocks(self.max_blocks_per_seq, self.block_size))
        n, dev = sizes[-1], self.device
        # The graphs' inputs are views of one device buffer [n, c + 2 + max_blocks] = token ids
        # (c columns), position, slot, block table, written each step by one copy from a pinned
        # host buffer of the same layout (see _replay).
        pad_t = self.model.token_tensor([self.model.pad_token], torch.device("cpu"))    # [1] or [1, c]
        pad = pad_t.reshape(-1)                                                           # [c]
        c = pad.numel()
        self.pad_ids = pad.numpy()
        gs = self.graph_sampler
        rows = torch.cat([pad, torch.tensor([0, self.scratch_block * self.block_size]),
                          torch.full((self.max_blocks_per_seq,), self.scratch_block),
                          torch.from_numpy(self.sampling_rows.pad) if gs else torch.zeros(0, dtype=torch.long)])
        self.host = rows.repeat(n, 1).pin_memory()                               # [n, C]
        self.host_np = self.host.numpy()
        self.copied = torch.cuda.Event()
        buf = self.host.to(dev)
        ids = buf[:, 0] if pad_t.dim() == 1 else buf[:, :c]
        T = c + 2 + self.max_blocks_per_seq            # the sampler's columns follow (graph_sampler.fill)
        self.static = {"buf": buf, "ids": ids, "pos": buf[:, c], "slots": buf[:, c + 1], "tables": buf[:, c + 2:T],
                       "sampling": buf[:, T:]}
        self.sample_out: dict[int, torch.Tensor] = {}
        head = self.model.heads[gs.head_name].fn if gs else None
        self.ids_cols = c
        self.graph_out: dict[tuple[int, int], torch.Tensor] = {}
        pool = None
        for w in reversed(widths):   # largest first: smaller graphs reuse its pool memory
            for bs in reversed(sizes):
                self._static_forward(bs, w)  # warm up (lazy init, autotuning) outside the graph
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    self.graph_out[bs, w] = self._static_forward(bs, w)
                pool = g.pool() if pool is None else pool
                self.graphs[bs, w] = g
                if gs and not self._capture_sampler(bs, w, head, pool):
                    gs = None
        torch.cuda.synchronize()
        logger.info("captured %d CUDA graphs: decode batch sizes %s x context widths %s tokens%s", len(self.graphs),
                    sizes, [w * self.block_size for w in widths], ", each with the sampler's" if gs else "")

    def _capture_sampler(self, bs: int, w: int, head: Callable, pool) -> bool:
        """The head and the sampler on the batch-size-bs graph's output, a graph of their own. False
        (logged; the eager sampler then serves every step) where that cannot be captured."""
        cols = self.static["sampling"][:bs]
        try:
            self.graph_sampler.sample(head(self.graph_out[bs, w]), cols)       # warm up
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.sample_out[bs] = self.graph_sampler.sample(head(self.graph_out[bs, w]), cols)
        except RuntimeError:
            logger.warning("the sampler could not be captured in a CUDA graph: it runs eager", exc_info=True)
            torch.cuda.synchronize()
            self.graph_sampler = self.sampling_rows = None
            self.sample_graphs.clear()
            return False
        self.sample_graphs[bs] = g
        return True

    def _replay(self, seqs: list[Sequence]) -> torch.Tensor:
        B = len(seqs)
        bs = next(b for b in self.graph_sizes if b >= B)
        w = next(w for w in self.graph_widths if w >= max(len(s.block_table) for s in seqs))
        S, c, h = self.block_size, self.ids_cols, self.host_np
        self.copied.synchronize()                      # the last step's copy has left the host buffer
        pos = [len(s) - 1 for s in seqs]
        h[:B, :c] = self.token_tensor_host([s.token(p) for s, p in zip(seqs, pos)])
        h[:B, c] = pos
        h[:B, c + 1] = [s.block_table[p // S] * S + p % S for s, p in zip(seqs, pos)]
        h[:bs, c + 2:c + 2 + w] = self.scratch_block
        for i, s in enumerate(seqs):
            h[i, c + 2:c + 2 + len(s.block_table)] = s.block_table
        # padding rows: the pad token at position 0, writing to the scratch block
        h[B:bs, :c] = self.pad_ids
        h[B:bs, c] = 0
        h[B:bs, c + 1] = self.scratch_block * S
        sr = self.sampling_rows
        sampled = sr is not None and sr.fill(h[:bs, c + 2 + self.max_blocks_per_seq:], seqs)
        self.static["buf"][:bs].copy_(self.host[:bs], non_blocking=True)
        self.copied.record()
        self.graphs[bs, w].replay()
        if sampled:
            self.sample_graphs[bs].replay()
            self.codes = self.sample_out[bs][:B]
            self.graph_sampled += 1
        return self.graph_out[bs, w][:B]

    def token_tensor_host(self, tokens: list) -> np.ndarray:
        """tokens -> [B, c] int64 on the host (c: the model's id columns)"""
        return self.model.token_tensor(tokens, torch.device("cpu")).reshape(len(tokens), -1).numpy()
