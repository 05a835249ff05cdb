"""Chunked streaming decode: audio for each chunk of GPT frames, seamless with a whole decode.

A chunk of frames [start, end) is decoded from the codes [start - left, end + lookahead)
and only its own samples [start * 512, end * 512) are kept. With left and lookahead at the
decoders' receptive field (`exact_context`), the concatenated chunks equal a whole-utterance
decode up to float rounding; smaller values trade exactness for latency (bounds measured in
tests/test_streaming.py and stated in docs/benchmarks.md).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from velocity.tts.dvae import DVAE
from velocity.tts.vocos import Vocos


def exact_context(dvae: DVAE, vocos: Vocos) -> int:
    """GPT frames of context each side that make chunked decoding exact.

    DVAE and Vocos convolutions read `reach` mel frames each side, the ISTFT (centered,
    n_fft / hop = 4) two more; one GPT frame is two mel frames."""
    mel = dvae.reach + vocos.reach + vocos.cfg.n_fft // vocos.cfg.hop_length // 2
    return -(-mel // 2)


@dataclass(slots=True)
class ChunkSchedule:
    """Chunk sizes in GPT frames: `first` for fast first audio, then `rest` (46.875 frames = 1 s)."""

    first: int = 12
    rest: int = 36

    def __post_init__(self) -> None:
        if self.first < 1 or self.rest < 1:
            raise ValueError(f"chunk sizes must be >= 1 frame, got first={self.first}, rest={self.rest}")

    def bounds(self) -> Iterator[int]:
        """End frame of chunk 0, 1, 2, ..."""
        end = self.first
        while True:
            yield end
            end += self.rest


class AudioDecoder:
    """codes -> waveform through DVAE and Vocos. samples_per_frame = 2 mel frames * hop."""

    def __init__(self, dvae: DVAE, vocos: Vocos) -> None:
        self.dvae, self.vocos = dvae, vocos
        self.samples_per_frame = 2 * vocos.cfg.hop_length
        self.exact_context = exact_context(dvae, vocos)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, num_vq, T] -> audio [B, T * 512]"""
        return self.vocos(self.dvae(codes))

    @torch.inference_mode()
    def decode_span(self, codes: torch.Tensor, start: int, end: int, left: int | None = None,
                    lookahead: int | None = None) -> torch.Tensor:
        """Audio of frames [start, end) from the codes around them. codes: [B, num_vq, T] (all known
        so far; frames past `end + lookahead` are not read) -> [B, (end - start) * 512]"""
        left = self.exact_context if left is None else left
        lookahead = self.exact_context if lookahead is None else lookahead
        lo, hi = max(0, start - left), min(codes.shape[-1], end + lookahead)
        audio = self.decode(codes[..., lo:hi])
        n = self.samples_per_frame
        return audio[..., (start - lo) * n:(end - lo) * n]


class StreamingDecoder:
    """Feed frames as they are generated; get each chunk's audio as soon as its lookahead exists."""

    def __init__(self, decoder: AudioDecoder, schedule: ChunkSchedule = ChunkSchedule(),
                 left: int | None = None, lookahead: int | None = None) -> None:
        self.decoder, self.schedule = decoder, schedule
        self.left = decoder.exact_context if left is None else left
        self.lookahead = decoder.exact_context if lookahead is None else lookahead
        self.frames: list[tuple[int, ...]] = []
        self._bounds = schedule.bounds()
        self._next_end = next(self._bounds)
        self.emitted = 0           # frames whose audio has been returned
        self.chunk_index = 0

    def push(self, frames: list[tuple[int, ...]], final: bool = False) -> list[tuple[int, torch.Tensor]]:
        """Add frames; returns [(chunk index, audio [n * 512])] for every chunk now complete."""
        self.frames += frames
        out = []
        while True:
            end = min(self._next_end, len(self.frames)) if final else self._next_end
            ready = final or len(self.frames) >= end + self.lookahead
            if not ready or end <= self.emitted:
                break
            codes = torch.tensor(self.frames, dtype=torch.long).T[None]        # [1, num_vq, T]
            audio = self.decoder.decode_span(codes, self.emitted, end, self.left, self.lookahead)[0]
            out.append((self.chunk_index, audio))
            self.chunk_index += 1
            self.emitted = end
            if end == self._next_end:
                self._next_end = next(self._bounds)
        return out
