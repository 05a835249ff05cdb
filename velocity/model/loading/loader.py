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

from velocity.model.networks.llama_config import ConfigError, LlamaConfig

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


class NoInit(torch.overrides.TorchFunctionMode):
    """torch.nn.init's in-place initialisers (normal_, uniform_, ...) as no-ops, in this thread.
    On the meta device they compute nothing anyway, but some run there on torch's Python
    reference kernels, whose first call imports torch._dynamo, a slow part of every model
    process's start."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def build_empty(factory: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Construct on the meta device (no memory, no init), then allocate uninitialised storage.
    Modules with computed (non-checkpoint) buffers refill them in init_buffers()."""
    with default_dtype(dtype), torch.device("meta"), NoInit():
        model = factory()
    # model.to_empty(device=device), on torch.empty: to_empty's empty_like runs a Python reference
    # kernel from the meta device whose first call imports sympy
    model = model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    for m in model.modules():
        if hasattr(m, "init_buffers"):
            m.init_buffers()
    return model


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
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise WeightError(f"{path}: not valid JSON ({e})") from e


def read_llama_config(path: Path) -> LlamaConfig:
    try:
        return LlamaConfig.from_dict(read_json(path))
    except ConfigError as e:
        raise WeightError(f"{path}: {e}") from e


def load_llama_causal_lm(path: str | Path, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A Hugging Face Llama causal-LM folder (config.json + *.safetensors)."""
    from velocity.model.networks.llama import LlamaForCausalLM

    path = Path(path)
    cfg = read_llama_config(path / "config.json")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightError(f"{path}: no *.safetensors files (only safetensors are loaded, never pickle)")
    model = build_empty(lambda: LlamaForCausalLM(cfg), device, dtype)
    tie = cfg.tie_word_embeddings
    names = {n for f in files for n in tensor_shapes(f)}
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


def fold_weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch weight_norm(dim=0): weight = g * v / ||v||, the norm taken per output row."""
    v = v.float()
    return (g.float().view(-1, *([1] * (v.dim() - 1))) * v / v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1))))


def iter_folded(tensors: Iterator[tuple[Path, str, torch.Tensor]]) -> Iterator[tuple[Path, str, torch.Tensor]]:
    """Pass tensors through, folding weight-norm pairs X.parametrizations.weight.original0/1 into X.weight."""
    pending: dict[str, dict[str, tuple[Path, torch.Tensor]]] = {}
    for file, name, t in tensors:
        if ".parametrizations.weight.original" in name:
            base, which = name.split(".parametrizations.weight.")
            pair = pending.setdefault(base, {})
            pair[which] = (file, t)
            if len(pair) == 2:
                (_, g), (_, v) = pair["original0"], pair["original1"]
                if g.numel() != v.shape[0]:
                    raise WeightError(f"{file}: {base}.parametrizations.weight.original0 has {g.numel()} values "
                                      f"for {v.shape[0]} rows of original1")
                yield file, f"{base}.weight", fold_weight_norm(g, v)
                del pending[base]
        else:
            yield file, name, t
    for base, pair in pending.items():
        missing = {"original0", "original1"} - set(pair)
        raise WeightError(f"{next(iter(pair.values()))[0]}: {base}.parametrizations.weight.{missing.pop()} missing")


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    if not path.is_file():
        raise WeightError(f"{path}: weights file missing")
    try:
        with safe_open(str(path), framework="pt") as sf:
            return {n: tuple(sf.get_slice(n).get_shape()) for n in sf.keys()}
    except Exception as e:
        raise WeightError(f"{path}: cannot read safetensors ({e})") from e


def token_ids(tokenizer_json: Path, names: list[str]) -> dict[str, int | None]:
    """Ids of special tokens, read from the release's tokenizer.json (vocab and added tokens)."""
    tok = read_json(tokenizer_json)
    vocab = dict(tok.get("model", {}).get("vocab", {}))
    vocab.update({a["content"]: a["id"] for a in tok.get("added_tokens", [])})
    return {n: vocab.get(n) for n in names}


def load_chattts(path: Path, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A ChatTTS release folder: asset/gpt/{config.json,model.safetensors}, asset/Embed.safetensors,
    asset/tokenizer/tokenizer.json. Sizes (num_vq, vocabularies) come from the files."""
    from velocity.model.networks.chattts import ChatTTSGPT

    asset = path / "asset"
    cfg = read_llama_config(asset / "gpt" / "config.json")
    embed_file, gpt_file = asset / "Embed.safetensors", asset / "gpt" / "model.safetensors"
    shapes = tensor_shapes(embed_file)
    num_vq = sum(1 for n in shapes if n.startswith("emb_code.") and n.endswith(".weight"))
    if num_vq == 0 or "emb_text.weight" not in shapes:
        raise WeightError(f"{embed_file}: expected emb_text.weight and emb_code.N.weight tensors")
    num_text, H = shapes["emb_text.weight"]
    num_audio = shapes["emb_code.0.weight"][0]
    if H != cfg.hidden_size:
        raise WeightError(f"{embed_file}: tensor 'emb_text.weight' has width {H}, but "
                          f"{asset / 'gpt' / 'config.json'} says hidden_size={cfg.hidden_size}")
    ids = token_ids(asset / "tokenizer" / "tokenizer.json", ["[spk_emb]", "[Ebreak]"])
    stop = {ids["[Ebreak]"]} if ids["[Ebreak]"] is not None else set()
    model = build_empty(lambda: ChatTTSGPT(cfg, num_text, num_audio, num_vq, ids["[spk_emb]"], stop), device, dtype)
    fill(model.model, iter_safetensors([gpt_file]),
         rename=lambda n: None if n.startswith("embed_tokens.") or "rotary_emb" in n else n.removeprefix("model."),
         fused=lambda n: model.fused_weight(n))
    fill_part(model, iter_folded(iter_safetensors([embed_file])), ("emb_text", "emb_code", "head_text", "head_code"))
    model.model.init_rope(cfg, device, dtype)
    return model.eval()


def fill_part(model: nn.Module, tensors: Iterator[tuple[Path, str, torch.Tensor]], prefixes: tuple[str, ...]) -> None:
    """fill() restricted to the parameters under the given top-level names."""
    part = nn.ModuleDict({p: getattr(model, p) for p in prefixes})
    fill(part, tensors)


def load_model(path: str | Path, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Tell a ChatTTS release folder from a Hugging Face causal-LM folder, and load it."""
    path = Path(path)
    if not path.exists():
        raise WeightError(f"{path}: model folder not found")
    if (path / "asset" / "gpt").is_dir() or (path / "asset" / "Embed.safetensors").exists():
        return load_chattts(path, device, dtype)
    return load_llama_causal_lm(path, device, dtype)
