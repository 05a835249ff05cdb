"""One request of the llm model (Stream): its sentences spoken in order with one speaker over the
AsyncLLMEngine, its chunks queued for the response thread of its host (velocity.serving.stream_host,
which starts, watches and ends them), ended exactly once.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from velocity.serving.protocol import STREAM_DEADLINE, STREAM_FAILED, STREAM_PROBE, chunk_outputs, error_outputs
from velocity.serving.stream_board import ENDED
from velocity.tts.chunking import FRAMES_PER_SECOND, FrameChunker
from velocity.tts.sentence_stream import Carry, Refine, SentenceStream

if TYPE_CHECKING:
    from velocity.serving.stream_host import Streams

log = logging.getLogger("velocity.llm")
Send = Callable[[object, "dict | None", bool], None]       # (sender, outputs or None: only the flag, final)


class Stream:
    """One request: its sentences spoken in order with one speaker, ended exactly once."""

    def __init__(self, host: "Streams", sender, cancelled: Callable[[], bool], sentences: list, speaker, params,
                 hidden: bool, refine: Refine | None = None, ref: int = 0, timeout: float = 0.0,
                 texts: list[str] | None = None, carry: Carry | None = None) -> None:
        self.host, self.sender, self.cancelled = host, sender, cancelled
        self.speaker, self.params, self.hidden = speaker, params, hidden
        s = host.settings
        self.sentences = SentenceStream(sentences, FrameChunker(host.schedule, s.left_context, s.lookahead), host.end_code,
                                        refine, ahead=s.sentences_ahead, texts=texts, carry=carry)
        self.rid = f"{id(self)}"                 # in logs; its engine requests are rid-<sentence>[r]
        self.running: dict[int, str] = {}        # sentence -> its engine request in flight
        self.paused: set[str] = set()            # engine requests paused for the vocoder
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
        self.unsent_frames = 0                   # generated but not yet in a chunk (held ahead, or uncut)
        self.generated_at: float | None = None   # every frame generated (the final flag waits for the vocoder)

    def start_requests(self) -> None:
        """Start the sentences' engine requests that may run now (the current one and those ahead)."""
        for i, prompt, params, kwargs in self.sentences.requests(self.params, self.speaker, self.hidden):
            rid = self.running[i] = f"{self.rid}-{i}{'r' if kwargs['head'] == 'text' else ''}"
            self.host.engine.add_request(rid, prompt, params, partial(self.on_output, i), **kwargs)

    def abort_all(self) -> None:
        for rid in list(self.running.values()):
            self.host.engine.abort(rid)

    def stop(self, code: int | None, reason: str) -> None:
        """From any thread: end this stream at its next output, with a STREAM_* error code (None:
        the final flag alone, for a client that left); reason: velocity.serving.metrics.ABORT_REASONS."""
        if self.stop_reason is not None or self.done:
            return
        self.stop_code, self.stop_reason = code, reason
        if self.ref:                             # the vocoder decodes none of its queued chunks
            self.host.board.mark(self.ref, ENDED)
        self.abort_all()                         # a waiting sequence has no next output: make one
        if not self.running or self.generated_at is not None:
            self.end(code)                       # nothing left to abort: end it here

    def end(self, code: int | None = None) -> None:
        """Queue the final flag (with a STREAM_* code, on an error chunk); once, from any thread."""
        with self._lock:
            if self.done:
                return
            self.done = True
        if self.stop_reason is not None:
            self.host.metrics["aborted"][self.stop_reason].increment(1)
        if code is not None:
            self.host.respond(self, error_outputs(code, self.host.num_vq, self.ref), final=True)
            return
        self.host.respond(self, None, final=True)
        if frames := self.sentences.chunker.total:
            self.host.metrics["rtf"].observe((time.monotonic() - self.t0) / (frames / FRAMES_PER_SECOND))

    def probe(self) -> None:
        """A probe to the vocoder (see velocity.serving.protocol): nothing for the client."""
        self.last_sent = time.monotonic()
        self.host.respond(self, error_outputs(STREAM_PROBE, self.host.num_vq, self.ref))

    def pace(self, decoded: int, bound: int) -> None:
        """Pause or resume its audio requests by the frames waiting for the vocoder: the sentence
        being spoken by those it sent and the vocoder has not decoded yet, a sentence ahead by
        those and every frame generated but not yet sent (from the monitor thread)."""
        behind = self.sent_frames - decoded
        for i, rid in list(self.running.items()):
            if rid.endswith("r"):                # text refine: no audio
                continue
            want = (behind if i == self.sentences.sentence else behind + self.unsent_frames) >= bound
            if want != (rid in self.paused):
                self.host.engine.pause(rid, want)
                (self.paused.add if want else self.paused.discard)(rid)

    def _voice(self, first: tuple) -> None:
        """Voice carry-over's sample of the first sentence (velocity.tts.carry_over), on the voicing
        thread: decoding its audio would hold up every stream's step on the engine's thread."""
        try:
            sample = self.sentences.carry.sample(*first)
            if self.done or self.stop_reason is not None:
                return
            self.sentences.voiced(sample)
            self.start_requests()
        except Exception:
            log.exception("stream %s: voice carry-over failed", self.rid)
            self.stop(STREAM_FAILED, "failed")

    def on_output(self, i: int, out) -> None:    # on the engine thread: sentence i's output
        try:
            if out.finished:
                self.paused.discard(self.running.pop(i, None))
            if self.done:
                self.abort_all()                 # an ended stream's sentences still ahead
                return
            if self.stop_reason is None and self.deadline is not None and time.monotonic() >= self.deadline:
                self.stop(STREAM_DEADLINE, "deadline")         # no chunk goes out past it
            if self.stop_reason is not None:
                self.abort_all()
                self.end(self.stop_code)
                return
            before = self.sentences.chunker.total
            chunks = self.sentences.feed(i, out)
            if (first := self.sentences.voicing()) is not None:    # its audio decoded off this thread
                self.host.voicer.submit(self._voice, first)
            if (n := self.sentences.chunker.total - before) > 0:
                self.host.metrics["frames"].increment(n)
            if chunks and self.first_chunk_at is None:
                self.first_chunk_at = time.monotonic()
                self.host.metrics["ttfa"].observe(self.first_chunk_at - self.t0)
            for c in chunks:
                self.host.respond(self, chunk_outputs(c, self.ref))
                self.sent_frames += c.length
            if chunks:
                self.last_sent = time.monotonic()
            self.unsent_frames = self.sentences.unsent_frames()
            if not out.finished:
                if chunks:
                    self.start_requests()        # the sentences ahead start after the first chunk
                return
            if out.error:
                log.error("request %s failed: %s", out.request_id, out.error)
                self.abort_all()
                self.stop_reason = "failed"
                self.end(STREAM_FAILED)
            elif out.finish_reason == "abort" or self.sentences.done:
                self.abort_all()
                if self.ref and out.finish_reason != "abort":
                    self.generated_at = time.monotonic()     # the monitor ends it once all is decoded
                else:
                    self.end()
            else:
                self.start_requests()
        except Exception:                        # never leave a client hanging
            log.exception("stream %s failed", self.rid)
            self.abort_all()
            self.stop_reason = self.stop_reason or "failed"
            self.end(STREAM_FAILED)
