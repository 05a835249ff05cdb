"""Llama-family decoder on paged attention. The body takes embeddings, so other heads
(ChatTTS's text and audio-code tables) can sit on top of it."""
from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from velocity.model.layers.attention import AttentionMetadata, attend_cached, paged_attention
from velocity.model.layers.heads import Head
from velocity.model.networks.llama_config import LlamaConfig, rope_tables


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, HF's rotate_half layout. x: [T, H, D]; cos, sin: [T, 1, D]"""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # computed in float32 like transformers' LlamaRMSNorm
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        bias = cfg.attention_bias
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=bias)
        self.scale = self.head_dim ** -0.5
        self.k_cache = self.v_cache = torch.empty(0)  # [N, S, Hkv, D], set by the cache engine

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                md: AttentionMetadata) -> torch.Tensor:
        T, Hq, Hkv, D = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)                                                 # [T, (Hq + 2 Hkv) D]
        qk_cols = self.q_size + self.kv_size
        qk = rotate(qkv[:, :qk_cols].view(T, Hq + Hkv, D), cos, sin)          # q and k in one go
        q, k = qk[:, :Hq], qk[:, Hq:]                                          # [T, Hq, D], [T, Hkv, D]
        v = qkv[:, qk_cols:].view(T, Hkv, D)
        o = paged_attention(q, k, v, self.k_cache, self.v_cache, md, self.scale)
        return self.o_proj(o)

    def forward_fused(self, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      md: AttentionMetadata, K: ModuleType) -> torch.Tensor:
        """forward on the GPU kernels (velocity.model.kernels.gpu_kernels). cos, sin: the tables [P, D]."""
        T, Hq, D = x.shape[0], self.num_heads, self.head_dim
        qkv = self.qkv_proj(x)                                                 # [T, (Hq + 2 Hkv) D]
        K.rope_store(qkv, positions, cos, sin, md.slot_mapping, self.k_cache, self.v_cache, Hq)
        q = qkv[:, :self.q_size]                                               # rotated in place
        if md.context_lens is not None and md.q_index is None:                 # decode: the blocks in place
            o = K.paged_decode(q, self.k_cache, self.v_cache, md.block_tables, md.context_lens, self.scale,
                               md.max_len)
        else:
            o = attend_cached(q.view(T, Hq, D), self.k_cache, self.v_cache, md, self.scale)
        return self.o_proj(o)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        bias = cfg.mlp_bias
        self.inter = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                md: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, md)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """Decoder layers + final norm: embeddings [T, H] -> hidden states [T, H]."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(LlamaLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope_cos = self.rope_sin = torch.empty(0)  # [P, D], from init_rope()
        self.kernels: ModuleType | None = None          # velocity.model.kernels.gpu_kernels: the fused GPU layer
        self.rows: ModuleType | None = None             # the C++ kernels' velocity/model/kernels/csrc/layer_rows.cpp (CPU)
        self._plan: list[tuple] = []                    # forward_rows' per-layer arguments (row_plan)
        # run before each layer of forward_rows (the server's CPU thread lender: its threads may
        # change there, and no kernel's result depends on how many there are)
        self.between_layers: Callable[[], None] | None = None

    @torch.no_grad()
    def init_rope(self, cfg: LlamaConfig, device: torch.device, dtype: torch.dtype) -> None:
        """cos/sin for every position (rope scaling included), as transformers computes them."""
        self.rope_cos, self.rope_sin = rope_tables(cfg, device, dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata,
                overrides: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x: [T, H] embeddings; overrides: (token index [n], embeddings [n, H]) replace rows of x."""
        if overrides is not None:
            x[overrides[0]] = overrides[1].to(x.dtype)
        if self.kernels is not None:
            return self.forward_fused(x, positions, md)
        if self.rows is not None and md.kernel is not None:
            return self.forward_rows(x, positions, md)
        cos = self.rope_cos[positions].unsqueeze(1)   # [T, 1, D]
        sin = self.rope_sin[positions].unsqueeze(1)
        for layer in self.layers:
            x = layer(x, cos, sin, md)
        return self.norm(x)

    def row_plan(self) -> list[tuple]:
        """Per layer, what forward_rows passes its C++ calls: the norms' weights and eps, the
        attention module (its caches are read at each call) and its linears' calls with their
        weights bound (Int8Linear.rows_call, F32Linear.rows_call). Made at the first forward_rows:
        the layers' linears are final by then (the worker quantizes and packs them first)."""
        if not self._plan:
            self._plan = [(n1.weight, n1.eps, a, a.qkv_proj.rows_call(), a.o_proj.rows_call(), n2.weight, n2.eps,
                           m.gate_up_proj.rows_call(), m.down_proj.rows_call())
                          for a, m, n1, n2 in ((layer.self_attn, layer.mlp, layer.input_layernorm,
                                                layer.post_attention_layernorm) for layer in self.layers)]
        return self._plan

    def forward_rows(self, x: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        """A CPU step on the C++ linears (Int8Linear.rows_call or F32Linear.rows_call) with one
        C++ call for each stretch between two of them (velocity/model/kernels/csrc/layer_rows.cpp): the residual add
        into RMSNorm, RoPE into the KV write and attention, SiLU-and-mul; for int8 each output's
        rows scaled for the next linear. x: [T, H]"""
        K, none = self.rows, x.new_empty(0)
        q = self.layers[0].mlp.down_proj.rows_scaled                          # int8: rows scaled into [-1, 1]
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]         # [T, D]
        x, y, s = x.contiguous().clone(), none, none                          # x: the residual stream, in place
        slots, tables, lens = md.slot_mapping, md.block_tables, md.context_lens
        between = self.between_layers
        for n1w, n1e, a, qkv, o_proj, n2w, n2e, gate_up, down in self.row_plan():
            if between is not None:
                between()
            h, s = K.add_norm_scale(x, y, s, n1w, n1e, q)                     # h: [T, H] (int8: in [-1, 1]); s: [T, 1]
            o, s = K.rope_attend_scale(qkv(h), s, cos, sin, slots, a.k_cache, a.v_cache, tables, lens, a.scale,
                                       a.num_heads, a.num_kv_heads, q)
            h, s = K.add_norm_scale(x, o_proj(o), s, n2w, n2e, q)
            g, s = K.silu_mul_scale(gate_up(h), s, q)                         # g: [T, I]
            y = down(g)
        return K.add_norm_scale(x, y, s, self.norm.weight, self.norm.eps, False)[0]

    def forward_fused(self, x: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        """forward on the GPU kernels: each residual add fused into the next RMSNorm, RoPE into the
        KV write, decode attention on the blocks in place, SiLU-and-mul in one pass. x: [T, H]"""
        K, residual = self.kernels, None
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            h, residual = K.add_rms_norm(x, residual, layer.input_layernorm.weight, layer.input_layernorm.eps)
            x = attn.forward_fused(h, positions, self.rope_cos, self.rope_sin, md, K)
            h, residual = K.add_rms_norm(x, residual, layer.post_attention_layernorm.weight,
                                         layer.post_attention_layernorm.eps)
            x = mlp.down_proj(K.silu_and_mul(mlp.gate_up_proj(h)))
        return K.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)[0]


class LlamaForCausalLM(nn.Module):
    """Token ids in, next-token logits out."""

    default_head = "text"
    pad_token = 0          # what padding rows of a CUDA-graph batch feed in

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        eos = cfg.eos_token_id
        stop = set() if eos is None else set(eos) if isinstance(eos, (list, tuple)) else {eos}
        self.heads = {"text": Head(lambda h: self.lm_head(h).float()[:, None], 1, stop)}

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    def token_tensor(self, tokens: list[int], device: torch.device) -> torch.Tensor:
        return torch.tensor(tokens, dtype=torch.long, device=device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata,
                overrides: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """input_ids: [T]; overrides: (flat token index [n], embeddings [n, H]) -> hidden [T, H]"""
        return self.model(self.embed_tokens(input_ids), positions, md, overrides)

    def check_prompt(self, prompt: list) -> None:
        vocab = self.config.vocab_size
        bad = [t for t in prompt if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}), got {bad[:5]}")

    def check_speaker(self, speaker: object) -> tuple:
        raise ValueError("speaker is only accepted by audio models (a ChatTTS release folder)")

    def embed_overrides(self, seq, start: int, end: int) -> list[tuple[int, torch.Tensor]]:
        return []

    def fused_weight(self, name: str) -> tuple[str, int, int] | None:
        return fused_weight(self.model.layers[0], name)


def fused_weight(layer: LlamaLayer, name: str) -> tuple[str, int, int] | None:
    """Map a checkpoint tensor name onto (our fused parameter, row offset, rows), or None."""
    q, kv, inter = layer.self_attn.q_size, layer.self_attn.kv_size, layer.mlp.inter
    for part, (fused, off, rows) in {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
        "self_attn.k_proj": ("self_attn.qkv_proj", q, kv),
        "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, kv),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, inter),
        "mlp.up_proj": ("mlp.gate_up_proj", inter, inter),
    }.items():
        if f".{part}." in name:
            return name.replace(part, fused), off, rows
    return None


def row_kernels(body) -> object | None:
    """The module for body.forward_rows (velocity/model/kernels/csrc/layer_rows.cpp) where the linears of the
    LlamaBody's layers are all Int8Linears or all F32Linears, none with a bias; else None."""
    from velocity.model.kernels.cpu_kernels import kernels
    from velocity.model.layers.int8_linear import Int8Linear
    from velocity.model.layers.packed_linear import F32Linear

    linears = [m for layer in body.layers for m in layer.modules() if hasattr(m, "in_features")]   # every kind
    kinds = {type(m) for m in linears}
    if not (kinds == {Int8Linear} or kinds == {F32Linear}) or any(_has_bias(m) for m in linears):
        return None
    return kernels()


def _has_bias(linear) -> bool:
    return linear.bias is not None and linear.bias.numel() > 0
