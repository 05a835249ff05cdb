"""CPU linears on weights prepacked for oneDNN.

A decode step multiplies a few rows (one per running sequence) by every weight. MKL's sgemm
behind nn.Linear costs about the same for 1 or 2 rows but several times that for 8-32 rows;
oneDNN with the weight reordered once into its blocked layout does several concurrent
sequences faster than nn.Linear and one sequence no slower (docs/benchmarks/history.md,
"Prepacked CPU weights"). Same float32 arithmetic, another summation order: outputs differ
from nn.Linear's by float rounding, as nn.Linear's own differ between batch sizes.
"""
from __future__ import annotations

import torch
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


def pack_linears(model: nn.Module) -> int:
    """Replace every nn.Linear in model by a PackedLinear; returns how many."""
    return replace_linears(model, PackedLinear)
