"""Write a complete folder in the ChatTTS release's layout with seeded random weights.

Random weights give noise, not speech: this is for tests and for `make serve` without the
release. Sizes: `tiny` (for tests: seconds to load) and `full` (the release's dimensions).
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from velocity.demo.audio_weights import random_decoder_tensors, random_dvae_tensors, random_vocos_tensors
from velocity.demo.tokens import BERT_SPECIALS, SPECIAL_TOKENS, demo_vocab

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class GPTSize:
    hidden: int
    layers: int
    heads: int
    mlp: int
    text_vocab: int          # including the added special tokens
    audio_vocab: int = 626   # codes 0..624 + the end token 625
    num_vq: int = 4
    max_positions: int = 4096


SIZES = {
    "tiny": GPTSize(hidden=64, layers=2, heads=4, mlp=128, text_vocab=1024, max_positions=2048),
    "full": GPTSize(hidden=768, layers=20, heads=12, mlp=3072, text_vocab=21178),
}


def write_tokenizer(out: Path, text_vocab: int) -> dict[str, int]:
    """asset/tokenizer in the release's layout (a BERT WordPiece tokenizer, as transformers' BertTokenizer
    reads it) whose vocabulary + special tokens has text_vocab entries. Written with `tokenizers`
    alone, so `make serve` needs no transformers; tests/unit/tts/test_tokenizer.py loads it with both."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = demo_vocab(text_vocab - len(SPECIAL_TOKENS))
    ids = {w: i for i, w in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in BERT_SPECIALS + SPECIAL_TOKENS])
    # the release's file pads and truncates to 256 (a tokenizer must turn both off for whole prompts)
    tok.enable_padding(length=256, pad_id=ids["[PAD]"], pad_token="[PAD]")
    tok.enable_truncation(256)
    assert tok.get_vocab_size(with_added_tokens=True) == text_vocab, (tok.get_vocab_size(), text_vocab)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    names = dict(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    added = tok.get_added_tokens_decoder()
    (out / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": {str(i): {"content": t.content, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for i, t in sorted(added.items())},
        "additional_special_tokens": SPECIAL_TOKENS, "clean_up_tokenization_spaces": False,
        "do_lower_case": True, "model_max_length": 1000000000000000019884624838656, "strip_accents": None,
        "tokenize_chinese_chars": True, "tokenizer_class": "BertTokenizer", **names}, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(names | {"additional_special_tokens": SPECIAL_TOKENS},
                                                            indent=2))
    full = tok.get_vocab(with_added_tokens=True)
    return {t: full[t] for t in SPECIAL_TOKENS}


def gpt_tensors(s: GPTSize, g: torch.Generator, std: float) -> tuple[dict, dict]:
    """(asset/gpt/model.safetensors, asset/Embed.safetensors) with the release's names."""
    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * std).contiguous()

    H, hd = s.hidden, s.hidden // s.heads
    gpt = {"norm.weight": torch.ones(H)}
    for i in range(s.layers):
        p = f"layers.{i}."
        gpt |= {p + "self_attn.q_proj.weight": rnd(H, H), p + "self_attn.k_proj.weight": rnd(H, H),
                p + "self_attn.v_proj.weight": rnd(H, H), p + "self_attn.o_proj.weight": rnd(H, H),
                p + "mlp.gate_proj.weight": rnd(s.mlp, H), p + "mlp.up_proj.weight": rnd(s.mlp, H),
                p + "mlp.down_proj.weight": rnd(H, s.mlp),
                p + "input_layernorm.weight": 1 + rnd(H) * 0.1, p + "post_attention_layernorm.weight": 1 + rnd(H) * 0.1}
    assert hd * s.heads == H
    emb = {"emb_text.weight": rnd(s.text_vocab, H)}
    for i in range(s.num_vq):
        emb[f"emb_code.{i}.weight"] = rnd(s.audio_vocab, H)
        emb[f"head_code.{i}.parametrizations.weight.original0"] = 1 + torch.rand(s.audio_vocab, 1, generator=g)
        emb[f"head_code.{i}.parametrizations.weight.original1"] = rnd(s.audio_vocab, H)
    emb["head_text.parametrizations.weight.original0"] = 1 + torch.rand(s.text_vocab, 1, generator=g)
    emb["head_text.parametrizations.weight.original1"] = rnd(s.text_vocab, H)
    return gpt, emb


def gpt_config(s: GPTSize) -> dict:
    return {"hidden_size": s.hidden, "intermediate_size": s.mlp, "num_attention_heads": s.heads,
            "num_key_value_heads": s.heads, "num_hidden_layers": s.layers, "max_position_embeddings": s.max_positions,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": False,
            "mlp_bias": False, "tie_word_embeddings": False, "vocab_size": 32000, "model_type": "llama"}


def write_speaker_stats(path: Path, dim: int, seed: int) -> None:
    """asset/spk_stat.pt as the release publishes it: torch.save of one float32 tensor [std, mean]
    (2 * dim values). Written only; velocity reads its raw bytes (velocity.tts.speaker)."""
    g = torch.Generator().manual_seed(seed + 1)
    std = 0.5 + torch.rand(dim, generator=g)
    mean = 0.3 * torch.randn(dim, generator=g)
    torch.save(torch.cat([std, mean]), str(path))


# What write_checkpoint writes, as a number: raise it when that changes, so that a demo folder
# written by an older velocity is rebuilt instead of served (its files no longer fit the code).
DEMO_FORMAT = 2


def is_current(out: str | Path, size: str = "tiny", seed: int = 0) -> bool:
    """out holds the demo checkpoint this velocity writes for (size, seed)."""
    try:
        meta = json.loads((Path(out) / "velocity-demo.json").read_text())
    except (OSError, ValueError):
        return False
    return (meta.get("format"), meta.get("size"), meta.get("seed"), meta.get("small_audio", False)) == \
        (DEMO_FORMAT, size, seed, False)


def write_checkpoint(out: str | Path, size: str = "tiny", seed: int = 0, small_audio: bool = False) -> Path:
    """Write out/asset/... in the release's layout; returns out. small_audio: the DVAE's and the
    Decoder's stacks and Vocos narrow and shallow (velocity.demo.audio_weights.SMALL_STACK), for
    tests that need audio but not the release's vocoder."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    s, out = SIZES[size], Path(out)
    asset = out / "asset"
    (asset / "gpt").mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    std = 0.02 if size == "full" else 0.05
    gpt, emb = gpt_tensors(s, g, std)
    save_file(gpt, str(asset / "gpt" / "model.safetensors"))
    (asset / "gpt" / "config.json").write_text(json.dumps(gpt_config(s), indent=2))
    save_file(emb, str(asset / "Embed.safetensors"))
    save_file(random_dvae_tensors(g, small_audio), str(asset / "DVAE.safetensors"))
    save_file(random_vocos_tensors(g, small_audio), str(asset / "Vocos.safetensors"))
    save_file(random_decoder_tensors(g, s.hidden, small_audio), str(asset / "Decoder.safetensors"))
    write_speaker_stats(asset / "spk_stat.pt", s.hidden, seed)
    write_tokenizer(asset / "tokenizer", s.text_vocab)
    (out / "velocity-demo.json").write_text(json.dumps(
        {"note": "seeded random weights: noise, not speech", "format": DEMO_FORMAT, "size": size, "seed": seed,
         "gpt": asdict(s), "small_audio": small_audio}, indent=2))
    logger.info("wrote %s checkpoint (seed %d) to %s", size, seed, out)
    return out
