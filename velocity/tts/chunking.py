"""Cutting a stream of GPT frames into chunks for the vocoder: the chunk schedule (sizes), a
chunk (its frames with left context and lookahead), and the chunker. No torch: the llm uses it.

A chunk of frames [start, end) is decoded from the codes (or, on the Decoder path, the GPT
hidden states) of frames [start - left, end + lookahead) and only its own samples are kept
(velocity.tts.audio_decoder).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

# GPT frames per second of the release's audio (24 kHz, 512 samples a frame: 46.875), for the llm,
# which loads no Vocos; the vocoder takes AudioDecoder.frames_per_second from the loaded one
SAMPLES_PER_FRAME = 512
FRAMES_PER_SECOND = 24000 / SAMPLES_PER_FRAME


@dataclass(slots=True)
class ChunkSchedule:
    """Chunk sizes in GPT frames (46.875 frames = 1 s): `first` for fast first audio, then
    `rest`, each later chunk `growth` times the one before (rounded) up to `largest` (default:
    `rest`, no growth). A stream whose frames generate at r times real time has each chunk's
    frames, its lookahead too, before the audio cut before it has played (its listener hears no
    gap) when rest <= r * first and growth <= r (to within the sizes' rounding).

    Every chunk is decoded with its left context and lookahead around it, so a chunk of n
    frames costs the vocoder (context + n + lookahead) frames: larger later chunks cost less
    per second of audio, while the small first ones keep the first audio early.
    """

    first: int = 12
    rest: int = 36
    largest: int = 0
    growth: float = 2.0

    def __post_init__(self) -> None:
        if self.first < 1 or self.rest < 1:
            raise ValueError(f"chunk sizes must be >= 1 frame, got first={self.first}, rest={self.rest}")
        if self.largest and self.largest < self.rest:
            raise ValueError(f"largest chunk ({self.largest}) must be 0 (= rest) or >= rest ({self.rest})")
        if not 1.0 <= self.growth <= 4.0:
            raise ValueError(f"chunk growth must be in [1, 4], got {self.growth}")

    def sizes(self) -> Iterator[int]:
        """Frames in chunk 0, 1, 2, ..."""
        yield self.first
        size, top = float(self.rest), max(self.largest, self.rest)
        while True:
            yield round(size)
            size = min(size * self.growth, top)

    def bounds(self) -> Iterator[int]:
        """End frame of chunk 0, 1, 2, ..."""
        return itertools.accumulate(self.sizes())


@dataclass
class CodeChunk:
    """Frames [start - context, end + lookahead) as far as known; the audio kept is `length` frames.
    `hidden`: the GPT hidden state of each of those frames ([H] rows), when the stream carries them
    (the Decoder path). `last`: the chunk ends its utterance (its audio is half a frame shorter)."""

    index: int
    codes: list[tuple[int, ...]]
    context: int                   # leading frames that are context only
    length: int                    # frames whose audio this chunk produces
    hidden: list[np.ndarray] | np.ndarray | None = None     # ([T, H] once packed for the wire)
    last: bool = False
    start: int = 0                 # frames of the stream's audio before this chunk (all its sentences)
    text: str = ""                 # the refined text of the sentence this chunk begins (text refine)
    sentence: int = 0              # its utterance's number in the stream
    lasts: int = 0                 # utterances before it that ended in a `last` chunk (half a frame shorter)
    sentence_text: str = ""        # on an utterance's first chunk: the text it speaks (SentenceStream)
    words: list | None = None      # the words estimated to start in it (velocity.tts.word_timing.Word)
    pause: int = 0                 # samples of silence before its audio (SSML's <break>, on a sentence's first chunk)
    tail: int = 0                  # samples of silence after its audio (a break that ends the text, on the last)
    paused: int = 0                # samples of silence in the stream before it

    def sample_offset(self, samples_per_frame: int) -> int:
        """Samples of the stream's audio before this chunk's."""
        return sample_offset(self.start, self.lasts, samples_per_frame)


def sample_offset(start: int, lasts: int, samples_per_frame: int) -> int:
    """Samples of a stream's audio before a chunk: `start` frames, less half a frame for each of
    the `lasts` utterances before it that ended in a `last` chunk."""
    return start * samples_per_frame - lasts * (samples_per_frame // 2)


class FrameChunker:
    """Cuts a stream of frames into chunks: push(frames) -> chunks ready now; finish() -> the rest.
    A chunk is ready once `lookahead` frames past its end exist.

    finish() ends an utterance (one sentence: the reference decodes each text on its own); frames
    pushed after it start the next one, whose chunks go on in index and size."""

    def __init__(self, schedule: ChunkSchedule, left: int, lookahead: int) -> None:
        self.schedule, self.left, self.lookahead = schedule, left, lookahead
        self.frames: list[tuple[int, ...]] = []
        self.hidden: list[np.ndarray] = []
        self._past = max(lookahead, 1)   # frames past a chunk's end before it is cut (even with no lookahead)
        self._sizes = schedule.sizes()
        self._next_end = next(self._sizes)
        self.emitted = 0           # frames of this utterance already handed out in chunks
        self.before = 0            # frames of the utterances before this one
        self.index = 0
        self.utterance = 0         # utterances finished
        self.lasts = 0             # of them, those that ended in a `last` chunk

    @property
    def total(self) -> int:
        """Frames of all utterances so far."""
        return self.before + len(self.frames)

    def _cut(self, end: int, last: bool = False) -> CodeChunk:
        lo, hi = max(0, self.emitted - self.left), min(len(self.frames), end + self.lookahead)
        chunk = CodeChunk(self.index, self.frames[lo:hi], self.emitted - lo, end - self.emitted,
                          self.hidden[lo:hi] if self.hidden else None, last, self.before + self.emitted,
                          sentence=self.utterance, lasts=self.lasts)
        self.index += 1
        self.emitted = end
        return chunk

    def wanted(self) -> int:
        """Frames more before push can cut the next chunk (1 at least)."""
        return max(1, self._next_end + self._past - len(self.frames))

    def push(self, frames: list[tuple[int, ...]], hidden: np.ndarray | None = None) -> list[CodeChunk]:
        """frames, and with the Decoder path their hidden states [len(frames), H]."""
        if hidden is not None:
            assert len(hidden) == len(frames) and (self.hidden or not self.frames)
            self.hidden += list(hidden)
        self.frames += frames
        # a frame past the chunk must exist (even with no lookahead): the last chunk is finish()'s
        end = len(self.frames) - self._past
        return [] if self._next_end > end else self._cut_through(end)

    def _cut_through(self, end: int) -> list[CodeChunk]:
        """Cut the schedule's chunks that end at or before frame `end`."""
        out = []
        while self._next_end <= end:
            out.append(self._cut(self._next_end))
            self._next_end += next(self._sizes)
        return out

    def finish(self) -> list[CodeChunk]:
        """The utterance's remaining chunks (cut by the schedule, the last one marked); the chunker
        is then ready for the next utterance."""
        out = self._cut_through(len(self.frames) - 1)
        if len(self.frames) > self.emitted:
            out.append(self._cut(len(self.frames), last=True))
            self.lasts += 1
        self.utterance += 1
        self.before += len(self.frames)
        self.frames, self.hidden, self.emitted = [], [], 0
        self._next_end = next(self._sizes)
        return out
