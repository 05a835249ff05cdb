"""What a client of the `tts` model reads from its responses, for the gateways and the client
alike: a chunk's audio and marks (AudioChunk), when a failed request is sent again (Retry), and
what to tell the `pace` model of how far it read the stream (ReadPosition)."""
from __future__ import annotations

from collections.abc import Callable
import json
from dataclasses import dataclass, field

import numpy as np

from velocity.tts.chunking import FRAMES_PER_SECOND

# Triton's own refusals once its stop has begun (after serve.sh's drain): "Server is stopping,
# scheduler for model has stopped accepting new inference requests", and, once the stop has
# unloaded the model while its other models still unload, "Request for unknown model: 'tts' has
# no available versions" (a balancer that has not yet seen the drain still sends requests there)
TRITON_STOPPED = ("Server is stopping", "has no available versions")
RETRYABLE = ("server busy", "shutting down", *TRITON_STOPPED)   # Triton errors worth another try (another replica)


@dataclass(frozen=True, slots=True)
class Retry:
    """When a request is sent again, for the gateway's async streams and the client's sync ones:
    only when it failed before its first chunk with a retryable error (busy, draining,
    unreachable), up to `retries` times, after a pause that grows by `pause` seconds a try
    (behind a balancer: time for it to see a drain). After the first chunk, never: the client
    already has audio."""
    retries: int = 0
    pause: float = 0.0

    def again(self, attempt: int, started: bool, message: str, unreachable: bool = False) -> bool:
        return (not started and attempt < self.retries
                and (unreachable or any(m in message for m in RETRYABLE)))

    def wait(self, attempt: int) -> float:
        """Seconds to pause before try attempt + 1."""
        return self.pause * (attempt + 1)


@dataclass(slots=True)
class AudioChunk:
    """One chunk of a `tts` stream: its audio, the sentence it belongs to, the samples of the
    stream's audio before it, on a sentence's first chunk the text that sentence speaks, and the
    words estimated to start in it ({"word", "start", "end", "spoken"}, samples of the stream's
    audio: velocity.tts.word_timing)."""
    audio: np.ndarray
    sentence: int = 0
    offset: int = 0
    text: str = ""
    words: list = field(default_factory=list)
    on_read: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def read(self) -> None:
        """Its writer has handed it to the client (the gateway's pacing: velocity.gateway.pace)."""
        if self.on_read is not None:
            self.on_read()

    @property
    def end(self) -> int:
        """The frame of the stream's audio where it ends (end_frame)."""
        return end_frame(self.offset, len(self.audio), self.sentence)

    @classmethod
    def of(cls, result, wav: np.ndarray) -> "AudioChunk":
        """From a `tts` response (tritonclient's InferResult) and its WAVEFORM."""
        def one(name: str):
            v = result.as_numpy(name)
            return None if v is None or v.size == 0 else v.reshape(-1)[0]

        text, words = one("SENTENCE_TEXT"), one("WORDS")
        return cls(wav.reshape(-1), int(one("SENTENCE_INDEX") or 0), int(one("SAMPLE_OFFSET") or 0),
                   text.decode("utf-8", "replace") if isinstance(text, bytes) else "",
                   json.loads(words) if isinstance(words, bytes) and words else [])


BEHIND = round(2.0 * FRAMES_PER_SECOND)     # frames a reader may lag before the server is told
STEP = round(1.0 * FRAMES_PER_SECOND)       # frames it reads between two tellings while it lags
KEEPS_UP = -1                               # the pace model's TAKEN: pace by the vocoder alone
READ_AHEAD_S = 12.0                         # seconds of a stream a reader holds unread at most (the server's
                                            # 6 s bound, BEHIND and chunks in flight fit; bounds a server that does not pace)


def end_frame(offset: int, samples: int, sentence: int, sample_rate: int = 24000) -> int:
    """The frame of the stream's audio where a chunk ends, from its sample offset, its samples and
    its sentence (each sentence before it ended half a frame short: velocity.tts.chunking.sample_offset)."""
    per = sample_rate / FRAMES_PER_SECOND
    return int(-(-(offset + samples + sentence * per // 2) // per))


def stream_ref(result) -> int:
    """A `tts` response's STREAM (its reference for the pace model), 0 when it has none."""
    v = result.as_numpy("STREAM")
    return int(v.reshape(-1)[0]) if v is not None and v.size else 0


def pace_inputs(client_module, ref: int, taken: int) -> list:
    """The `pace` model's inputs (tritonclient.grpc's or its aio's InferInput)."""
    inputs = [client_module.InferInput("STREAM", [1, 1], "INT64"), client_module.InferInput("TAKEN", [1, 1], "INT64")]
    inputs[0].set_data_from_numpy(np.array([[ref]], np.int64))
    inputs[1].set_data_from_numpy(np.array([[taken]], np.int64))
    return inputs


@dataclass(slots=True)
class ReadPosition:
    """One stream's audio as it arrived from the server and as its reader took it (frames), and
    what the server was last told. A reader that keeps up costs nothing: the server is told only
    once the reader is BEHIND frames behind what arrived, then each STEP it reads, and once it is
    back within half of BEHIND, that it keeps up again (KEEPS_UP)."""
    arrived: int = 0
    taken: int = 0
    told: int = KEEPS_UP

    def arrive(self, end: int) -> None:
        """The server sent the stream's audio up to frame `end`."""
        self.arrived = max(self.arrived, end)

    def take(self, end: int) -> None:
        """The reader took the stream's audio up to frame `end`."""
        self.taken = max(self.taken, end)

    def due(self) -> int | None:
        """What to tell the server now, counted as told; None when it knows enough."""
        if (w := self.want()) == self.told:
            return None
        self.told = w
        return w

    def want(self) -> int:
        """What the server should know now (tell it when this is not `told`)."""
        lag = self.arrived - self.taken
        if self.told == KEEPS_UP:
            return self.taken if lag >= BEHIND else KEEPS_UP
        if lag < BEHIND // 2:
            return KEEPS_UP
        return self.taken if self.taken - self.told >= STEP else self.told
