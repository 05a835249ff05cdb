"""What a client of the `tts` model reads from its responses, for the gateways and the client
alike: a chunk's audio and marks (AudioChunk), and when a failed request is sent again (Retry)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

RETRYABLE = ("server busy", "shutting down")   # Triton errors worth another try (another replica)


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
    stream's audio before it, and on a sentence's first chunk the text that sentence speaks."""
    audio: np.ndarray
    sentence: int = 0
    offset: int = 0
    text: str = ""
    on_read: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def read(self) -> None:
        """Its writer has handed it to the client (the gateway's pacing: velocity.gateway.pace)."""
        if self.on_read is not None:
            self.on_read()

    @classmethod
    def of(cls, result, wav: np.ndarray, on_read: Callable[[], None] | None = None) -> "AudioChunk":
        """From a `tts` response (tritonclient's InferResult) and its WAVEFORM."""
        def one(name: str):
            v = result.as_numpy(name)
            return None if v is None or v.size == 0 else v.reshape(-1)[0]

        text = one("SENTENCE_TEXT")
        return cls(wav.reshape(-1), int(one("SENTENCE_INDEX") or 0), int(one("SAMPLE_OFFSET") or 0),
                   text.decode("utf-8", "replace") if isinstance(text, bytes) else "", on_read)
