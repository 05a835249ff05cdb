"""The ConvNeXt block shared by the DVAE, the Decoder and Vocos (same tensor names as the release:
the layer scale is `gamma` in Vocos.safetensors and `weight` in DVAE/Decoder.safetensors)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvNeXtBlock(nn.Module):
    """Depthwise conv, LayerNorm, MLP, layer scale, residual. x: [B, C, T] -> [B, C, T]"""

    def __init__(self, dim: int, intermediate_dim: int, kernel: int = 7, dilation: int = 1,
                 scale_name: str = "gamma") -> None:
        super().__init__()
        self.scale_name = scale_name
        self.dwconv = nn.Conv1d(dim, dim, kernel, padding=dilation * (kernel // 2), dilation=dilation, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.register_parameter(scale_name, nn.Parameter(torch.ones(dim)))

    @property
    def reach(self) -> int:
        """Frames of context this block reads on each side."""
        return self.dwconv.dilation[0] * (self.dwconv.kernel_size[0] // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(x, self.dwconv(x))

    def mix(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """After the depthwise conv: x [B, C, T] the input, y [B, C, T] its conv -> the block's output."""
        y = y.transpose(1, 2)                                    # [B, T, C]
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (getattr(self, self.scale_name) * y).transpose(1, 2)
