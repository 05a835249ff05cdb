"""CPU linears on int8 weights, with int8 activations quantized per call (dynamic quantization).

A CPU decode step reads every weight once, so it is bound by memory bandwidth: int8 weights
are a quarter of the bytes. Weights are quantized symmetrically per output channel (scale =
max |w| / 127); each call quantizes its input per tensor to 7 bits (fbgemm's reduce_range, no
overflow without VNNI) and runs fbgemm's int8 GEMM (`quantized::linear_dynamic`, part of
torch). Measured on the 2-core CI machine against the alternatives (a 20-layer ChatTTS-size
stack, docs/benchmarks.md "int8 on CPU"): 3.2x faster than the oneDNN-prepacked float32
linears at one row; torchao's Int8WeightOnly and Int8DynamicActivationInt8Weight were slower
than float32 in eager mode here (no x86 kernels in its wheel) and still 2.7x slower than this
under torch.compile.

This changes the output (quantization error): opt-in (VELOCITY_QUANTIZE=int8).
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

from velocity.model.packed_linear import replace_linears


def require_int8(device: torch.device, dtype: torch.dtype, what: str, setting: str) -> None:
    """ValueError naming `setting` unless int8 linears can run here (fbgemm: CPU, float32)."""
    if not (device.type == "cpu" and dtype == torch.float32 and torch.backends.quantized.engine in ("x86", "fbgemm")):
        raise ValueError(f"{what} on int8 needs the CPU and float32 (fbgemm's int8 linears); it runs {dtype} on "
                         f"{device}: unset {setting}")


class Int8Linear(nn.Module):
    """nn.Linear's forward with int8 weights (per output channel) and dynamically quantized input."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()                          # [out, in]
        scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)         # [out]
        bias = None if linear.bias is None else linear.bias.detach().float()
        with warnings.catch_warnings():      # torch marks quantized tensors deprecated; the op is what runs
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(w, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0,
                                           torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(model: nn.Module, within: type) -> int:
    """Replace every nn.Linear inside modules of type `within` (the transformer layers; the heads
    keep float32) by an Int8Linear; returns how many."""
    return sum(replace_linears(block, Int8Linear) for block in [m for m in model.modules() if isinstance(m, within)])
