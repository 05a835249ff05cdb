"""Chunked streaming decode: audio for each chunk of GPT frames, seamless with a whole decode.

A chunk of frames [start, end) is decoded from the codes (or, on the Decoder path, the GPT
hidden states) of frames [start - left, end + lookahead) and only its own samples
[start * 512, end * 512) are kept (the utterance's last chunk 256 fewer, as a whole decode).
With left and lookahead at the decoders' receptive field (`exact_context`), the concatenated
chunks equal a whole-utterance decode up to float rounding; smaller values trade exactness for latency (bounds measured in
tests/test_streaming.py and stated in docs/benchmarks.md).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from velocity.model.dvae import DVAE
from velocity.model.vocos import Vocos

# GPT frames per second of the release's audio (24 kHz, 512 samples a frame: 46.875), for the llm,
# which loads no Vocos; the vocoder takes AudioDecoder.frames_per_second from the loaded one
FRAMES_PER_SECOND = 24000 / 512
DECODERS = ("hidden", "codes")     # the reference's use_decoder=True (its default) and use_decoder=False


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

    def sizes(self) -> Iterator[int]:
        """Frames in chunk 0, 1, 2, ..."""
        yield self.first
        size = self.rest
        while True:
            yield size
            size = min(2 * size, max(self.largest, self.rest))

    def bounds(self) -> Iterator[int]:
        """End frame of chunk 0, 1, 2, ..."""
        return itertools.accumulate(self.sizes())


def default_decode_batch(device: torch.device) -> int:
    """Chunks decoded in one call: on a GPU a call costs about what one chunk does (kernel
    launches), on CPU a batch costs what its chunks do one by one and only delays the first."""
    return 32 if device.type == "cuda" else 1


@dataclass
class CodeChunk:
    """Frames [start - context, end + lookahead) as far as known; the audio kept is `length` frames.
    `hidden`: the GPT hidden state of each of those frames ([H] rows), when the stream carries them
    (the Decoder path). `last`: the chunk ends its utterance (its audio is half a frame shorter)."""

    index: int
    codes: list[tuple[int, ...]]
    context: int                   # leading frames that are context only
    length: int                    # frames whose audio this chunk produces
    hidden: list[np.ndarray] | None = None
    last: bool = False
    start: int = 0                 # frames of the stream's audio before this chunk (all its sentences)
    text: str = ""                 # the refined text of the sentence this chunk begins (text refine)


class FrameChunker:
    """Cuts a stream of frames into chunks: push(frames) -> chunks ready now; finish() -> the rest.
    A chunk is ready once `lookahead` frames past its end exist.

    finish() ends an utterance (one sentence: the reference decodes each text on its own); frames
    pushed after it start the next one, whose chunks go on in index and size."""

    def __init__(self, schedule: ChunkSchedule, left: int, lookahead: int) -> None:
        self.schedule, self.left, self.lookahead = schedule, left, lookahead
        self.frames: list[tuple[int, ...]] = []
        self.hidden: list[np.ndarray] = []
        self._sizes = schedule.sizes()
        self._next_end = next(self._sizes)
        self.emitted = 0           # frames of this utterance already handed out in chunks
        self.before = 0            # frames of the utterances before this one
        self.index = 0

    @property
    def total(self) -> int:
        """Frames of all utterances so far."""
        return self.before + len(self.frames)

    def _cut(self, end: int, last: bool = False) -> CodeChunk:
        lo, hi = max(0, self.emitted - self.left), min(len(self.frames), end + self.lookahead)
        chunk = CodeChunk(self.index, self.frames[lo:hi], self.emitted - lo, end - self.emitted,
                          self.hidden[lo:hi] if self.hidden else None, last, self.before + self.emitted)
        self.index += 1
        self.emitted = end
        return chunk

    def push(self, frames: list[tuple[int, ...]], hidden: np.ndarray | None = None) -> list[CodeChunk]:
        """frames, and with the Decoder path their hidden states [len(frames), H]."""
        if hidden is not None:
            assert len(hidden) == len(frames) and (self.hidden or not self.frames)
            self.hidden += list(hidden)
        self.frames += frames
        # a frame past the chunk must exist (even with no lookahead): the last chunk is finish()'s
        return self._cut_through(len(self.frames) - max(self.lookahead, 1))

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
        self.before += len(self.frames)
        self.frames, self.hidden, self.emitted = [], [], 0
        self._next_end = next(self._sizes)
        return out


@dataclass
class Refine:
    """Text refine before each sentence's audio, as the reference's first pass: the text head
    continues `prompts[i]` with `params`; `audio_prompt(generated ids)` -> (the refined text, the
    sentence's audio prompt)."""
    prompts: list[list[int]]
    params: object                              # SamplingParams
    audio_prompt: Callable[[list[int]], tuple[str, list]]


class SentenceStream:
    """One request's sentences, spoken in order as one stream of chunks: each sentence is one
    engine request (`prompt`, on `head`), its end frame is dropped, and it is its own utterance
    (its last chunk marked). With `refine`, a text-head request comes first and its refined text
    becomes the sentence's audio prompt. Serves the llm model and the in-process pipeline alike.

    Once the stream's first chunk is out (so the first audio is not slowed by a larger batch),
    up to `ahead` sentences after the one being spoken generate at the same time, batched with
    it; their frames are held until it ends, so the chunks still go out in order and the next
    sentence's first chunk is ready the moment the current one's last is.

        for i, prompt, sampling, kwargs in stream.requests(params, speaker, hidden): start them
        chunks = stream.feed(i, output)   # each engine output of sentence i's request
        after chunks or a finished request, until stream.done: start stream.requests(...) again
    """

    def __init__(self, sentences: list[list], chunker: FrameChunker, end_code: int,
                 refine: Refine | None = None, ahead: int = 0) -> None:
        self.sentences, self.chunker, self.end_code, self.refine = list(sentences), chunker, end_code, refine
        self.ahead = ahead
        self.sentence = 0                           # the one being spoken: its chunks go out now
        n = len(self.sentences)
        self.phase = ["refine" if refine is not None else "audio"] * n    # then "done"
        self.started = [False] * n                  # the current phase's request has started
        self.generated: list[list[int]] = [[] for _ in range(n)]        # a refine's text ids so far
        self.texts = [""] * n                       # refined texts, until the sentence's first chunk takes it
        self.held: list[list[tuple]] = [[] for _ in range(n)]          # (frames, hidden, ended) of one ahead

    def requests(self, params, speaker, hidden: bool) -> list[tuple[int, list, object, dict]]:
        """The engine requests to start now, given the audio's sampling, speaker and whether it
        wants hidden states: [(sentence, prompt, sampling, add_request's head, speaker and
        return_hidden)]. A refine runs on the text head, without the speaker or hidden states."""
        out = []
        ahead = self.ahead if self.chunker.index > 0 else 0
        for i in range(self.sentence, min(len(self.sentences), self.sentence + 1 + ahead)):
            if self.started[i] or self.phase[i] == "done":
                continue
            self.started[i] = True
            if self.phase[i] == "refine":
                out.append((i, self.refine.prompts[i], self.refine.params,
                            {"head": "text", "speaker": None, "return_hidden": False}))
            else:
                out.append((i, self.sentences[i], params, {"head": "audio", "speaker": speaker, "return_hidden": hidden}))
        return out

    @property
    def done(self) -> bool:
        return self.sentence >= len(self.sentences)

    def unsent_frames(self) -> int:
        """Frames generated but not yet in a chunk: the current sentence's not yet cut, and those
        held for the sentences ahead."""
        held = sum(len(frames) for outputs in self.held for frames, _, _ in outputs)
        return len(self.chunker.frames) - self.chunker.emitted + held

    def feed(self, i: int, out) -> list[CodeChunk]:
        """Sentence i's engine output (velocity.engine.llm_engine.RequestOutput) -> the chunks now
        ready. A sentence that ends ("stop" or "length") lets the next one speak; a refine that
        ends readies the sentence's audio request."""
        ended = out.finished and out.finish_reason in ("stop", "length")
        if self.phase[i] == "refine":
            self.generated[i] += out.new_token_ids
            if ended:
                self.texts[i], self.sentences[i] = self.refine.audio_prompt(self.generated[i])
                self.phase[i], self.started[i], self.generated[i] = "audio", False, []
            return []
        keep = [k for k, f in enumerate(out.new_token_ids) if self.end_code not in f]
        frames = [out.new_token_ids[k] for k in keep]
        hidden = None if out.new_hidden is None else out.new_hidden[keep]
        if ended:
            self.phase[i] = "done"
        if i != self.sentence:
            self.held[i].append((frames, hidden, ended))
            return []
        return self._speak([(frames, hidden, ended)])

    def _speak(self, outputs: list[tuple]) -> list[CodeChunk]:
        """The current sentence's outputs into the chunker; at its end, the next one's held ones."""
        chunks: list[CodeChunk] = []
        while outputs:
            frames, hidden, ended = outputs.pop(0)
            mine = self.chunker.push(frames, hidden) + (self.chunker.finish() if ended else [])
            if mine and self.texts[self.sentence]:       # the refined text rides on its first chunk
                mine[0].text, self.texts[self.sentence] = self.texts[self.sentence], ""
            chunks += mine
            if ended:
                self.sentence += 1
                if not self.done:
                    outputs, self.held[self.sentence] = self.held[self.sentence], []
        return chunks


Chunk = tuple   # (x, context, length, last): x codes [b, num_vq, T] (integers) or hidden [b, T, H] (floats)


class AudioDecoder:
    """codes -> DVAE, or GPT hidden states -> Decoder; then Vocos -> waveform.
    samples_per_frame = 2 mel frames * hop. A whole decode of T frames gives T * 512 - 256
    samples, as the reference's (its ISTFT drops the last half hop pair); chunks give
    length * 512 each, the last one of an utterance 256 fewer, so they join to exactly that."""

    def __init__(self, dvae: DVAE, vocos: Vocos, decoder: DVAE | None = None) -> None:
        self.dvae, self.vocos, self.decoder = dvae, vocos, decoder
        self.samples_per_frame = 2 * vocos.cfg.hop_length
        self.sample_rate = vocos.cfg.sample_rate
        self.frames_per_second = self.sample_rate / self.samples_per_frame
        self.exact_context = max(exact_context(m, vocos) for m in (dvae, decoder) if m is not None)
        self.num_vq = dvae.cfg.groups * dvae.cfg.residuals        # codebooks per frame
        self.num_codes = math.prod(dvae.cfg.levels)              # codes per codebook: [0, num_codes)
        self.hidden_size = 2 * decoder.cfg.idim if decoder is not None else 0   # the Decoder's input

    def quantize(self, mode: str) -> int:
        """mode "none" (nothing) or "int8" (quantize_int8); returns how many linears changed."""
        if mode not in ("none", "int8"):
            raise ValueError(f"the vocoder's quantize (VELOCITY_VOCODER_QUANTIZE) must be none or int8, got {mode!r}")
        return self.quantize_int8() if mode == "int8" else 0

    def quantize_int8(self) -> int:
        """The ConvNeXt blocks' linears (most of the decoders' work) on int8 weights with per-row int8
        activations (velocity.model.int8_linear): about 3x faster on CPU, about 40 dB SER against
        the float32 decode (docs/benchmarks.md "int8 on CPU"). Returns how many."""
        from velocity.model.convnext import ConvNeXtBlock
        from velocity.model.int8_linear import quantize_linears, require_int8
        p = next(self.vocos.parameters())
        require_int8(p.device, p.dtype, "the vocoder", "VELOCITY_VOCODER_QUANTIZE")
        return sum(quantize_linears(m, ConvNeXtBlock) for m in (self.dvae, self.decoder, self.vocos) if m is not None)

    @torch.inference_mode()
    def _audio(self, x: torch.Tensor) -> torch.Tensor:
        """codes [B, num_vq, T] or hidden [B, T, H] -> audio [B, T * 512]"""
        dev = next(self.vocos.parameters()).device
        if x.is_floating_point():
            if self.decoder is None:
                raise ValueError("hidden states given, but no Decoder is loaded")
            mel = self.decoder(x.to(dev, next(self.decoder.parameters()).dtype).transpose(1, 2))
        else:
            mel = self.dvae(x.to(dev))
        return self.vocos(mel)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """A whole utterance: codes [B, num_vq, T] or hidden [B, T, H] -> audio [B, T * 512 - 256]"""
        return self._audio(x)[:, :-(self.samples_per_frame // 2)]

    def decode_chunks(self, chunks: list[Chunk], max_batch: int = 1) -> list[torch.Tensor]:
        """[(x, context, length, last)] -> each chunk's audio [b, length * 512 (- 256 if last)], in
        order. Chunks of one kind and T are decoded together, up to max_batch chunks per call."""
        out: list[torch.Tensor | None] = [None] * len(chunks)
        groups: dict[tuple, list[int]] = {}
        for i, (x, *_) in enumerate(chunks):
            groups.setdefault((x.is_floating_point(), x.shape[1:]), []).append(i)
        n, step = self.samples_per_frame, max(1, max_batch)
        for rows in groups.values():
            for s in range(0, len(rows), step):
                part = rows[s:s + step]
                audio = self._audio(torch.cat([chunks[i][0] for i in part]))          # [sum b, T * 512]
                row = 0
                for i in part:
                    x, ctx, length, last = chunks[i]
                    out[i] = audio[row:row + x.shape[0], ctx * n:(ctx + length) * n - (n // 2 if last else 0)]
                    row += x.shape[0]
        return out

    def decode_cut(self, chunks: list[CodeChunk], max_batch: int = 1) -> list[torch.Tensor]:
        """decode_chunks for the chunks a FrameChunker cut: each one's audio [1, samples]."""
        return self.decode_chunks([(chunk_input(c), c.context, c.length, c.last) for c in chunks], max_batch)


def chunk_input(c: CodeChunk) -> torch.Tensor:
    """What the chunk is decoded from: its hidden states [1, T, H] if it has them, else codes [1, num_vq, T]."""
    if c.hidden is not None:
        return torch.from_numpy(np.stack(c.hidden))[None]
    return torch.tensor(c.codes, dtype=torch.long).T[None]


class StreamingDecoder:
    """Feed frames as they are generated; get each chunk's audio as soon as its lookahead exists."""

    def __init__(self, decoder: AudioDecoder, schedule: ChunkSchedule = ChunkSchedule(),
                 left: int | None = None, lookahead: int | None = None) -> None:
        self.decoder = decoder
        self.chunker = FrameChunker(schedule, decoder.exact_context if left is None else left,
                                    decoder.exact_context if lookahead is None else lookahead)

    def cut(self, frames: list[tuple[int, ...]], final: bool = False,
            hidden: np.ndarray | None = None) -> list[CodeChunk]:
        """Add frames (and their hidden states, for the Decoder path); returns the chunks now
        complete, not yet decoded (to decode with others). final: the utterance ends here."""
        return self.chunker.push(frames, hidden) + (self.chunker.finish() if final else [])

    def push(self, frames: list[tuple[int, ...]], final: bool = False,
             hidden: np.ndarray | None = None) -> list[tuple[int, torch.Tensor]]:
        """Add frames; returns [(chunk index, audio [samples])] for every chunk now complete."""
        chunks = self.cut(frames, final, hidden)
        return [(c.index, a[0]) for c, a in zip(chunks, self.decoder.decode_cut(chunks))]
