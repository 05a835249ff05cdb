"""Load the release's DVAE, Decoder and Vocos from asset/*.safetensors."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from velocity.model.loading.loader import WeightError, build_empty, fill, iter_safetensors, tensor_shapes
from velocity.model.networks.dvae import DVAE
from velocity.model.networks.dvae_config import DVAEConfig, decoder_config
from velocity.model.networks.vocos import Vocos, VocosConfig

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


def _layers(shapes: dict[str, tuple[int, ...]], prefix: str) -> int:
    """How many numbered blocks `prefix<N>.` a file's tensors name."""
    return len({k[len(prefix):].split(".", 1)[0] for k in shapes if k.startswith(prefix)})


def _sized(cfg, shapes: dict[str, tuple[int, ...]], **dims: tuple[str, int]):
    """cfg with each of dims (field=(tensor, axis)) as that tensor's size in the file; a field whose
    tensor the file lacks keeps cfg's value (fill() then names the missing tensor)."""
    return replace(cfg, **{field: shapes[name][axis] for field, (name, axis) in dims.items() if name in shapes})


def dvae_config(shapes: dict[str, tuple[int, ...]], base: DVAEConfig) -> DVAEConfig:
    """base with the decoder stack's bottleneck, width, output width and depth as a file's tensors
    have them (decoder.conv_in.0: [bn_dim, idim, 3], decoder.conv_in.2: [hidden, bn_dim, 3],
    decoder.conv_out: [odim, hidden, 1]). The release's files have base's own; the tests' small
    demo folders narrower, shallower ones."""
    cfg = _sized(base, shapes, bn_dim=("decoder.conv_in.0.weight", 0), hidden=("decoder.conv_in.2.weight", 0),
                 odim=("decoder.conv_out.weight", 0))
    return replace(cfg, n_layer=_layers(shapes, "decoder.decoder_block.") or cfg.n_layer)


def vocos_config(shapes: dict[str, tuple[int, ...]]) -> VocosConfig:
    """The release's Vocos with the width, MLP width and depth a file's tensors have
    (backbone.embed: [dim, n_mels, 7], backbone.convnext.N.pwconv1: [intermediate_dim, dim])."""
    cfg = _sized(VocosConfig(), shapes, dim=("backbone.embed.weight", 0),
                 intermediate_dim=("backbone.convnext.0.pwconv1.weight", 0))
    return replace(cfg, num_layers=_layers(shapes, "backbone.convnext.") or cfg.num_layers)


def load_dvae(folder: str | Path, device: torch.device = torch.device("cpu"),
              dtype: torch.dtype = torch.float32, encoder: bool = False) -> DVAE:
    """asset/DVAE.safetensors: audio codes -> mel (the reference's use_decoder=False path); with
    encoder=True also audio -> codes (DVAE.encode, for voice samples)."""
    cfg = dvae_config(tensor_shapes(Path(folder) / "asset" / "DVAE.safetensors"), DVAEConfig())
    if encoder:
        return _load(folder, "DVAE.safetensors", lambda: DVAE(cfg, encoder=True), ENCODER_KEEP, device, dtype)
    return _load(folder, "DVAE.safetensors", lambda: DVAE(cfg), DVAE_KEEP, device, dtype)


def load_decoder(folder: str | Path, device: torch.device = torch.device("cpu"),
                 dtype: torch.dtype = torch.float32) -> DVAE:
    """asset/Decoder.safetensors: GPT hidden states -> mel (the reference's default decode path).
    Its input width (the GPT's hidden size) is read from the file's first convolution."""
    shapes = tensor_shapes(Path(folder) / "asset" / "Decoder.safetensors")
    if "decoder.conv_in.0.weight" not in shapes:
        raise WeightError(f"{Path(folder) / 'asset' / 'Decoder.safetensors'}: decoder.conv_in.0.weight missing")
    cfg = dvae_config(shapes, decoder_config(2 * shapes["decoder.conv_in.0.weight"][1]))
    return _load(folder, "Decoder.safetensors", lambda: DVAE(cfg), DECODER_KEEP, device, dtype)


def load_vocos(folder: str | Path, device: torch.device = torch.device("cpu"),
               dtype: torch.dtype = torch.float32) -> Vocos:
    cfg = vocos_config(tensor_shapes(Path(folder) / "asset" / "Vocos.safetensors"))
    return _load(folder, "Vocos.safetensors", lambda: Vocos(cfg), VOCOS_KEEP, device, dtype)
