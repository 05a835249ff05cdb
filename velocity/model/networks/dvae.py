"""The ChatTTS release's DVAE (audio codes -> 100-bin mel) and its Decoder (GPT hidden states ->
mel), one module class with two configurations. One GPT frame = 2 mel frames in both.

Tensor names follow asset/DVAE.safetensors and asset/Decoder.safetensors: a ConvNeXt block's
layer scale is `decoder.decoder_block.N.weight`. The DVAE file also holds the encoder side
(mel front end, downsample convs, encoder, the quantizer's project_in): `encoder=True` builds
it, and `DVAE.encode` turns 24 kHz audio into the codes of a voice sample (the reference's
`sample_audio_speaker` before compression).
"""
from __future__ import annotations

import torch
from torch import nn

from velocity.model.networks.convnext import ConvNeXtBlock
from velocity.model.networks.dvae_config import ENCODER, DVAEConfig


class ConvStack(nn.Module):
    """conv_in (bottleneck), ConvNeXt blocks, conv_out. x: [B, idim, F] -> [B, odim, F]"""

    def __init__(self, idim: int, odim: int, hidden: int, n_layer: int, bn_dim: int, kernel: int = 7,
                 dilation: int = 2) -> None:
        super().__init__()
        self.conv_in = nn.Sequential(nn.Conv1d(idim, bn_dim, 3, 1, 1), nn.GELU(), nn.Conv1d(bn_dim, hidden, 3, 1, 1))
        self.decoder_block = nn.ModuleList(
            ConvNeXtBlock(hidden, hidden * 4, kernel, dilation, scale_name="weight") for _ in range(n_layer))
        self.conv_out = nn.Conv1d(hidden, odim, 1, bias=False)

    @property
    def reach(self) -> int:
        """Frames of context read on each side."""
        return 2 + sum(b.reach for b in self.decoder_block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv_in(x)
        for block in self.decoder_block:
            y = block(y)
        return self.conv_out(y)


class MelFrontEnd(nn.Module):
    """audio [..., N] -> log-mel [..., n_mels, N // hop + 1]: the magnitude STFT (centred, reflect
    padding) through the stored filter bank, log of at least 1e-5, as the reference's
    torchaudio MelSpectrogram(power=1). The window and the filter bank are the file's
    (`preprocessor_mel.mel_spec.{spectrogram.window, mel_scale.fb}`)."""

    def __init__(self, n_fft: int = 1024, hop: int = 256, n_mels: int = 100) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.mel_spec = nn.Module()
        self.mel_spec.spectrogram = nn.Module()
        self.mel_spec.mel_scale = nn.Module()
        # parameters, not buffers, so that the loader fills and checks them like every weight
        self.mel_spec.spectrogram.window = nn.Parameter(torch.empty(n_fft), requires_grad=False)
        self.mel_spec.mel_scale.fb = nn.Parameter(torch.empty(n_fft // 2 + 1, n_mels), requires_grad=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        shape = audio.shape
        spec = torch.stft(audio.reshape(-1, shape[-1]), self.n_fft, self.hop, self.n_fft,
                          self.mel_spec.spectrogram.window, center=True, pad_mode="reflect", normalized=False,
                          onesided=True, return_complex=True).abs()          # [B, n_fft/2 + 1, F]
        spec = spec.reshape(shape[:-1] + spec.shape[-2:])
        mel = torch.matmul(spec.transpose(-1, -2), self.mel_spec.mel_scale.fb).transpose(-1, -2)
        return torch.log(torch.clip(mel, min=1e-5))


class ResidualFSQ(nn.Module):
    """Residual finite scalar quantization of one group: FSQ codes scaled per residual level,
    summed, projected out (decode); project in, then quantize level by level (encode).

    Residual level r is scaled by (L - 1) ** -r (0.25 for L = 5), as vector-quantize-pytorch did
    from residual FSQ's first version to 1.25.x; 1.26.0 changed it to L ** -r (0.2). The
    release's weights were trained before that change (docs/conformance.md, "The DVAE's
    residual scale", has the history), so 0.25, and the conformance venv pins 1.14.24."""

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

    def bound(self, z: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
        """FSQ's squashing of z [..., L] into each level's range (odd levels: no offset)."""
        half_l = (self.levels - 1) * (1 + eps) / 2
        offset = torch.where(self.levels % 2 == 0, 0.5, 0.0)
        return (z + (offset / half_l).atanh()).tanh() * half_l - offset

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, dim] -> code indices [B, T, R]: the residual bounded once, then each level
        quantizes (residual / scale), and what it took, times its scale, leaves the residual."""
        residual = self.bound(self.project_in(x))
        half = self.levels // 2
        out = []
        for r in range(self.residuals):
            codes = self.bound(residual / self.scales[r]).round() / half          # in [-1, 1]
            out.append(((codes * half + half) * self.basis).sum(dim=-1).to(torch.int32))
            residual = residual - codes * self.scales[r]
        return torch.stack(out, dim=-1)

    def decode(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: [B, T, R] code indices -> [B, T, dim]"""
        digits = (idx[..., None] // self.basis) % self.levels            # [B, T, R, L]
        half = self.levels // 2
        codes = (digits - half).float() / half                           # in [-1, 1]
        return self.project_out((codes * self.scales).sum(dim=2).to(self.project_out.weight.dtype))


class DVAE(nn.Module):
    """codes [B, G*R, T] (or, without a quantizer, hidden states [B, 2*idim, T]) -> mel [B, n_mels, 2T]."""

    def __init__(self, cfg: DVAEConfig = DVAEConfig(), encoder: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.coef = nn.Parameter(torch.ones(1, cfg.n_mels, 1))
        if encoder:                            # the release's encoder side (not used for decoding)
            self.downsample_conv = nn.Sequential(nn.Conv1d(cfg.n_mels, cfg.idim, 3, 1, 1), nn.GELU(),
                                                 nn.Conv1d(cfg.idim, cfg.idim, 4, 2, 1), nn.GELU())
            self.encoder = ConvStack(**ENCODER, kernel=cfg.kernel, dilation=cfg.dilation)
            self.preprocessor_mel = MelFrontEnd(n_mels=cfg.n_mels)
        if cfg.vq_dim:
            self.vq_layer = nn.Module()
            self.vq_layer.quantizer = nn.Module()
            self.vq_layer.quantizer.rvqs = nn.ModuleList(
                ResidualFSQ(cfg.vq_dim // cfg.groups, cfg.levels, cfg.residuals) for _ in range(cfg.groups))
        self.decoder = ConvStack(cfg.idim, cfg.odim, cfg.hidden, cfg.n_layer, cfg.bn_dim, cfg.kernel, cfg.dilation)
        self.out_conv = nn.Conv1d(cfg.odim, cfg.n_mels, 3, 1, 1, bias=False)

    @property
    def reach(self) -> int:
        """Mel frames of context the decoder reads on each side of a frame."""
        return self.decoder.reach + 1

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, G*R, T] -> features [B, vq_dim, T]"""
        G, R = self.cfg.groups, self.cfg.residuals
        B, _, T = codes.shape
        per_group = codes.transpose(1, 2).reshape(B, T, G, R)
        feats = [rvq.decode(per_group[:, :, g]) for g, rvq in enumerate(self.vq_layer.quantizer.rvqs)]
        return torch.cat(feats, dim=-1).transpose(1, 2)

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """24 kHz audio [N] -> codes [G*R, T] (T = mel frames // 2): log-mel over coef, the
        downsampling convs (2 mel frames -> 1), the encoder, the quantizer of each group."""
        mel = self.preprocessor_mel(audio) / self.coef[0]                 # [n_mels, F]
        x = self.encoder(self.downsample_conv(mel)[None])                  # [1, vq_dim, T]
        G = self.cfg.groups
        x = x.transpose(1, 2)                                              # [1, T, vq_dim]
        idx = [rvq.encode(part) for rvq, part in zip(self.vq_layer.quantizer.rvqs, x.chunk(G, dim=-1))]
        return torch.stack(idx, dim=2).flatten(2)[0].T                     # [T, G, R] -> [G*R, T]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """codes [B, G*R, T] (or hidden states [B, 2*idim, T]) -> the decoder's input [B, idim, 2T]:
        position-wise, two mel frames a GPT frame."""
        if self.cfg.vq_dim:
            x = self.embed(x)                                            # codes -> [B, 1024, T]
        B, C, T = x.shape
        return x.view(B, 2, C // 2, T).permute(0, 2, 3, 1).reshape(B, C // 2, 2 * T)   # [B, idim, 2T]

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_conv(self.decoder(self.features(x))) * self.coef     # [B, 100, 2T]
