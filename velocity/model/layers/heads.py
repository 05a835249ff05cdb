"""Output heads: how a model turns hidden states into logits for one kind of token."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class Head:
    """hidden [B, H] -> logits [B, K, V]; K = 1 for text, num_vq for audio frames."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    num_codebooks: int
    stop_ids: set[int] = field(default_factory=set)
    sampling_style: str = "transformers"   # or "chattts": the reference's order (velocity.engine.sampler)
    repetition_window: int | None = None   # used when a request gives none (ChatTTS audio: 16 frames)
