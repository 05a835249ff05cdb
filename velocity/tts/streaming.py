"""Chunked streaming decode: audio for each chunk of GPT frames, seamless with a whole decode.

A chunk of frames [start, end) is decoded from the codes [start - left, end + lookahead)
and only its own samples [start * 512, end * 512) are kept. With left and lookahead at the
decoders' receptive field (`exact_context`), the concatenated chunks equal a whole-utterance
decode up to float rounding; smaller values trade exactness for latency (bounds measured in
tests/test_streaming.py and stated in docs/benchmarks.md).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from velocity.tts.dvae import DVAE
from velocity.tts.vocos import Vocos

FRAMES_PER_SECOND = 24000 / 512    # GPT frames per second of audio (46.875)


def exact_context(dvae: DVAE, vocos: Vocos) -> int:
    """GPT frames of context each side that make chunked decoding exact.

    DVAE and Vocos convolutions read `reach` mel frames each side, the ISTFT (centered,
    n_fft / hop = 4) two more; one GPT frame is two mel frames."""
    mel = dvae.reach + vocos.reach + vocos.cfg.n_fft // vocos.cfg.hop_length // 2
    return -(-mel // 2)


@dataclass(slots=True)
class ChunkSchedule:
    """Chunk sizes in GPT frames (46.875 frames = 1 s): `first` for fast first audio, then
    `rest`, each later chunk twice the one before up to `largest` (default: `rest`, no growth).

    Every chunk is decoded with its left context and lookahead around it, so a chunk of n
    frames costs the vocoder (context + n + lookahead) frames: larger later chunks cost less
    per second of audio, while the small first ones keep the first audio early.
    """

    first: int = 12
    rest: int = 36
    largest: int = 0

    def __post_init__(self) -> None:
        if self.first < 1 or self.rest < 1:
            raise ValueError(f"chunk sizes must be >= 1 frame, got first={self.first}, rest={self.rest}")
        if self.largest and self.largest < self.rest:
            raise ValueError(f"largest chunk ({self.largest}) must be 0 (= rest) or >= rest ({self.rest})")

    def start(self, index: int) -> int:
        """First frame of chunk `index` (the frames before it)."""
        return 0 if index <= 0 else next(itertools.islice(self.bounds(), index - 1, None))

    def bounds(self) -> Iterator[int]:
        """End frame of chunk 0, 1, 2, ..."""
        end, size = self.first, self.rest
        while True:
            yield end
            end += size
            size = min(2 * size, max(self.largest, self.rest))


def default_decode_batch(device: torch.device) -> int:
    """Chunks decoded in one call: on a GPU a call costs about what one chunk does (kernel
    launches), on CPU a batch costs what its chunks do one by one and only delays the first."""
    return 32 if device.type == "cuda" else 1


@dataclass
class CodeChunk:
    """Frames [start - context, end + lookahead) as far as known; the audio kept is `length` frames."""

    index: int
    codes: list[tuple[int, ...]]
    context: int                   # leading frames that are context only
    length: int                    # frames whose audio this chunk produces


class FrameChunker:
    """Cuts a stream of frames into chunks: push(frames) -> chunks ready now; finish() -> the rest.
    A chunk is ready once `lookahead` frames past its end exist."""

    def __init__(self, schedule: ChunkSchedule, left: int, lookahead: int) -> None:
        self.schedule, self.left, self.lookahead = schedule, left, lookahead
        self.frames: list[tuple[int, ...]] = []
        self._bounds = schedule.bounds()
        self._next_end = next(self._bounds)
        self.emitted = 0           # frames already handed out in chunks
        self.index = 0

    def _cut(self, end: int) -> CodeChunk:
        lo, hi = max(0, self.emitted - self.left), min(len(self.frames), end + self.lookahead)
        chunk = CodeChunk(self.index, self.frames[lo:hi], self.emitted - lo, end - self.emitted)
        self.index += 1
        self.emitted = end
        return chunk

    def push(self, frames: list[tuple[int, ...]]) -> list[CodeChunk]:
        self.frames += frames
        out = []
        while len(self.frames) >= self._next_end + self.lookahead:
            out.append(self._cut(self._next_end))
            self._next_end = next(self._bounds)
        return out

    def finish(self) -> list[CodeChunk]:
        return [self._cut(len(self.frames))] if len(self.frames) > self.emitted else []


class AudioDecoder:
    """codes -> waveform through DVAE and Vocos. samples_per_frame = 2 mel frames * hop."""

    def __init__(self, dvae: DVAE, vocos: Vocos) -> None:
        self.dvae, self.vocos = dvae, vocos
        self.samples_per_frame = 2 * vocos.cfg.hop_length
        self.exact_context = exact_context(dvae, vocos)
        self.num_vq = dvae.cfg.groups * dvae.cfg.residuals        # codebooks per frame
        self.num_codes = math.prod(dvae.cfg.levels)              # codes per codebook: [0, num_codes)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, num_vq, T] -> audio [B, T * 512] (on the decoder's device)"""
        return self.vocos(self.dvae(codes.to(next(self.vocos.parameters()).device)))

    def decode_chunks(self, chunks: list[tuple[torch.Tensor, int, int]], max_batch: int = 1) -> list[torch.Tensor]:
        """[(codes [b, num_vq, T], context, length)] -> each chunk's audio [b, length * 512], in order.
        Chunks of the same T are decoded together, up to max_batch chunks per call."""
        out: list[torch.Tensor | None] = [None] * len(chunks)
        groups: dict[int, list[int]] = {}
        for i, (codes, _, _) in enumerate(chunks):
            groups.setdefault(codes.shape[-1], []).append(i)
        n, step = self.samples_per_frame, max(1, max_batch)
        for rows in groups.values():
            for s in range(0, len(rows), step):
                part = rows[s:s + step]
                audio = self.decode(torch.cat([chunks[i][0] for i in part]))          # [sum b, T * 512]
                row = 0
                for i in part:
                    codes, ctx, length = chunks[i]
                    out[i] = audio[row:row + codes.shape[0], ctx * n:(ctx + length) * n]
                    row += codes.shape[0]
        return out

    def decode_cut(self, chunks: list[CodeChunk], max_batch: int = 1) -> list[torch.Tensor]:
        """decode_chunks for the chunks a FrameChunker cut: each one's audio [1, length * 512]."""
        return self.decode_chunks([(torch.tensor(c.codes, dtype=torch.long).T[None], c.context, c.length)
                                   for c in chunks], max_batch)


class StreamingDecoder:
    """Feed frames as they are generated; get each chunk's audio as soon as its lookahead exists."""

    def __init__(self, decoder: AudioDecoder, schedule: ChunkSchedule = ChunkSchedule(),
                 left: int | None = None, lookahead: int | None = None) -> None:
        self.decoder = decoder
        self.chunker = FrameChunker(schedule, decoder.exact_context if left is None else left,
                                    decoder.exact_context if lookahead is None else lookahead)

    def cut(self, frames: list[tuple[int, ...]], final: bool = False) -> list[CodeChunk]:
        """Add frames; returns the chunks now complete, still codes (to decode with others)."""
        return self.chunker.push(frames) + (self.chunker.finish() if final else [])

    def push(self, frames: list[tuple[int, ...]], final: bool = False) -> list[tuple[int, torch.Tensor]]:
        """Add frames; returns [(chunk index, audio [n * 512])] for every chunk now complete."""
        chunks = self.cut(frames, final)
        return [(c.index, a[0]) for c, a in zip(chunks, self.decoder.decode_cut(chunks))]
