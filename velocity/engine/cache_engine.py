"""KV cache tensors per layer, on the device and in CPU swap space."""
from __future__ import annotations

import logging
import math
import mmap

import torch
from torch import nn

from velocity.model.layers.attention import cache_head_width

logger = logging.getLogger(__name__)


def attention_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "k_cache") and hasattr(m, "num_kv_heads")]


def bytes_per_block(model: nn.Module, block_size: int, dtype: torch.dtype) -> int:
    layers = attention_layers(model)
    a = layers[0]
    width = cache_head_width(a.head_dim, dtype)
    return 2 * len(layers) * block_size * a.num_kv_heads * width * torch.empty(0, dtype=dtype).element_size()


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros in host memory that the OS provides page by page as they are first written (an
    anonymous mapping): a KV budget then costs resident memory as its blocks are used, not up
    front (torch.zeros writes every page)."""
    n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, max(n, 1)), dtype=dtype, count=math.prod(shape)).view(shape)


class CacheEngine:
    """Allocates [N + 1, block_size, Hkv, D] key and value tensors per layer (int8: D + 4, see
    velocity.model.layers.attention.cache_head_width) and binds them
    to the model's attention modules. Block N is scratch: padded batch rows write there. On the
    CPU they are lazy_zeros: resident as blocks are written."""

    def __init__(self, model: nn.Module, num_blocks: int, num_cpu_blocks: int, block_size: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks
        self.layers = attention_layers(model)
        a = self.layers[0]
        width = cache_head_width(a.head_dim, dtype)          # an int8 cache's heads carry their scales
        shape = (num_blocks + 1, block_size, a.num_kv_heads, width)
        cpu_shape = (num_cpu_blocks, block_size, a.num_kv_heads, width)
        pin = device.type == "cuda"
        zeros = (lambda: lazy_zeros(shape, dtype)) if device.type == "cpu" else (
            lambda: torch.zeros(shape, device=device, dtype=dtype))
        self.gpu = [(zeros(), zeros()) for _ in self.layers]
        self.cpu = [(torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin), torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin))
                    for _ in self.layers] if num_cpu_blocks else []
        for layer, (k, v) in zip(self.layers, self.gpu):
            layer.k_cache, layer.v_cache = k, v
        logger.info("KV cache: %d blocks of %d tokens, %d tokens in all (%s, %.1f MiB%s), %d CPU swap blocks",
                    num_blocks, block_size, num_blocks * block_size, str(dtype).removeprefix("torch."),
                    bytes_per_block(model, block_size, dtype) * num_blocks / 2**20,
                    ", resident as it is written" if device.type == "cpu" else "", num_cpu_blocks)

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        """Copy device blocks to CPU blocks: [(device block, cpu block)]."""
        self._copy(mapping, self.gpu, self.cpu)

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        """Copy CPU blocks to device blocks: [(cpu block, device block)]."""
        self._copy(mapping, self.cpu, self.gpu)

    @staticmethod
    def _copy(mapping: list[tuple[int, int]], src: list, dst: list) -> None:
        if not mapping:
            return
        s = torch.tensor([m[0] for m in mapping])
        d = torch.tensor([m[1] for m in mapping])
        for (sk, sv), (dk, dv) in zip(src, dst):
            dk[d.to(dk.device)] = sk[s.to(sk.device)].to(dk.device, non_blocking=True)
            dv[d.to(dv.device)] = sv[s.to(sv.device)].to(dv.device, non_blocking=True)
