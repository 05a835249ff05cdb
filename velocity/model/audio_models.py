"""Load the release's DVAE, Decoder and Vocos from asset/*.safetensors."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from velocity.model.loader import build_empty, fill, iter_safetensors
from velocity.model.dvae import DVAE, decoder_config
from velocity.model.vocos import Vocos

DVAE_KEEP = ("coef", "decoder.", "out_conv.", "vq_layer.quantizer.rvqs.")     # the decoding side
ENCODER_KEEP = DVAE_KEEP + ("downsample_conv.", "encoder.", "preprocessor_mel.")   # and the encoding side
DECODER_KEEP = ("coef", "decoder.", "out_conv.")
VOCOS_KEEP = ("backbone.", "head.out.")


def _load(folder: str | Path, file: str, factory, keep: tuple[str, ...], device: torch.device,
          dtype: torch.dtype) -> nn.Module:
    """Build on the meta device, fill from asset/<file> with the tensors named by `keep` (the
    encoder side, mel extractor and windows are not used), move to the device."""
    model = build_empty(factory, device, dtype)
    fill(model, iter_safetensors([Path(folder) / "asset" / file]),
         rename=lambda name: name if name.startswith(keep) else None)
    return model.to(device).eval()        # the constant buffers were made on the CPU


def load_dvae(folder: str | Path, device: torch.device = torch.device("cpu"),
              dtype: torch.dtype = torch.float32, encoder: bool = False) -> DVAE:
    """asset/DVAE.safetensors: audio codes -> mel (the reference's use_decoder=False path); with
    encoder=True also audio -> codes (DVAE.encode, for voice samples)."""
    if encoder:
        return _load(folder, "DVAE.safetensors", lambda: DVAE(encoder=True), ENCODER_KEEP, device, dtype)
    return _load(folder, "DVAE.safetensors", DVAE, DVAE_KEEP, device, dtype)


def load_decoder(folder: str | Path, device: torch.device = torch.device("cpu"),
                 dtype: torch.dtype = torch.float32) -> DVAE:
    """asset/Decoder.safetensors: GPT hidden states -> mel (the reference's default decode path).
    Its input width (the GPT's hidden size) is read from the file's first convolution."""
    with safe_open(str(Path(folder) / "asset" / "Decoder.safetensors"), "pt") as f:
        gpt_hidden = 2 * f.get_slice("decoder.conv_in.0.weight").get_shape()[1]
    return _load(folder, "Decoder.safetensors", lambda: DVAE(decoder_config(gpt_hidden)), DECODER_KEEP, device, dtype)


def load_vocos(folder: str | Path, device: torch.device = torch.device("cpu"),
               dtype: torch.dtype = torch.float32) -> Vocos:
    return _load(folder, "Vocos.safetensors", Vocos, VOCOS_KEEP, device, dtype)
