"""The tensors between the llm and the vocoder, in one place: what the llm sends for a chunk or
an error, and what the vocoder reads back (and refuses, naming the input and its range).

    CODES        [1, num_vq, T] int32   the chunk's frames with their left context and lookahead
    HIDDEN       [1, T, H] float32      the GPT's hidden state per frame (Decoder path); [1, 0, 0]: codes path
    CONTEXT      [1, 1] int32           leading frames that are context only
    LENGTH       [1, 1] int32           frames whose audio the chunk produces (0: an error chunk)
    LAST         [1, 1] int32           1: the chunk ends its sentence (256 samples shorter)
    START        [1, 1] int32           frames of the stream's audio before the chunk (its deadline)
    CHUNK_INDEX  [1, 1] int32           the chunk's number in its stream, or a STREAM_* code < 0
    TEXT         [1, 1] bytes           the refined text of the sentence the chunk begins (text refine), else ""
    STREAM       [1, 1] int64           the stream's slot on the stream board (0: none, a direct caller)
    SENTENCE     [1, 1] int32           the sentence (utterance) of the stream the chunk belongs to
    LASTS        [1, 1] int32           sentences before it that ended in a LAST chunk: with START, its
                                        sample offset (START * 512 - LASTS * 256)
    SENTENCE_TEXT [1, 1] bytes          the text of the sentence the chunk begins (refined, with refine), else ""
    WORDS        [1, 1] bytes           JSON: the words estimated to start in the chunk (velocity.tts.word_timing),
                                        [{"word", "start", "end", "spoken"}] in samples of the stream's audio
    PAUSE, TAIL  [1, 1] int32           samples of silence before and after the chunk's audio (SSML's breaks)
    PAUSED       [1, 1] int64           samples of silence in the stream before the chunk (in its sample offset)

A probe (CHUNK_INDEX STREAM_PROBE, LENGTH 0) carries no audio: the llm sends one while a stream
of the `tts` ensemble has been quiet for a while (before its first chunk, between large chunks,
while it waits for the vocoder), so that the vocoder gets a new request of that stream, which
Triton marks cancelled once the client has left (velocity.serving.boards.stream_board). The vocoder
(decoupled) answers a probe with the final flag alone: the client never sees it.

Inside the ensemble the llm never answers with an error response: Triton 2.51's ensemble then
may never retire the request (it stays "in flight", the server cannot unload `tts` and stopping
ends in the exit timeout). The llm sends a last chunk with LENGTH 0 and one of the STREAM_* codes
as CHUNK_INDEX instead, and the vocoder (a plain model, whose errors the ensemble handles) turns
it into the error response.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from velocity.tts.chunking import CodeChunk, sample_offset
from velocity.tts.ssml import MAX_BREAK_MS
from velocity.tts.word_timing import SAMPLE_RATE

STREAM_SHUTTING_DOWN = -1     # ended by the drain on stop
STREAM_FAILED = -2            # generation failed (the llm logs why)
STREAM_BUSY = -3              # refused: VELOCITY_MAX_CONCURRENT_REQUESTS in flight
STREAM_DRAINING = -4          # refused: the server is stopping
STREAM_DEADLINE = -5          # ended: the request's timeout passed
STREAM_PROBE = -6             # not an error: a probe (see above), dropped by the vocoder
STREAM_PART_DIED = -7         # ended: another part of the server died (the watchdog names it in the run dir)
STREAM_DIRECT_BUSY = -8       # refused: direct Triton callers hold VELOCITY_MAX_DIRECT_REQUESTS

NO_HIDDEN = np.zeros((1, 0, 0), np.float32)
MAX_SILENCE = MAX_BREAK_MS * SAMPLE_RATE // 1000    # samples of one silence: SSML's longest break


def _i32(v: int) -> np.ndarray:
    return np.array([[v]], np.int32)


def text_tensor(text: str) -> np.ndarray:
    """[1, 1] BYTES holding one UTF-8 string."""
    return np.array([[text.encode()]], object)


def packed(c: CodeChunk) -> CodeChunk:
    """The chunk as the engine core sends it to the stub, which builds its tensors (chunk_outputs):
    its hidden rows one [T, H] float32 array, whose bytes go beside the message."""
    if c.hidden is not None:
        c.hidden = np.stack(c.hidden).astype(np.float32, copy=False)
    return c


def chunk_outputs(c: CodeChunk, stream: int = 0) -> dict[str, np.ndarray]:
    """The llm's response tensors for one chunk of the stream with board reference `stream`."""
    return {"CODES": np.asarray(c.codes, np.int32).T[None], "CONTEXT": _i32(c.context), "LENGTH": _i32(c.length),
            "CHUNK_INDEX": _i32(c.index), "LAST": _i32(int(c.last)), "START": _i32(c.start), "TEXT": text_tensor(c.text),
            "HIDDEN": NO_HIDDEN if c.hidden is None else np.asarray(c.hidden, np.float32)[None],
            "STREAM": np.array([[stream]], np.int64), "SENTENCE": _i32(c.sentence), "LASTS": _i32(c.lasts),
            "SENTENCE_TEXT": text_tensor(c.sentence_text), "WORDS": text_tensor(words_json(c.words)),
            "PAUSE": _i32(c.pause), "TAIL": _i32(c.tail), "PAUSED": np.array([[c.paused]], np.int64)}


def words_json(words: list | None) -> str:
    """A chunk's words (velocity.tts.word_timing.Word) as WORDS holds them ("" for none)."""
    return json.dumps([w.to_dict() for w in words], ensure_ascii=False) if words else ""


def error_outputs(code: int, num_vq: int, stream: int = 0) -> dict[str, np.ndarray]:
    """The llm's last response of a stream that ends with a STREAM_* code (or a probe: STREAM_PROBE):
    a chunk of no audio (one frame of zero codes, LENGTH 0) whose CHUNK_INDEX is the code."""
    return chunk_outputs(CodeChunk(code, [(0,) * num_vq], 0, 0), stream)


@dataclass(slots=True)
class CodeChunkIn:
    """A CodeChunk as the vocoder reads it off the llm's response (copies: a request's tensors are
    freed after execute)."""
    index: np.ndarray                 # CHUNK_INDEX as sent (echoed back)
    codes: np.ndarray                 # [b, num_vq, T] int64
    hidden: np.ndarray | None         # [b, T, H] float32 for the Decoder path, else None
    context: int
    length: int
    last: bool
    start: int                        # frames before it (0 when not sent: due at once)
    text: bytes = b""                 # TEXT (the refined text of its sentence), passed on
    stream: int = 0                   # STREAM: its stream's reference on the stream board (0: none)
    sentence: int = 0                 # SENTENCE
    lasts: int = 0                    # LASTS
    sentence_text: bytes = b""        # SENTENCE_TEXT, passed on
    words: bytes = b""                # WORDS, passed on
    pause: int = 0                    # PAUSE, TAIL: silence around its audio
    tail: int = 0
    paused: int = 0                   # PAUSED: silence before it

    def sample_offset(self, samples_per_frame: int) -> int:
        """Samples of the stream's audio before this chunk's (velocity.tts.chunking.sample_offset),
        its silences counted."""
        return sample_offset(self.start, self.lasts, samples_per_frame) + self.paused

    @property
    def number(self) -> int:
        """The chunk's index (< 0: the llm's error code for its stream)."""
        return int(self.index.reshape(-1)[0])

    @property
    def x(self) -> np.ndarray:
        """What it is decoded from: hidden states (Decoder path) or codes."""
        return self.codes if self.hidden is None else self.hidden


def read_chunk(get) -> CodeChunkIn:
    """get(name) -> np.ndarray | None: the vocoder's inputs (all but CODES, CONTEXT, LENGTH and
    CHUNK_INDEX optional)."""
    def scalar(name: str, default: int = 0) -> int:
        v = get(name)
        return default if v is None or v.size == 0 else int(v.reshape(-1)[0])

    def text(name: str) -> bytes:
        v = get(name)
        return b"" if v is None or v.size == 0 else bytes(v.reshape(-1)[0])

    hidden = get("HIDDEN")
    return CodeChunkIn(get("CHUNK_INDEX").copy(), get("CODES").astype(np.int64),
                   None if hidden is None or hidden.size == 0 else hidden.astype(np.float32),
                   scalar("CONTEXT"), scalar("LENGTH"), bool(scalar("LAST")), scalar("START"),
                   text("TEXT"), scalar("STREAM"), scalar("SENTENCE"), scalar("LASTS"), text("SENTENCE_TEXT"),
                   text("WORDS"), scalar("PAUSE"), scalar("TAIL"), scalar("PAUSED"))


def chunk_problem(c: CodeChunkIn, num_vq: int, num_codes: int, hidden_size: int) -> str | None:
    """Why the vocoder cannot decode this chunk (the message names the input and its range), or None."""
    codes, ctx, length = c.codes, c.context, c.length
    if codes.ndim != 3 or codes.shape[1] != num_vq:
        return f"CODES must be [1, {num_vq}, frames], got {list(codes.shape)}"
    if not (0 <= ctx and length >= 1 and ctx + length <= codes.shape[-1]):
        return f"CODES {list(codes.shape)} does not hold CONTEXT={ctx} + LENGTH={length} frames"
    if codes.min() < 0 or codes.max() >= num_codes:
        return f"CODES must hold codes in [0, {num_codes}), got values in [{codes.min()}, {codes.max()}]"
    if c.hidden is not None and c.hidden.shape != (codes.shape[0], codes.shape[-1], hidden_size):
        return (f"HIDDEN must be [{codes.shape[0]}, {codes.shape[-1]}, {hidden_size}] (a hidden state per "
                f"frame of CODES), got {list(c.hidden.shape)}")
    if c.hidden is not None and not np.isfinite(c.hidden).all():
        return "HIDDEN must hold finite floats (got NaN or inf)"
    if c.start < 0:
        return f"START must be >= 0 (frames before the chunk), got {c.start}"
    if not (0 <= c.pause <= MAX_SILENCE and 0 <= c.tail <= MAX_SILENCE and c.paused >= 0):
        return f"PAUSE and TAIL must be in [0, {MAX_SILENCE}] samples and PAUSED >= 0, got {c.pause}, {c.tail}, {c.paused}"
    return None


def vocoder_outputs(c: CodeChunkIn, audio: np.ndarray, samples_per_frame: int) -> dict[str, np.ndarray]:
    """The vocoder's response tensors for one decoded chunk (its audio [b, samples]), its silences
    around it."""
    if c.pause or c.tail:
        audio = np.pad(audio, [(0, 0)] * (audio.ndim - 1) + [(c.pause, c.tail)])
    return {"WAVEFORM": audio, "CHUNK_INDEX": c.index, "TEXT": np.array([[c.text]], object),
            "SENTENCE_INDEX": np.array([[c.sentence]], np.int32),
            "SAMPLE_OFFSET": np.array([[c.sample_offset(samples_per_frame)]], np.int64),
            "SENTENCE_TEXT": np.array([[c.sentence_text]], object), "WORDS": np.array([[c.words]], object),
            "STREAM": np.array([[c.stream]], np.int64)}
