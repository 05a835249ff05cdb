"""CPU linears on int8 weights, with each row of the input quantized to int8 on its own.

A CPU decode step reads every weight once, so it is bound by memory bandwidth: int8 weights
are a quarter of the bytes. Weights are quantized symmetrically per output channel (scale =
max |w| / 127). Each input row (one token) is scaled by its own max |x| and quantized with
fixed parameters, and fbgemm's int8 GEMM runs on the result
(`quantized::linear_with_input_q_dq_qweight_dq_output_fp32`, part of torch), or, where the C++
kernels are built (AVX-512 VNNI, with AMX where the CPU has it, or AVX2), their int8_gemm with the same arithmetic
(velocity/model/kernels/csrc/int8_gemm.cpp). A row's output is therefore the same, bit for bit, alone or beside
any other rows.

Why per row: on a real pretrained model (SmolLM2-135M, tests/unit/model/test_int8_quality.py) one scale
for the whole input, as `quantized::linear_dynamic` uses, let outlier channels crush every
other value. Perplexity on real text went from 25.2 to 57.1. Per row it is 25.9 with 8-bit rows.
Weight-only int8 would be 25.2, but it runs slower than these at one row and slower than float32
from 8 rows (docs/benchmarks.md "int8 on CPU").

Rows get 8 bits where fbgemm accumulates in 32 bits (AVX-512 VNNI). Without VNNI, pairs of
products are summed in 16 bits and could saturate, so rows get 7 bits there (fbgemm's
reduce_range).

Against the oneDNN-prepacked float32 linears, and against torchao's Int8WeightOnly and
Int8DynamicActivationInt8Weight (no x86 kernels in its wheel; slower than fbgemm even under
torch.compile): docs/benchmarks.md "int8 on CPU".

This changes the output (quantization error), so it is opt-in (VELOCITY_QUANTIZE=int8).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from velocity.model.kernels.cpu_isa import has_vnni
from velocity.model.layers.packed_linear import replace_linears_in


def require_int8(device: torch.device, dtype: torch.dtype, what: str, setting: str) -> None:
    """ValueError naming `setting` unless int8 linears can run here (fbgemm: CPU, float32)."""
    if not (device.type == "cpu" and dtype == torch.float32 and torch.backends.quantized.engine in ("x86", "fbgemm")):
        raise ValueError(f"{what} on int8 needs the CPU and float32 (fbgemm's int8 linears); it runs {dtype} on "
                         f"{device}: unset {setting}")


def channel_scale(w: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 scale per output channel: max |w| / 127. w: [out, in] -> [out]"""
    return (w.abs().amax(dim=1) / 127).clamp_min(1e-12)


def activation_bits() -> int:
    """8 where fbgemm runs its AVX-512 VNNI path (products accumulate in 32 bits), else 7: also on
    a VNNI machine capped to AVX2 (scripts/serve.sh --cpu-isa), where fbgemm runs its AVX2 path."""
    return 8 if has_vnni() else 7


class Int8Linear(nn.Module):
    """nn.Linear's forward with int8 weights (per output channel) and int8 input rows (per row).
    kernels: the C++ CPU kernels (velocity.model.kernels.cpu_kernels.kernels()): where their int8_gemm is
    built for this row width (8 bits with AVX-512 VNNI, 7 with AVX2), it runs on them instead of
    fbgemm's op, on the weights in its own layout (one copy either way; velocity/model/kernels/csrc/int8_gemm.cpp)."""

    rows_scaled = True          # scaled() takes rows scaled into [-1, 1] (velocity/model/kernels/csrc/layer_rows.cpp)

    def __init__(self, linear: nn.Linear, bits: int | None = None, kernels=None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bits = bits or activation_bits()
        levels = 2 ** (self.bits - 1) - 1                           # 127 or 63
        self.x_scale, self.x_zero = 1.0 / levels, levels + 1        # a row scaled into [-1, 1] -> quint8 [1, 2 * levels + 1]
        w = linear.weight.detach().float()                          # [out, in]
        scale = channel_scale(w)                                    # [out]
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        with warnings.catch_warnings():      # torch marks quantized tensors deprecated; the op is what runs
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(w, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0,
                                           torch.qint8)
            self.gemm = None
            if (kernels is not None and self.bits == kernels.int8_gemm_bits()
                    and self.out_features % 16 == 0 and self.in_features % 4 == 0):
                qw = q.int_repr()                                    # [out, in] int8
                self.gemm, self.linear, self.no_bias = kernels.int8_gemm, kernels.int8_linear, torch.empty(0)
                self.packed = kernels.int8_pack(qw)
                self.wsum = qw.sum(1, dtype=torch.int32)              # [out]
                self.wscale = (q.q_per_channel_scales() / levels).float()   # [out]: weight scale x row step
            else:
                self.packed = torch.ops.quantized.linear_prepack(q, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        if self.gemm is not None:                                   # the steps below in one C++ call
            y = self.linear(x.reshape(-1, self.in_features).contiguous(), self.packed, self.wsum, self.wscale,
                            self.no_bias if self.bias is None else self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        r = x.abs().amax(-1, keepdim=True).clamp_min(1e-30)         # [..., 1]: each row's own scale
        y = self.scaled(x / r)
        y.mul_(r)                                                   # y is the op's own new tensor
        return y if self.bias is None else y.add_(self.bias)

    def scaled(self, x: torch.Tensor) -> torch.Tensor:
        """The int8 op on rows already scaled into [-1, 1]: the output before the rows' scales and
        the bias (velocity/model/kernels/csrc/layer_rows.cpp scales both sides). x: [..., in] -> [..., out]"""
        if self.gemm is not None:
            y = self.gemm(x.reshape(-1, self.in_features).contiguous(), self.packed, self.wsum, self.wscale)
            return y.view(*x.shape[:-1], self.out_features)
        return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            x, self.x_scale, self.x_zero, self.packed)

    def rows_call(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """scaled() for contiguous [T, in] rows, its weights bound: what LlamaBody.forward_rows
        calls (no reshapes or lookups a call)."""
        if self.gemm is None:
            return self.scaled
        gemm, packed, wsum, wscale = self.gemm, self.packed, self.wsum, self.wscale
        return lambda x: gemm(x, packed, wsum, wscale)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 ({self.bits}-bit rows"
                f"{', int8_gemm' if self.gemm is not None else ''})")


def quantize_linears(model: nn.Module, within: type, kernels=None) -> int:
    """Replace every nn.Linear inside modules of type `within` (the transformer layers; the heads
    keep float32) by an Int8Linear (on the C++ kernels' int8_gemm where it can); returns how many."""
    return replace_linears_in(model, within, lambda linear: Int8Linear(linear, kernels=kernels))
