"""velocity's Llama config reader and rotary tables == transformers' LlamaConfig and
LlamaRotaryEmbedding, bit for bit, for config.json in both of its rope spellings."""
from __future__ import annotations

import pytest
import torch

from velocity.model.networks.llama_config import ConfigError, LlamaConfig, rope_tables

BASE = dict(vocab_size=384, hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=4096)
CASES = {
    # the release's asset/gpt/config.json (transformers 4.41 wrote it): its keys, ChatTTS's own among them
    "chattts": dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_key_value_heads=12,
                    num_hidden_layers=20, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, hidden_act="silu",
                    attention_bias=False, mlp_bias=False, tie_word_embeddings=False, vocab_size=32000,
                    bos_token_id=1, eos_token_id=2, pretraining_tp=1, use_cache=False, torch_dtype="float32",
                    num_audio_tokens=626, num_text_tokens=21178, num_vq=4, spk_KL=False, spk_emb_dim=192),
    "defaults": {},
    "gqa_head_dim": dict(num_key_value_heads=2, head_dim=32, rope_theta=500000.0, eos_token_id=[5, 7]),
    "linear_legacy": dict(rope_theta=5000.0, rope_scaling={"type": "linear", "factor": 2.0}),
    "linear_v5": dict(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
    "llama3_legacy": dict(rope_theta=500000.0, tie_word_embeddings=True,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 512}),
    "llama3_v5": dict(rope_parameters={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 256,
                                       "rope_theta": 50000.0}),
}


@pytest.mark.parametrize("name", CASES)
def test_config_and_rope_tables_equal_transformers(name):
    from transformers import LlamaConfig as HFConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    d = BASE | CASES[name]
    ours, hf = LlamaConfig.from_dict(dict(d)), HFConfig(**d)
    for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "eos_token_id",
              "tie_word_embeddings", "attention_bias", "mlp_bias"):
        assert getattr(ours, f) == getattr(hf, f), f
    rope = LlamaRotaryEmbedding(hf)
    pos = torch.arange(d["max_position_embeddings"])[None]
    for dtype in (torch.float32, torch.bfloat16):
        cos, sin = rope(torch.empty(0, dtype=dtype), pos)
        our_cos, our_sin = rope_tables(ours, torch.device("cpu"), dtype)
        assert torch.equal(our_cos, cos[0]) and torch.equal(our_sin, sin[0]), (name, dtype)


@pytest.mark.parametrize("bad, message", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope type 'yarn' is not supported"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(hidden_size=100, num_attention_heads=3), "multiple of num_attention_heads"),
])
def test_configs_velocity_cannot_run_say_why(bad, message):
    with pytest.raises(ConfigError, match=message):
        LlamaConfig.from_dict(BASE | bad)
