"""One request of the llm model as its stub holds it (Stream): its responses queued in order for
the response thread of its host (velocity.serving.stream_host), its client, deadline and board
slot, ended exactly once. Its audio is generated in the engine core (velocity.serving.engine_core.
stream.CoreStream), which sends its chunks ready-made.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from velocity.serving.protocol import STREAM_DEADLINE, STREAM_PROBE, error_outputs
from velocity.serving.stream_board import ENDED
from velocity.tts.chunking import FRAMES_PER_SECOND

if TYPE_CHECKING:
    from velocity.serving.stream_host import Streams

Send = Callable[[object, "dict | None", bool], None]       # (sender, outputs or None: only the flag, final)
Fail = Callable[[object, str, bool], None]                 # (sender, message, invalid: the caller's mistake)


class Failure:
    """A response that ends a request the core did not start: the message, and whether it is the
    caller's mistake (INVALID_ARG) or ours (INTERNAL)."""

    __slots__ = ("message", "invalid")

    def __init__(self, message: str, invalid: bool) -> None:
        self.message, self.invalid = message, invalid


class Stream:
    """One request, as the stub holds it: its responses, ended exactly once."""

    def __init__(self, host: "Streams", key: int, sender, cancelled: Callable[[], bool], ref: int = 0,
                 timeout: float = 0.0) -> None:
        self.host, self.key, self.sender, self.cancelled = host, key, sender, cancelled
        self.rid = str(key)                      # in logs; its engine requests are <key>-<sentence>[r]
        self.done = False
        self._lock = threading.Lock()
        # set by another thread: end with this STREAM_* code (None: the final flag alone) for this reason
        self.stop_code: int | None = None
        self.stop_reason: str | None = None
        self.ref = ref                           # its slot on the stream board (0: none, a direct caller)
        self.t0 = self.last_sent = time.monotonic()
        self.deadline = self.t0 + timeout if timeout > 0 else None
        self.first_chunk_at: float | None = None
        self.sent_frames = 0                     # frames of audio in the chunks sent
        self.told = -1                           # the progress last told to the core
        self.generated_at: float | None = None   # every frame generated (the final flag waits for the vocoder)

    def on_chunk(self, outputs: dict, length: int) -> None:
        """A chunk the core made (on the stub's receiving thread); none goes out past the deadline."""
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            self.stop(STREAM_DEADLINE, "deadline")
            return
        with self._lock:
            if self.done:
                return
            self.host.respond(self, outputs)
            self.sent_frames += length
            self.last_sent = now
        if self.first_chunk_at is None:
            self.first_chunk_at = now
            self.host.metrics["ttfa"].observe(now - self.t0)

    def stop(self, code: int | None, reason: str) -> None:
        """From any thread: end this stream now, with a STREAM_* error code (None: the final flag
        alone, for a client that left), and abort its work in the core; reason:
        velocity.serving.metrics.ABORT_REASONS."""
        if self.stop_reason is not None or self.done:
            return
        self.stop_code, self.stop_reason = code, reason
        if self.ref:                             # the vocoder decodes none of its queued chunks
            self.host.board.mark(self.ref, ENDED)
        self.host.core_stop(self.key)
        self.end(code)

    def end(self, code: int | None = None) -> None:
        """Queue the final flag (with a STREAM_* code, on an error chunk); once, from any thread."""
        with self._lock:
            if self.done:
                return
            self.done = True
            if code is not None:
                self.host.respond(self, error_outputs(code, self.host.num_vq, self.ref), final=True)
            else:
                self.host.respond(self, None, final=True)
        if self.stop_reason is not None:
            self.host.metrics["aborted"][self.stop_reason].increment(1)
        elif code is None and self.sent_frames:
            self.host.metrics["rtf"].observe((time.monotonic() - self.t0) / (self.sent_frames / FRAMES_PER_SECOND))

    def reject(self, message: str, invalid: bool) -> None:
        """The core did not start it (its inputs, or our fault): an error response ends it."""
        with self._lock:
            if self.done:
                return
            self.done = True
            self.host.respond(self, Failure(message, invalid), final=True)

    def probe(self) -> None:
        """A probe to the vocoder (see velocity.serving.protocol): nothing for the client."""
        with self._lock:
            if self.done:
                return
            self.last_sent = time.monotonic()
            self.host.respond(self, error_outputs(STREAM_PROBE, self.host.num_vq, self.ref))
