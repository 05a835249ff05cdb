"""Which torch device and dtype a setting names ("auto": CUDA when there is one): for the engine,
the vocoder and the Triton models alike."""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available; use device='cpu' or 'auto'")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def kv_dtype(name: str, device: torch.device, dtype: torch.dtype, quantize: str = "none") -> torch.dtype:
    """The KV cache's dtype. "auto": float16 under int8 linears on CPU (that path is not the reference's,
    and a float16 cache adds no error measured past int8's own: benchmarks/kv_quality.py), else the
    model's. "float32": the model's, which must be float32. "float16", "int8": a float32 model on CPU
    only (the C++ attention and the torch path both read its rows as float32; int8's heads carry
    their scales: velocity.model.layers.attention.as_cache)."""
    if name == "auto":
        return torch.float16 if quantize == "int8" and device.type == "cpu" and dtype == torch.float32 else dtype
    if name == "float32":
        if dtype != torch.float32:
            raise ValueError(f"a float32 KV cache is for a float32 model (this engine: {dtype}); leave the KV cache dtype at auto")
        return dtype
    if device.type != "cpu" or dtype != torch.float32:
        raise ValueError(f"a {name} KV cache is for a float32 model on CPU (this engine: {dtype} on {device.type}); "
                         "on a GPU the cache takes the model's dtype: leave the KV cache dtype at auto")
    return torch.int8 if name == "int8" else DTYPES[name]
