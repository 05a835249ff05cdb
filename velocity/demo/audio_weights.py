"""Seeded random weights for the DVAE, Decoder and Vocos, with the release's tensor names and
shapes (demo folders: noise, not speech)."""
from __future__ import annotations

import math
import re
from dataclasses import replace

import torch
from torch import nn

from velocity.model.networks.dvae import DVAE
from velocity.model.networks.dvae_config import DVAEConfig, decoder_config
from velocity.model.networks.vocos import Vocos, VocosConfig

LAYER_SCALE = re.compile(r"decoder_block\.\d+\.weight$")     # the DVAE's ConvNeXt layer scales


def _randomise(model: nn.Module, g: torch.Generator, std: float = 0.02) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.state_dict().items():
        if name.startswith("preprocessor_mel."):
            continue                        # the mel front end's window and filters: mel_buffers
        if name.endswith("gamma") or LAYER_SCALE.search(name):
            t = torch.full(p.shape, 0.1)
        elif name.endswith(("norm.weight", "coef")):
            t = 1 + torch.rand(p.shape, generator=g) * 0.1
        elif name.endswith("bias"):
            t = torch.zeros(p.shape)
        else:
            fan_in = p[0].numel() if p.dim() > 1 else 1
            t = torch.randn(p.shape, generator=g) * max(std, 1 / math.sqrt(fan_in))
        out[name] = t.contiguous()
    return out


def mel_filterbank(n_fft: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """[n_fft/2 + 1, n_mels] triangular HTK mel filters (only stored, for the release's layout)."""
    def mel(f):
        return 2595 * torch.log10(1 + f / 700)
    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    pts = 700 * (10 ** (torch.linspace(0, float(mel(torch.tensor(sample_rate / 2.0))), n_mels + 2) / 2595) - 1)
    lo, mid, hi = pts[:-2], pts[1:-1], pts[2:]
    up = (freqs[:, None] - lo) / (mid - lo)
    down = (hi - freqs[:, None]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0)


def mel_buffers(prefix: str, n_fft: int = 1024, n_mels: int = 100, sample_rate: int = 24000) -> dict:
    """The mel front end's stored window and filter bank (torchaudio's names)."""
    return {f"{prefix}.mel_spec.spectrogram.window": torch.hann_window(n_fft),
            f"{prefix}.mel_spec.mel_scale.fb": mel_filterbank(n_fft, n_mels, sample_rate)}


# The audio models of the tests' small demo folders (write_checkpoint(..., small_audio=True)):
# the release's files, names and inputs, with narrow, shallow stacks (the loaders read their
# sizes from the files): a frame then costs the vocoder almost nothing.
SMALL_STACK = dict(hidden=32, n_layer=2, bn_dim=16, odim=32)
SMALL_VOCOS = VocosConfig(dim=32, intermediate_dim=64, num_layers=2)


def random_dvae_tensors(g: torch.Generator, small: bool = False) -> dict[str, torch.Tensor]:
    """asset/DVAE.safetensors, the whole file: decoder and encoder sides."""
    cfg = replace(DVAEConfig(), **SMALL_STACK) if small else DVAEConfig()
    return _randomise(DVAE(cfg, encoder=True), g) | mel_buffers("preprocessor_mel")


def random_decoder_tensors(g: torch.Generator, gpt_hidden: int = 768, small: bool = False) -> dict[str, torch.Tensor]:
    """asset/Decoder.safetensors for a GPT of this hidden size (the release's: 768)."""
    cfg = decoder_config(gpt_hidden)
    return _randomise(DVAE(replace(cfg, **SMALL_STACK) if small else cfg), g)


def random_vocos_tensors(g: torch.Generator, small: bool = False) -> dict[str, torch.Tensor]:
    cfg = SMALL_VOCOS if small else VocosConfig()
    t = _randomise(Vocos(cfg), g)
    t["head.out.weight"] *= 0.1          # keep the random magnitudes moderate
    t |= mel_buffers("feature_extractor", cfg.n_fft, cfg.n_mels, cfg.sample_rate)
    t["head.istft.window"] = torch.hann_window(cfg.n_fft)
    return t
