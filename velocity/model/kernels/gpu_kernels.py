"""The decoder layer's GPU kernels in Triton, about nine launches a layer instead of about forty:
`add_rms_norm` (residual add and RMSNorm in one pass, float32 inside as transformers), `rope_store`
(RoPE on q and k, q in place, k with v into the paged KV cache), `paged_decode` (decode attention
reading the KV blocks in place through the block table, in parts of SPLIT tokens and a combine:
flash-decoding, one CUDA graph per batch size for every context length) and `silu_and_mul`.
Each rounds where the eager torch code rounds, so on float32 they differ from eager only in the
order of sums. Triton is a GPU package (the `gpu` extra; CUDA wheels of torch carry it): `load()`
is None where it cannot be imported. Tests run the kernels on CUDA, or on the CPU under Triton's
interpreter (TRITON_INTERPRET=1).
"""
from __future__ import annotations

import logging
import math
import os
import sys
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

try:
    import triton
    import triton.language as tl
except ImportError:          # CPU wheels of torch: no Triton, and no need for it
    triton = tl = None

SPLIT = 256        # context tokens a decode program reads when a row's context is split
BLOCK_N = 64       # keys a decode program reads per loop iteration
MHA_ROWS = 64      # without GQA, from this many rows on: _decode_mha_kernel (docs/benchmarks.md has why)


def load() -> ModuleType | None:
    """This module when Triton can be imported, else None (the caller logs why it runs eager)."""
    return sys.modules[__name__] if triton is not None else None


def self_check(device: torch.device, dtype: torch.dtype) -> str | None:
    """Each kernel once on small inputs (compiling them): None, or what failed (then: eager, logged)."""
    try:
        x = torch.randn(2, 128, device=device, dtype=dtype)
        out, _ = add_rms_norm(x, x, torch.ones(128, device=device, dtype=dtype), 1e-6)
        cache = torch.zeros(2, 16, 1, 64, device=device, dtype=dtype)
        qkv = torch.randn(2, 192, device=device, dtype=dtype)
        pos = torch.tensor([0, 1], device=device)
        table = torch.zeros(4, 64, device=device, dtype=dtype)
        rope_store(qkv, pos, table + 1, table, pos, cache, cache.clone(), 1)
        att = paged_decode(qkv[:, :64], cache, cache, torch.zeros(2, 1, dtype=torch.long, device=device), pos + 1,
                           0.125, 2 * SPLIT)
        act = silu_and_mul(x)
        if not all(bool(t.isfinite().all()) for t in (out, qkv, att, act)):
            return "a kernel gave a value that is not finite"
    except Exception as e:   # noqa: BLE001 - any failure to build or run means: not these kernels
        return f"{type(e).__name__}: {e}"
    return None


def interpreted() -> bool:
    """Triton runs its kernels on the CPU (TRITON_INTERPRET=1, Triton's own variable): for tests."""
    return triton is not None and os.environ.get("TRITON_INTERPRET") == "1"


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


if triton is not None:
    @triton.jit
    def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_ptr, N, eps,
                             HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0)
        if HAS_RES:      # residual = x + residual, rounded to the dtype as torch's add does
            r = tl.load(r_ptr + row * N + cols, mask=m, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(res_ptr + row * N + cols, x, mask=m)
        h = x.to(tl.float32)
        var = tl.sum(h * h, axis=0) / N
        h = h * tl.div_rn(1.0, tl.sqrt_rn(var + eps))
        h = h.to(x_ptr.dtype.element_ty).to(tl.float32)               # h.to(x.dtype)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * N + cols, (w * h).to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _rope_store_kernel(qkv_ptr, stride, pos_ptr, pos_stride, cos_ptr, sin_ptr, slot_ptr, slot_stride, k_ptr,
                           v_ptr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        half = tl.arange(0, D // 2)
        row = qkv_ptr + t * stride + h * D
        slot = tl.load(slot_ptr + t * slot_stride).to(tl.int64)
        dt = qkv_ptr.dtype.element_ty
        if h < HQ + HKV:      # q or k: rotate_half, each product and the sum rounded as in eager
            pos = tl.load(pos_ptr + t * pos_stride).to(tl.int64)
            x1 = tl.load(row + half).to(tl.float32)
            x2 = tl.load(row + D // 2 + half).to(tl.float32)
            c1 = tl.load(cos_ptr + pos * D + half).to(tl.float32)
            c2 = tl.load(cos_ptr + pos * D + D // 2 + half).to(tl.float32)
            s1 = tl.load(sin_ptr + pos * D + half).to(tl.float32)
            s2 = tl.load(sin_ptr + pos * D + D // 2 + half).to(tl.float32)
            o1 = ((x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)).to(dt)
            o2 = ((x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)).to(dt)
            if h < HQ:                                                  # q: in place
                tl.store(row + half, o1)
                tl.store(row + D // 2 + half, o2)
            else:                                                       # k: into the cache
                dst = k_ptr + (slot * HKV + (h - HQ)) * D
                tl.store(dst + half, o1)
                tl.store(dst + D // 2 + half, o2)
        else:                                                           # v: into the cache
            dst = v_ptr + (slot * HKV + (h - HQ - HKV)) * D
            tl.store(dst + half, tl.load(row + half))
            tl.store(dst + D // 2 + half, tl.load(row + D // 2 + half))

    @triton.jit
    def _part(lens_ptr, SPLIT_N: tl.constexpr):
        """A decode program's row and its part of the row's context: (b, start, end); start >= end
        where the row's context is shorter."""
        b = tl.program_id(0).to(tl.int64)
        start = tl.program_id(2) * SPLIT_N
        return b, start, tl.minimum(start + SPLIT_N, tl.load(lens_ptr + b))

    @triton.jit
    def _kv_tile(k_ptr, v_ptr, tables, n0, end, kvh, HKV: tl.constexpr, D: tl.constexpr, S: tl.constexpr,
                 BLOCK: tl.constexpr):
        """Keys and values [BLOCK, D] in float32 of tokens n0 .. n0 + BLOCK of KV head kvh, read in
        place through a row's block table `tables`, and which of them are before `end`."""
        n = n0 + tl.arange(0, BLOCK)
        nm = n < end
        page = tl.load(tables + n // S, mask=nm, other=0).to(tl.int64)
        off = (((page * S + n % S) * HKV + kvh) * D)[:, None] + tl.arange(0, D)[None, :]     # [BLOCK, D]
        k = tl.load(k_ptr + off, mask=nm[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + off, mask=nm[:, None], other=0.0).to(tl.float32)
        return k, v, nm

    @triton.jit
    def _decode_kernel(q_ptr, q_stride, k_ptr, v_ptr, bt_ptr, bt_stride, lens_ptr, o_ptr, acc_ptr, ml_ptr,
                       scale, HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr,
                       S: tl.constexpr, BLOCK: tl.constexpr, SPLIT_N: tl.constexpr, NSPLIT: tl.constexpr):
        b, start, end = _part(lens_ptr, SPLIT_N)
        kvh = tl.program_id(1)
        if start < end:
            g = tl.arange(0, BG)
            d = tl.arange(0, D)
            gm = g < G
            heads = kvh * G + g                                                    # [BG] query heads
            q = tl.load(q_ptr + b * q_stride + heads[:, None] * D + d[None, :], mask=gm[:, None],
                        other=0.0).to(tl.float32)                                  # [BG, D]
            m_i = tl.full([BG], float("-inf"), tl.float32)
            l_i = tl.zeros([BG], tl.float32)
            acc = tl.zeros([BG, D], tl.float32)
            for n0 in range(start, end, BLOCK):
                k, v, nm = _kv_tile(k_ptr, v_ptr, bt_ptr + b * bt_stride, n0, end, kvh, HKV, D, S, BLOCK)
                s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale         # [BG, BLOCK]
                s = tl.where(nm[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
                m_i = m_new
            if NSPLIT == 1:
                out = acc / l_i[:, None]
                tl.store(o_ptr + b * HQ * D + heads[:, None] * D + d[None, :],
                         out.to(o_ptr.dtype.element_ty), mask=gm[:, None])
            else:                            # partials: acc [B, HQ, NSPLIT, D], (max, sum) [B, HQ, NSPLIT, 2]
                at = (b * HQ + heads) * NSPLIT + tl.program_id(2)                  # [BG]
                tl.store(acc_ptr + at[:, None] * D + d[None, :], acc, mask=gm[:, None])
                tl.store(ml_ptr + at * 2, m_i, mask=gm)
                tl.store(ml_ptr + at * 2 + 1, l_i, mask=gm)

    @triton.jit
    def _decode_mha_kernel(q_ptr, q_stride, k_ptr, v_ptr, bt_ptr, bt_stride, lens_ptr, o_ptr, acc_ptr, ml_ptr,
                           scale, HQ: tl.constexpr, D: tl.constexpr, S: tl.constexpr, BLOCK: tl.constexpr,
                           SPLIT_N: tl.constexpr, NSPLIT: tl.constexpr):
        """_decode_kernel for one query head a KV head (no GQA): [BLOCK, D] tiles, no padded rows."""
        b, start, end = _part(lens_ptr, SPLIT_N)
        h = tl.program_id(1)
        if start < end:
            d = tl.arange(0, D)
            q = tl.load(q_ptr + b * q_stride + h * D + d).to(tl.float32)               # [D]
            m_i = float("-inf")
            l_i = 0.0
            acc = tl.zeros([D], tl.float32)
            for n0 in range(start, end, BLOCK):
                k, v, nm = _kv_tile(k_ptr, v_ptr, bt_ptr + b * bt_stride, n0, end, h, HQ, D, S, BLOCK)
                s = tl.sum(k * q[None, :], axis=1) * scale                              # [BLOCK]
                s = tl.where(nm, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=0))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new)
                l_i = l_i * alpha + tl.sum(p, axis=0)
                acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
                m_i = m_new
            if NSPLIT == 1:
                tl.store(o_ptr + (b * HQ + h) * D + d, (acc / l_i).to(o_ptr.dtype.element_ty))
            else:
                at = (b * HQ + h) * NSPLIT + tl.program_id(2)
                tl.store(acc_ptr + at * D + d, acc)
                tl.store(ml_ptr + at * 2, m_i)
                tl.store(ml_ptr + at * 2 + 1, l_i)

    @triton.jit
    def _combine_kernel(acc_ptr, ml_ptr, lens_ptr, o_ptr, HQ: tl.constexpr, D: tl.constexpr,
                        SPLIT_N: tl.constexpr, NSPLIT: tl.constexpr, BS: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        L = tl.load(lens_ptr + b)
        ns = (L + SPLIT_N - 1) // SPLIT_N
        base = (b * HQ + h) * NSPLIT
        sp = tl.arange(0, BS)
        M = tl.max(tl.load(ml_ptr + (base + sp) * 2, mask=sp < ns, other=float("-inf")), axis=0)
        d = tl.arange(0, D)
        acc = tl.zeros([D], tl.float32)
        den = 0.0
        for i in range(0, ns):          # in order: the sums do not depend on NSPLIT or BS
            w = tl.exp(tl.load(ml_ptr + (base + i) * 2) - M)
            den += tl.load(ml_ptr + (base + i) * 2 + 1) * w
            acc += tl.load(acc_ptr + (base + i) * D + d) * w
        tl.store(o_ptr + (b * HQ + h) * D + d, (acc / den).to(o_ptr.dtype.element_ty))

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < N
        dt = x_ptr.dtype.element_ty
        gate = tl.load(x_ptr + t * 2 * N + cols, mask=m, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + t * 2 * N + N + cols, mask=m, other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)               # F.silu, in the dtype
        tl.store(out_ptr + t * N + cols, (act * up).to(dt), mask=m)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (RMSNorm(x + residual), x + residual); with residual None, (RMSNorm(x), x). x: [T, N]"""
    T, N = x.shape
    out = torch.empty_like(x)
    res = x if residual is None else torch.empty_like(x)
    _add_rms_norm_kernel[(T,)](x, x if residual is None else residual, weight, out, res, N, eps,
                               HAS_RES=residual is not None, BLOCK=_pow2(N))
    return out, res


def rope_store(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int) -> None:
    """RoPE on q (in place in qkv) and k, k and v written to their cache slots.
    qkv: [T, (Hq + 2 Hkv) D]; positions, slots: [T] (strides of their own: a CUDA graph's are columns
    of its input buffer); cos, sin: [P, D]; caches: [N, S, Hkv, D]"""
    T = qkv.shape[0]
    Hkv, D = k_cache.shape[2], k_cache.shape[3]
    _rope_store_kernel[(T, num_heads + 2 * Hkv)](qkv, qkv.stride(0), positions, positions.stride(0), cos, sin, slots,
                                                 slots.stride(0), k_cache, v_cache, HQ=num_heads, HKV=Hkv, D=D)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, scale: float, max_len: int) -> torch.Tensor:
    """One new query per row against its cached keys, read in place.
    q: [B, Hq * D] (a row stride of its own: the qkv buffer's); caches: [N, S, Hkv, D];
    block_tables: [B, W]; context_lens: [B] (<= max_len) -> [B, Hq * D]

    Every row's context is read in parts of SPLIT tokens, one program each, then combined: the
    programs fill the GPU at one row as at many (flash-decoding), and a row's result depends on
    its context alone, not on the batch or on max_len (which only sizes the grid; parts past a
    row's length return at once), so a CUDA graph and an eager step compute alike."""
    B = q.shape[0]
    _, S, Hkv, D = k_cache.shape
    Hq = q.shape[1] // D
    G = Hq // Hkv
    out = torch.empty(B, Hq * D, dtype=q.dtype, device=q.device)
    nsplit = -(-max_len // SPLIT)
    if nsplit == 1:
        acc = ml = out
    else:
        acc = torch.empty(B, Hq, nsplit, D, dtype=torch.float32, device=q.device)
        ml = torch.empty(B, Hq, nsplit, 2, dtype=torch.float32, device=q.device)
    if G == 1 and B >= MHA_ROWS:
        _decode_mha_kernel[(B, Hq, nsplit)](q, q.stride(0), k_cache, v_cache, block_tables, block_tables.stride(0),
                                            context_lens, out, acc, ml, scale, HQ=Hq, D=D, S=S, BLOCK=BLOCK_N,
                                            SPLIT_N=SPLIT, NSPLIT=nsplit)
    else:
        _decode_kernel[(B, Hkv, nsplit)](q, q.stride(0), k_cache, v_cache, block_tables, block_tables.stride(0),
                                         context_lens, out, acc, ml, scale, HQ=Hq, HKV=Hkv, G=G, BG=max(2, _pow2(G)),
                                         D=D, S=S, BLOCK=BLOCK_N, SPLIT_N=SPLIT, NSPLIT=nsplit)
    if nsplit > 1:
        _combine_kernel[(B, Hq)](acc, ml, context_lens, out, HQ=Hq, D=D, SPLIT_N=SPLIT, NSPLIT=nsplit,
                                 BS=max(2, _pow2(nsplit)))
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2 I] (gate, up) -> SiLU(gate) * up [T, I]"""
    T, N = x.shape[0], x.shape[1] // 2
    out = torch.empty(T, N, dtype=x.dtype, device=x.device)
    block = min(1024, _pow2(N))
    _silu_and_mul_kernel[(T, -(-N // block))](x, out, N, BLOCK=block)
    return out
