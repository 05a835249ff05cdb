"""The DVAE's and the Decoder's shapes (velocity.model.networks.dvae), without torch: what a voice
sample's codes must look like is known without loading the model."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(slots=True)
class DVAEConfig:
    levels: tuple[int, ...] = (5, 5, 5, 5)   # FSQ levels per code (625 codes)
    groups: int = 2                          # G: codebooks 0..R-1 feed group 0, R..2R-1 group 1
    residuals: int = 2                       # R residual levels per group
    vq_dim: int = 1024                       # 0: no quantizer (the Decoder: input is hidden states)
    idim: int = 512                          # decoder input after the (2 * idim, T) -> (idim, 2T) reshape
    odim: int = 512
    hidden: int = 256
    n_layer: int = 12
    bn_dim: int = 128
    kernel: int = 7
    dilation: int = 2
    n_mels: int = 100

    @property
    def num_vq(self) -> int:
        """Codebooks per frame (codes of a frame)."""
        return self.groups * self.residuals

    @property
    def num_codes(self) -> int:
        """Codes per codebook: [0, num_codes)."""
        return math.prod(self.levels)


DECODER = DVAEConfig(vq_dim=0, idim=384, odim=384, hidden=512)   # asset/Decoder.safetensors


def decoder_config(gpt_hidden: int) -> DVAEConfig:
    """The Decoder for a GPT of this hidden size: its input is the GPT's hidden states, two mel
    frames' worth of gpt_hidden / 2 channels each (the release: 768 -> idim = odim = 384; the
    reference builds its out_conv on idim, so odim follows). Demo folders with a smaller GPT
    change only these two widths."""
    if gpt_hidden % 2:
        raise ValueError(f"the GPT hidden size must be even for the Decoder, got {gpt_hidden}")
    return replace(DECODER, idim=gpt_hidden // 2, odim=gpt_hidden // 2)
ENCODER = dict(idim=512, odim=1024, hidden=256, n_layer=12, bn_dim=128)
