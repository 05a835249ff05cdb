"""Small random Llama checkpoints saved by transformers, and transformers' own greedy ids."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 384


def make_llama(path: Path, seed: int = 0, **overrides) -> LlamaForCausalLM:
    """A randomly initialised LlamaForCausalLM, saved as safetensors in path."""
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
               rms_norm_eps=1e-5, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    with torch.no_grad():   # larger weights than the default init, so logits are well apart
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    model.save_pretrained(path)
    return model


def prompts(lengths: list[int], seed: int = 1, prefix: list[int] | None = None) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [(prefix or []) + torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def hf_greedy(model: LlamaForCausalLM, prompt: list[int], n: int) -> list[int]:
    """transformers.generate, greedy, exactly n new tokens, one prompt at a time (no padding)."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def assert_same(ours: list[list[int]], refs: list[list[int]], prompts: list[list[int]], label: str = "") -> None:
    """Prompt by prompt; the message shows both sequences where they first differ."""
    bad = []
    for i, (o, r) in enumerate(zip(ours, refs)):
        if o != r:
            at = next((j for j, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r)))
            bad.append(f"prompt {i} (len {len(prompts[i])}) differs at new token {at}:\n"
                       f"  velocity:     {o}\n  transformers: {r}")
    assert len(ours) == len(refs), f"{label}: {len(ours)} outputs for {len(refs)} prompts"
    assert not bad, f"{label}: greedy ids differ from transformers\n" + "\n".join(bad)
