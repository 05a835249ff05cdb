"""DVAE decoder of the ChatTTS release: audio codes -> 100-bin mel (one GPT frame = 2 mel frames)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from velocity.tts.convnext import ConvNeXtBlock


@dataclass(slots=True)
class DVAEConfig:
    levels: tuple[int, ...] = (5, 5, 5, 5)   # FSQ levels per code (625 codes)
    groups: int = 2                          # G: codebooks 0..R-1 feed group 0, R..2R-1 group 1
    residuals: int = 2                       # R residual levels per group
    vq_dim: int = 1024
    idim: int = 512                          # decoder input after the (1024, T) -> (512, 2T) reshape
    odim: int = 512
    hidden: int = 256
    n_layer: int = 12
    bn_dim: int = 128
    kernel: int = 7
    dilation: int = 2
    n_mels: int = 100


class ResidualFSQ(nn.Module):
    """Only what decoding needs: FSQ codes scaled per residual level, summed, projected out."""

    def __init__(self, dim: int, levels: tuple[int, ...], residuals: int) -> None:
        super().__init__()
        self.project_in = nn.Linear(dim, len(levels))   # encoder side; kept for the release's names
        self.project_out = nn.Linear(len(levels), dim)
        self.level_list, self.residuals = levels, residuals
        for name in ("levels", "basis", "scales"):
            self.register_buffer(name, torch.empty(0), persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        dev = self.project_out.weight.device
        dev = torch.device("cpu") if dev.type == "meta" else dev
        lv = torch.tensor(self.level_list, device=dev)
        self.levels = lv
        self.basis = torch.cumprod(torch.cat([torch.ones(1, dtype=lv.dtype, device=dev), lv[:-1]]), 0)
        self.scales = torch.stack([(lv.float() - 1) ** -r for r in range(self.residuals)])

    def decode(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: [B, T, R] code indices -> [B, T, dim]"""
        digits = (idx[..., None] // self.basis) % self.levels            # [B, T, R, L]
        half = self.levels // 2
        codes = (digits - half).float() / half                           # in [-1, 1]
        return self.project_out((codes * self.scales).sum(dim=2).to(self.project_out.weight.dtype))


class DVAE(nn.Module):
    """codes [B, G*R, T] -> mel [B, n_mels, 2T]. Tensor names follow asset/DVAE.safetensors."""

    def __init__(self, cfg: DVAEConfig = DVAEConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.coef = nn.Parameter(torch.ones(1, cfg.n_mels, 1))
        self.vq_layer = nn.Module()
        self.vq_layer.quantizer = nn.Module()
        self.vq_layer.quantizer.rvqs = nn.ModuleList(
            ResidualFSQ(cfg.vq_dim // cfg.groups, cfg.levels, cfg.residuals) for _ in range(cfg.groups))
        self.decoder = nn.Module()
        self.decoder.conv_in = nn.Sequential(nn.Conv1d(cfg.idim, cfg.bn_dim, 3, 1, 1), nn.GELU(),
                                             nn.Conv1d(cfg.bn_dim, cfg.hidden, 3, 1, 1))
        self.decoder.decoder_block = nn.ModuleList(
            ConvNeXtBlock(cfg.hidden, cfg.hidden * 4, cfg.kernel, cfg.dilation) for _ in range(cfg.n_layer))
        self.decoder.conv_out = nn.Conv1d(cfg.hidden, cfg.odim, 1, bias=False)
        self.out_conv = nn.Conv1d(cfg.odim, cfg.n_mels, 3, 1, 1, bias=False)

    @property
    def reach(self) -> int:
        """Mel frames of context the decoder reads on each side of a frame."""
        return 2 + sum(b.reach for b in self.decoder.decoder_block) + 1

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, G*R, T] -> features [B, vq_dim, T]"""
        G, R = self.cfg.groups, self.cfg.residuals
        B, _, T = codes.shape
        per_group = codes.transpose(1, 2).reshape(B, T, G, R)
        feats = [rvq.decode(per_group[:, :, g]) for g, rvq in enumerate(self.vq_layer.quantizer.rvqs)]
        return torch.cat(feats, dim=-1).transpose(1, 2)

    @torch.inference_mode()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        x = self.embed(codes)                                            # [B, 1024, T]
        B, C, T = x.shape
        x = x.view(B, 2, C // 2, T).permute(0, 2, 3, 1).reshape(B, C // 2, 2 * T)   # [B, 512, 2T]
        y = self.decoder.conv_in(x)
        for block in self.decoder.decoder_block:
            y = block(y)
        return self.out_conv(self.decoder.conv_out(y)) * self.coef       # [B, 100, 2T]
