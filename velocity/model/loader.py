"""Build models on the meta device and fill them from safetensors (memory-mapped, no pickle)."""
from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

logger = logging.getLogger(__name__)


class WeightError(ValueError):
    """A checkpoint that cannot be loaded: names the file and the tensor."""


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_empty(factory: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Construct on the meta device (no memory, no init), then allocate uninitialised storage."""
    with default_dtype(dtype), torch.device("meta"):
        model = factory()
    return model.to_empty(device=device)


def iter_safetensors(files: list[Path]) -> Iterator[tuple[Path, str, torch.Tensor]]:
    """(file, name, tensor) for every tensor, read lazily from memory-mapped files."""
    for f in files:
        if not f.is_file():
            raise WeightError(f"{f}: weights file missing")
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    yield f, name, sf.get_tensor(name)
        except WeightError:
            raise
        except Exception as e:  # truncated or corrupt file
            raise WeightError(f"{f}: cannot read safetensors ({e})") from e


def fill(model: nn.Module, tensors: Iterator[tuple[Path, str, torch.Tensor]],
         rename: Callable[[str], str | None] = lambda n: n,
         fused: Callable[[str], tuple[str, int, int] | None] = lambda n: None) -> None:
    """Copy checkpoint tensors into model parameters; every parameter must be filled exactly.

    rename maps a checkpoint name to ours (None: skip the tensor); fused maps it to a row
    slice (name, offset, rows) of a fused parameter.
    """
    params = dict(model.named_parameters())
    filled: dict[str, int] = {}
    for file, name, t in tensors:
        ours = rename(name)
        if ours is None:
            continue
        off, rows = 0, None
        if (f := fused(ours)) is not None:
            ours, off, rows = f
        if ours not in params:
            raise WeightError(f"{file}: unexpected tensor {name!r} (no parameter {ours!r})")
        p = params[ours]
        dst = p.data if rows is None else p.data[off:off + rows]
        if tuple(t.shape) != tuple(dst.shape):
            raise WeightError(f"{file}: tensor {name!r} has shape {tuple(t.shape)}, "
                              f"the config implies {tuple(dst.shape)}")
        dst.copy_(t)
        filled[ours] = filled.get(ours, 0) + (dst.shape[0] if rows is not None else p.shape[0] if p.dim() else 1)
    missing = [n for n, p in params.items() if filled.get(n, 0) != (p.shape[0] if p.dim() else 1)]
    if missing:
        raise WeightError(f"missing tensors for {missing[:8]}{' ...' if len(missing) > 8 else ''}")


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise WeightError(f"{path}: file missing")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise WeightError(f"{path}: not valid JSON ({e})") from e


def load_llama_causal_lm(path: str | Path, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A Hugging Face Llama causal-LM folder (config.json + *.safetensors)."""
    from transformers import LlamaConfig

    from velocity.model.llama import LlamaForCausalLM

    path = Path(path)
    read_json(path / "config.json")
    cfg = LlamaConfig.from_pretrained(str(path), local_files_only=True)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightError(f"{path}: no *.safetensors files (only safetensors are loaded, never pickle)")
    model = build_empty(lambda: LlamaForCausalLM(cfg), device, dtype)
    tie = getattr(cfg, "tie_word_embeddings", False)
    names = {n for f in files for n in safe_open(str(f), framework="pt").keys()}
    tie = tie or "lm_head.weight" not in names
    if tie:
        model.lm_head.weight = model.embed_tokens.weight
    def rename(n: str) -> str | None:
        if (n == "lm_head.weight" and tie) or "rotary_emb" in n:
            return None
        return "embed_tokens.weight" if n == "model.embed_tokens.weight" else n

    fill(model, iter_safetensors(files), rename=rename, fused=model.fused_weight)
    model.model.init_rope(cfg, device, dtype)
    return model.eval()


def load_model(path: str | Path, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Tell a ChatTTS release folder from a Hugging Face causal-LM folder, and load it."""
    path = Path(path)
    if not path.exists():
        raise WeightError(f"{path}: model folder not found")
    if (path / "asset" / "gpt" / "config.json").exists():
        raise WeightError(f"{path}: ChatTTS release folders are not supported yet")
    return load_llama_causal_lm(path, device, dtype)
