"""One request of the llm model as its stub holds it (Stream): its responses queued in order for
the response thread of its host (velocity.serving.llm.streams), its client, deadline and board
slot, ended exactly once. Its audio is generated in the engine core (velocity.serving.llm.engine_core.
stream.CoreStream), which sends its chunks ready-made.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from velocity.serving.llm.llm_inputs import LLMRequest
from velocity.serving.wire.protocol import STREAM_DEADLINE, STREAM_PROBE, chunk_outputs, error_outputs
from velocity.serving.boards.stream_board import ENDED
from velocity.tts.chunking import FRAMES_PER_SECOND, CodeChunk

Send = Callable[[object, "dict | None", bool], None]       # (sender, outputs or None: only the flag, final)
Fail = Callable[[object, str, bool], None]                 # (sender, message, invalid: the caller's mistake)


class Failure:
    """A response that ends a request the core did not start: the message, and whether it is the
    caller's mistake (INVALID_ARG) or ours (INTERNAL)."""

    __slots__ = ("message", "invalid")

    def __init__(self, message: str, invalid: bool) -> None:
        self.message, self.invalid = message, invalid


@dataclass(slots=True)
class StreamContext:
    """What a Stream needs of the streams that hold it: queue a response (`respond(stream,
    outputs or None, final)`), stop its work in the engine core, the stream board, the metrics and
    the codebooks an error chunk has."""
    respond: Callable[["Stream", object, bool], None]
    stop_core: Callable[[int], None]
    board: object
    metrics: object
    num_vq: int


class Stream:
    """One request, as the stub holds it: its responses, ended exactly once."""

    def __init__(self, ctx: StreamContext, key: int, req: LLMRequest, ref: int = 0) -> None:
        self.ctx, self.key, self.sender, self.cancelled = ctx, key, req.sender, req.cancelled
        timeout = req.timeout
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

    def on_chunk(self, chunk: CodeChunk) -> None:
        """A chunk the core made (on the stub's receiving thread), sent as its response tensors
        (chunk_outputs); none goes out past the deadline."""
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            self.stop(STREAM_DEADLINE, "deadline")
            return
        outputs = chunk_outputs(chunk, self.ref)
        with self._lock:
            if self.done:
                return
            self.ctx.respond(self, outputs, False)
            self.sent_frames += chunk.length
            self.last_sent = now
        if self.first_chunk_at is None:
            self.first_chunk_at = now
            self.ctx.metrics["ttfa"].observe(now - self.t0)

    def stop(self, code: int | None, reason: str) -> None:
        """From any thread: end this stream now, with a STREAM_* error code (None: the final flag
        alone, for a client that left), and abort its work in the core; reason:
        velocity.serving.metrics.ABORT_REASONS."""
        if self.stop_reason is not None or self.done:
            return
        self.stop_code, self.stop_reason = code, reason
        if self.ref:                             # the vocoder decodes none of its queued chunks
            self.ctx.board.mark(self.ref, ENDED)
        self.ctx.stop_core(self.key)
        self.end(code)

    def end(self, code: int | None = None) -> None:
        """Queue the final flag (with a STREAM_* code, on an error chunk); once, from any thread."""
        with self._lock:
            if self.done:
                return
            self.done = True
            if code is not None:
                self.ctx.respond(self, error_outputs(code, self.ctx.num_vq, self.ref), True)
            else:
                self.ctx.respond(self, None, True)
        if self.stop_reason is not None:
            self.ctx.metrics["aborted"][self.stop_reason].increment(1)
        elif code is None and self.sent_frames:
            self.ctx.metrics["rtf"].observe((time.monotonic() - self.t0) / (self.sent_frames / FRAMES_PER_SECOND))

    def reject(self, message: str, invalid: bool) -> None:
        """The core did not start it (its inputs, or our fault): an error response ends it."""
        with self._lock:
            if self.done:
                return
            self.done = True
            self.ctx.respond(self, Failure(message, invalid), True)

    def probe(self) -> None:
        """A probe to the vocoder (see velocity.serving.wire.protocol): nothing for the client."""
        with self._lock:
            if self.done:
                return
            self.last_sent = time.monotonic()
            self.ctx.respond(self, error_outputs(STREAM_PROBE, self.ctx.num_vq, self.ref), False)
