"""A Llama config.json read without transformers (the server's path must not need it), with
transformers' LlamaConfig defaults, and the rotary tables as its LlamaRotaryEmbedding computes them.
tests/unit/model/test_llama_config.py holds both equal to transformers', bit for bit."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch

ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(ValueError):
    """A config.json velocity cannot run; the message names the field and what is allowed."""


@dataclass(slots=True)
class LlamaConfig:
    """The fields the Llama body uses; defaults are transformers' LlamaConfig's."""
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    rope: dict = field(default_factory=dict)     # rope_type, rope_theta and the type's own keys

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        """A config.json's dict: rope in transformers 5's `rope_parameters`, or the older
        `rope_theta` + `rope_scaling` (its `type` or `rope_type`)."""
        names = {f.name for f in fields(cls)} - {"rope"}
        cfg = cls(**{k: v for k, v in d.items() if k in names})
        cfg.num_key_value_heads = cfg.num_key_value_heads or cfg.num_attention_heads
        if cfg.head_dim is None:
            if cfg.hidden_size % cfg.num_attention_heads:
                raise ConfigError(f"hidden_size={cfg.hidden_size} must be a multiple of "
                                  f"num_attention_heads={cfg.num_attention_heads} (or give head_dim)")
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        if cfg.hidden_act != "silu":
            raise ConfigError(f"hidden_act={cfg.hidden_act!r}: only 'silu' (Llama's) is supported")
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        rope.setdefault("rope_type", rope.get("type", "default"))
        rope.setdefault("rope_theta", d.get("rope_theta", 10000.0))
        if rope["rope_type"] not in ROPE_TYPES:
            raise ConfigError(f"rope type {rope['rope_type']!r} is not supported: one of {', '.join(ROPE_TYPES)}")
        if rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ConfigError("partial_rotary_factor must be 1.0 (rotary embedding over the whole head)")
        if rope["rope_type"] == "llama3":
            rope.setdefault("original_max_position_embeddings",
                            d.get("original_max_position_embeddings", cfg.max_position_embeddings))
        cfg.rope = rope
        return cfg


def inverse_frequencies(cfg: LlamaConfig) -> torch.Tensor:
    """inv_freq [D/2], float32 on the CPU, for the config's rope type."""
    r, dim = cfg.rope, cfg.head_dim
    inv = 1.0 / (r["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if r["rope_type"] == "linear":
        inv /= r["factor"]
    elif r["rope_type"] == "llama3":    # Llama 3.1: long wavelengths scaled, a smooth ramp between
        factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old = r["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def rope_tables(cfg: LlamaConfig, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [P, D] for every position, in float32 on the device, then cast, as transformers does."""
    inv = inverse_frequencies(cfg).to(device)
    pos = torch.arange(cfg.max_position_embeddings, device=device)
    freqs = pos[:, None].float() * inv                   # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)              # [P, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)
