"""Vocos vocoder of the ChatTTS release: 100-bin mel -> 24 kHz waveform, in plain torch."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from velocity.model.networks.convnext import ConvNeXtBlock


@dataclass(slots=True)
class VocosConfig:
    n_mels: int = 100
    dim: int = 512
    intermediate_dim: int = 1536
    num_layers: int = 8
    n_fft: int = 1024
    hop_length: int = 256
    sample_rate: int = 24000


class Vocos(nn.Module):
    """mel [B, n_mels, F] -> audio [B, F * hop]. Tensor names follow asset/Vocos.safetensors
    (backbone.*, head.out.*); the mel feature extractor and window buffers are not needed."""

    def __init__(self, cfg: VocosConfig = VocosConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = nn.Module()
        self.backbone.embed = nn.Conv1d(cfg.n_mels, cfg.dim, 7, padding=3)
        self.backbone.norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.backbone.convnext = nn.ModuleList(
            ConvNeXtBlock(cfg.dim, cfg.intermediate_dim, 7, 1) for _ in range(cfg.num_layers))
        self.backbone.final_layer_norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.head = nn.Module()
        self.head.out = nn.Linear(cfg.dim, cfg.n_fft + 2)
        self.register_buffer("window", torch.empty(0), persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        dev = self.head.out.weight.device
        self.window = torch.hann_window(self.cfg.n_fft, device=torch.device("cpu") if dev.type == "meta" else dev)

    @property
    def reach(self) -> int:
        """Mel frames of context the backbone reads on each side (the ISTFT adds its overlap)."""
        return 3 + sum(b.reach for b in self.backbone.convnext)

    @torch.inference_mode()
    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        b = self.backbone
        x = b.embed(mel)                                                   # [B, dim, F]
        x = b.norm(x.transpose(1, 2)).transpose(1, 2)
        for block in b.convnext:
            x = block(x)
        x = self.head.out(b.final_layer_norm(x.transpose(1, 2))).transpose(1, 2)   # [B, n_fft + 2, F]
        mag, phase = x.float().chunk(2, dim=1)
        spec = torch.polar(torch.exp(mag).clamp(max=1e2), phase)           # [B, n_fft/2 + 1, F]
        F_ = mel.shape[-1]
        return torch.istft(spec, self.cfg.n_fft, self.cfg.hop_length, window=self.window, center=True,
                           length=F_ * self.cfg.hop_length)
