"""CPU float32 linears on weights packed once: for the C++ f32_gemm, else for oneDNN.

A decode step multiplies a few rows (one per running sequence) by every weight. MKL's sgemm
behind nn.Linear costs about the same for 1 or 2 rows but several times that for 8-32 rows;
oneDNN with the weight reordered once into its blocked layout does several concurrent
sequences faster than nn.Linear and one sequence no slower (docs/benchmarks/history.md,
"Prepacked CPU weights"). Same float32 arithmetic, another summation order: outputs differ
from nn.Linear's by float rounding, as nn.Linear's own differ between batch sizes.

Where the C++ kernels are built with AVX2 and FMA or AVX-512, F32Linear runs on their f32_gemm
instead (velocity/model/kernels/csrc/f32_gemm.cpp): quicker than oneDNN's from 1 to 128 rows a call, and near
the memory bound at one row (docs/benchmarks.md, "The float32 linears on a C++ kernel").
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """nn.Linear's forward on an oneDNN-reordered copy of its weight (inference only)."""

    def __init__(self, linear: nn.Linear, rows_hint: int = 8) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, rows_hint)   # opaque [out, in]
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class F32Linear(nn.Module):
    """nn.Linear's forward on the C++ f32_gemm (velocity/model/kernels/csrc/f32_gemm.cpp), its weight kept only in
    the kernel's layout (inference only). kernels: velocity.model.kernels.cpu_kernels.kernels()."""

    rows_scaled = False         # rows_call() takes the rows as they are (velocity/model/kernels/csrc/layer_rows.cpp)

    def __init__(self, linear: nn.Linear, kernels) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()                                   # [N, K]
        blocks = -(-self.out_features // 16)
        pad = F.pad(w, (0, 0, 0, 16 * blocks - self.out_features))           # zero rows: N to 16 blocks
        self.packed = pad.view(blocks, 16, self.in_features).transpose(1, 2).contiguous()   # [N / 16, K, 16]
        self.bias = w.new_empty(0) if linear.bias is None else linear.bias.detach().float().contiguous()
        self.gemm = kernels.f32_gemm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        y = self.gemm(x.reshape(-1, self.in_features).contiguous(), self.packed, self.bias, self.out_features)
        return y.view(*x.shape[:-1], self.out_features)

    def rows_call(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """forward for contiguous [T, in] rows, its weights bound (LlamaBody.forward_rows):
        float32 rows need no scales (velocity/model/kernels/csrc/layer_rows.cpp passes ones)."""
        gemm, packed, bias, n = self.gemm, self.packed, self.bias, self.out_features
        return lambda x: gemm(x, packed, bias, n)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias.numel() > 0}, f32_gemm"


def replace_linears(model: nn.Module, make) -> int:
    """Replace every nn.Linear in model by make(linear); returns how many."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, make(child))
                n += 1
    return n


def replace_linears_in(model: nn.Module, within: type, make) -> int:
    """replace_linears in every module of type `within` inside model; returns how many."""
    return sum(replace_linears(block, make) for block in [m for m in model.modules() if isinstance(m, within)])


def packer(kernels=None, rows_hint: int = 8):
    """What packs an nn.Linear for CPU float32: an F32Linear where `kernels` (the C++ CPU kernels)
    has f32_gemm built, else a PackedLinear for about rows_hint rows a call."""
    if kernels is not None and kernels.f32_gemm_lanes() > 0:
        return lambda linear: F32Linear(linear, kernels)
    return lambda linear: PackedLinear(linear, rows_hint)


def pack_linears(model: nn.Module, kernels=None) -> int:
    """Replace every nn.Linear in model by packer(kernels)'s linear; returns how many."""
    return replace_linears(model, packer(kernels))
