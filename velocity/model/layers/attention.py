"""Paged attention in plain torch, vectorized over sequences and blocks."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """Per-step inputs shared by every layer. T tokens of B sequences, each with up to Q new tokens.

    Decode-only steps have Q == 1 and q_index None (token b belongs to sequence b).
    """

    slot_mapping: torch.Tensor        # [T] cache slot (block * block_size + offset) of each token
    block_tables: torch.Tensor        # [B, W] block ids, padded with the scratch block
    attn_mask: torch.Tensor           # [B, 1, Q, W * block_size] True where a query may attend
    q_index: torch.Tensor | None = None   # [B, Q] flat token index of each padded query
    out_index: torch.Tensor | None = None  # [T] index into the flattened [B * Q] output
    context_lens: torch.Tensor | None = None  # [B], decode only: read the cache in place up to these lengths
    kernel: Callable | None = None         # cpu_kernels.paged_decode_kernel(), when in use
    max_len: int = 0                       # decode in place: the longest context (sizes the GPU kernel's grid)


def build_attn_mask(q_pos: torch.Tensor, num_keys: int) -> torch.Tensor:
    """q_pos: [B, Q] position of each query -> [B, 1, Q, num_keys] causal mask over cached keys."""
    keys = torch.arange(num_keys, device=q_pos.device)
    return (keys[None, None, :] <= q_pos[:, :, None]).unsqueeze(1)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, md: AttentionMetadata, scale: float) -> torch.Tensor:
    """Write this step's k/v into the cache, then attend over each sequence's cached keys.

    q: [T, Hq, D]; k, v: [T, Hkv, D]; k_cache, v_cache: [N, S, Hkv, cache_head_width(D)] -> out [T, Hq * D]
    """
    T, Hq, D = q.shape
    N, S, Hkv, Dc = k_cache.shape
    if md.kernel is not None:   # decode: write k, v and read the cache in place, in C++
        return md.kernel(q, k, v, md.slot_mapping, k_cache, v_cache, md.block_tables, md.context_lens,
                         scale).view(T, Hq * D)
    k_cache.view(N * S, Hkv, Dc).index_copy_(0, md.slot_mapping, as_cache(k, k_cache.dtype))
    v_cache.view(N * S, Hkv, Dc).index_copy_(0, md.slot_mapping, as_cache(v, v_cache.dtype))
    return attend_cached(q, k_cache, v_cache, md, scale)


INT8_SCALE_BYTES = 4   # an int8 cache's head: D int8 values, then its float32 scale's bytes


def cache_head_width(head_dim: int, dtype: torch.dtype) -> int:
    """A cache head's last dimension: head_dim, or head_dim + INT8_SCALE_BYTES for an int8 cache."""
    return head_dim + INT8_SCALE_BYTES if dtype == torch.int8 else head_dim


def as_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., D] in a cache's dtype, as the C++ kernel (velocity/model/kernels/csrc/paged_decode.cpp)
    writes it. A float16 cache of a float32 model (EngineConfig.kv_cache_dtype) takes x clamped to
    float16's finite range first. An int8 cache takes each head divided by its scale (max |x| / 127,
    max |x| at least 1e-30) and rounded to nearest even, the scale's bytes after: [..., D + 4]."""
    if dtype == x.dtype:
        return x
    if dtype == torch.int8:
        scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127                     # [..., 1]
        q = (x / scale).round().clamp(-127, 127).to(torch.int8)
        return torch.cat([q, scale.contiguous().view(torch.int8)], dim=-1)                # [..., D + 4]
    if dtype == torch.float16 and x.dtype == torch.float32:
        top = torch.finfo(dtype).max
        x = x.clamp(-top, top)
    return x.to(dtype)


def from_cache(c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows [..., W] as dtype [..., D]: an int8 cache's values times their heads' scales."""
    if c.dtype != torch.int8:
        return c.to(dtype)
    D = c.shape[-1] - INT8_SCALE_BYTES
    scale = c[..., D:].contiguous().view(torch.float32)                                     # [..., 1]
    return (c[..., :D].to(torch.float32) * scale).to(dtype)


def attend_cached(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, md: AttentionMetadata,
                  scale: float) -> torch.Tensor:
    """Attention over each sequence's cached keys (this step's already written), gathered into
    the block tables' dense width. q: [T, Hq, D] -> out [T, Hq * D]"""
    T, Hq, D = q.shape
    N, S, Hkv, Dc = k_cache.shape                                               # Dc: cache_head_width
    B, W = md.block_tables.shape
    blocks = md.block_tables.reshape(-1)
    keys = from_cache(k_cache.index_select(0, blocks).view(B, W * S, Hkv, Dc), q.dtype).transpose(1, 2)   # [B, Hkv, L, D]
    vals = from_cache(v_cache.index_select(0, blocks).view(B, W * S, Hkv, Dc), q.dtype).transpose(1, 2)
    if md.q_index is None:
        qb = q.view(B, 1, Hq, D).transpose(1, 2)                               # [B, Hq, 1, D]
    else:
        qb = q[md.q_index].transpose(1, 2)                                     # [B, Hq, Q, D]
    out = F.scaled_dot_product_attention(qb, keys, vals, attn_mask=md.attn_mask, scale=scale,
                                         enable_gqa=Hq != Hkv)                # [B, Hq, Q, D]
    out = out.transpose(1, 2).reshape(-1, Hq * D)                              # [B * Q, Hq * D]
    return out if md.out_index is None else out[md.out_index]
