"""The llm model's requests in flight: each a SentenceStream over the AsyncLLMEngine, its chunks
sent in order by one response thread (not the engine loop), a limit on streams in flight, the
drain on stop, and the engine's gauges. Triton's objects stay in the adapter: this module gets a
`send(sender, outputs or None, final)` function and each request's sender and cancel check.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from functools import partial

from velocity.serving.drain import Drain
from velocity.serving.protocol import (STREAM_BUSY, STREAM_DRAINING, STREAM_FAILED, STREAM_SHUTTING_DOWN,
                                       chunk_outputs, error_outputs)
from velocity.serving.settings import Settings
from velocity.tts.streaming import FRAMES_PER_SECOND, FrameChunker, Refine, SentenceStream

log = logging.getLogger("velocity.llm")
Send = Callable[[object, "dict | None", bool], None]       # (sender, outputs or None: only the flag, final)


class Stream:
    """One request: its sentences spoken in order with one speaker, ended exactly once."""

    def __init__(self, host: "Streams", sender, cancelled: Callable[[], bool], sentences: list, speaker, params,
                 hidden: bool, refine: Refine | None = None) -> None:
        self.host, self.sender, self.cancelled = host, sender, cancelled
        self.speaker, self.params, self.hidden = speaker, params, hidden
        s = host.settings
        self.sentences = SentenceStream(sentences, FrameChunker(s.schedule, s.left_context, s.lookahead), host.end_code,
                                        refine, ahead=s.sentences_ahead)
        self.rid = f"{id(self)}"                 # in logs; its engine requests are rid-<sentence>[r]
        self.running: dict[int, str] = {}        # sentence -> its engine request in flight
        self.done = False
        self._lock = threading.Lock()
        self.stop_code: int | None = None       # set by another thread: end with this STREAM_* code
        self.t0 = time.monotonic()
        self.first_chunk_at: float | None = None

    def start_requests(self) -> None:
        """Start the sentences' engine requests that may run now (the current one and those ahead)."""
        for i, prompt, params, kwargs in self.sentences.requests(self.params, self.speaker, self.hidden):
            rid = self.running[i] = f"{self.rid}-{i}{'r' if kwargs['head'] == 'text' else ''}"
            self.host.engine.add_request(rid, prompt, params, partial(self.on_output, i), **kwargs)

    def abort_all(self) -> None:
        for rid in list(self.running.values()):
            self.host.engine.abort(rid)

    def stop(self, code: int) -> None:
        """From any thread: end this stream with a STREAM_* error code at its next output."""
        self.stop_code = code
        self.abort_all()                         # a waiting sequence has no next output: make one

    def end(self, code: int | None = None) -> None:
        """Queue the final flag (with a STREAM_* code, on an error chunk); once, from any thread."""
        with self._lock:
            if self.done:
                return
            self.done = True
        if code is not None:
            self.host.respond(self, error_outputs(code, self.host.num_vq), final=True)
            return
        self.host.respond(self, None, final=True)
        if frames := self.sentences.chunker.total:
            self.host.metrics["rtf"].observe((time.monotonic() - self.t0) / (frames / FRAMES_PER_SECOND))

    def on_output(self, i: int, out) -> None:    # on the engine thread: sentence i's output
        try:
            if out.finished:
                self.running.pop(i, None)
            if self.done:
                self.abort_all()                 # an ended stream's sentences still ahead
                return
            if self.cancelled() or self.stop_code is not None:
                self.abort_all()
                self.end(self.stop_code)
                return
            before = self.sentences.chunker.total
            chunks = self.sentences.feed(i, out)
            if (n := self.sentences.chunker.total - before) > 0:
                self.host.metrics["frames"].increment(n)
            if chunks and self.first_chunk_at is None:
                self.first_chunk_at = time.monotonic()
                self.host.metrics["ttfa"].observe(self.first_chunk_at - self.t0)
            for c in chunks:
                self.host.respond(self, chunk_outputs(c))
            if not out.finished:
                if chunks:
                    self.start_requests()        # the sentences ahead start after the first chunk
                return
            if out.error:
                log.error("request %s failed: %s", out.request_id, out.error)
                self.abort_all()
                self.end(STREAM_FAILED)
            elif out.finish_reason == "abort" or self.sentences.done:
                self.abort_all()
                self.end()
            else:
                self.start_requests()
        except Exception:                        # never leave a client hanging
            log.exception("stream %s failed", self.rid)
            self.abort_all()
            self.end(STREAM_FAILED)


class Streams:
    """The streams in flight, the response thread that answers them, and the monitor thread
    (engine gauges four times a second, serve.sh's drain request)."""

    def __init__(self, engine, settings: Settings, metrics: dict, send: Send, lender=None) -> None:
        self.engine, self.settings, self.metrics, self.send, self.lender = engine, settings, metrics, send, lender
        model = engine.engine.worker.model
        self.end_code, self.num_vq = model.num_audio_tokens - 1, model.num_vq
        self.live: dict[int, Stream] = {}
        self.drain = Drain(settings.run_dir)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._respond_loop, name="llm-responses", daemon=True),
                         threading.Thread(target=self._watch, name="llm-monitor", daemon=True)]
        for t in self._threads:
            t.start()

    def refusal(self) -> int | None:
        """The STREAM_* code that refuses a new request now (stopping, or the limit in flight), or None."""
        if self.drain.draining:
            return STREAM_DRAINING
        limit = self.settings.max_concurrent_requests
        return STREAM_BUSY if limit and len(self.live) >= limit else None

    def start(self, sender, cancelled: Callable[[], bool], sentences: list, speaker, params, hidden: bool,
              refine: Refine | None = None) -> None:
        """Start a checked request; it holds a slot until its final flag is sent."""
        stream = Stream(self, sender, cancelled, sentences, speaker, params, hidden, refine)
        self.live[id(stream)] = stream
        try:
            stream.start_requests()
        except Exception:                        # checked before, so our fault: end it, free its slot
            log.exception("llm: could not start stream %s", stream.rid)
            stream.end(STREAM_FAILED)

    def respond(self, stream: Stream, outputs: dict | None, final: bool = False) -> None:
        """Queue a response of the stream (None: only the final flag) for the response thread
        (VELOCITY_RESPONSE_THREAD=0: send it now, on the calling thread, for A/B runs)."""
        if self.settings.response_thread:
            self.outbox.put((stream, outputs, final))
        else:
            self._send(stream, outputs, final)

    def _send(self, stream: Stream, outputs: dict | None, final: bool) -> None:
        try:
            self.send(stream.sender, outputs, final)
        except Exception:                        # a broken sender must not stop the others
            log.exception("llm: could not send a response of %s", stream.rid)
        finally:
            if final:                            # the slot is free once the final flag is sent
                self.live.pop(id(stream), None)

    def _respond_loop(self) -> None:
        """Send queued responses in order."""
        while (item := self.outbox.get()) is not None:
            self._send(*item)

    def _watch(self) -> None:
        seen_preemptions = seen_lent = seen_steps = 0
        seen_seconds = 0.0
        while not self._stop.wait(0.25):
            if self.drain.poll():
                if self.drain.expired():
                    for stream in list(self.live.values()):
                        if stream.stop_code is None:
                            stream.stop(STREAM_SHUTTING_DOWN)
                if not self.live:
                    self.drain.done()
            st, m = self.engine.engine.stats(), self.metrics
            m["running"].set(st.running)
            m["waiting"].set(st.waiting + st.swapped)
            m["kv_used"].set(st.kv_blocks_used)
            m["kv_free"].set(st.kv_blocks_free)
            m["active"].set(len(self.live))
            if st.preemptions > seen_preemptions:
                m["preemptions"].increment(st.preemptions - seen_preemptions)
                seen_preemptions = st.preemptions
            steps, seconds = self.engine.steps, self.engine.step_seconds
            if steps > seen_steps:
                m["steps"].increment(steps - seen_steps)
                m["step_seconds"].increment(seconds - seen_seconds)
                seen_steps, seen_seconds = steps, seconds
            if self.lender is not None and self.lender.lent_steps > seen_lent:
                m["lent"].increment(self.lender.lent_steps - seen_lent)
                seen_lent = self.lender.lent_steps

    def close(self) -> None:
        """Stop: the engine aborts what is in flight, every stream ends, queued responses go out."""
        self._stop.set()
        self.engine.shutdown()
        for stream in list(self.live.values()):
            stream.end(STREAM_SHUTTING_DOWN)
        self.outbox.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self.drain.done()
