"""The ConvNeXt block shared by the DVAE decoder and Vocos (same tensor names as the release)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvNeXtBlock(nn.Module):
    """Depthwise conv, LayerNorm, MLP, layer scale, residual. x: [B, C, T] -> [B, C, T]"""

    def __init__(self, dim: int, intermediate_dim: int, kernel: int = 7, dilation: int = 1) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel, padding=dilation * (kernel // 2), dilation=dilation, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    @property
    def reach(self) -> int:
        """Frames of context this block reads on each side."""
        return self.dwconv.dilation[0] * (self.dwconv.kernel_size[0] // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).transpose(1, 2)                       # [B, T, C]
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).transpose(1, 2)
