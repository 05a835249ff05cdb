"""The llm model's requests in flight: each a SentenceStream over the AsyncLLMEngine, its chunks
sent in order by one response thread (not the engine loop), a limit on streams in flight, the
drain on stop, and the engine's gauges. Triton's objects stay in the adapter: this module gets a
`send(sender, outputs or None, final)` function and each request's sender and cancel check.

A monitor thread asks every 0.1 s whether each stream's client has left (Triton's is_cancelled, a
round trip to the server process: never on the engine thread), and aborts those that have.
A stream of the `tts` ensemble also holds a slot on the stream board (velocity.serving.stream_board),
which the monitor looks at too: a stream whose vocoder saw its client leave is aborted, a
stream with VELOCITY_BACKLOG_SECONDS of audio waiting for the vocoder pauses in the scheduler, a
quiet stream sends a probe, and a stream whose request timeout passed is ended. Its final flag
waits until the vocoder has decoded all its audio, so that a client that leaves during the last
chunks is still noticed and those chunks are not decoded.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from functools import partial

from velocity.serving.drain import Drain, failed_part
from velocity.serving.protocol import (STREAM_BUSY, STREAM_DEADLINE, STREAM_DRAINING, STREAM_FAILED, STREAM_PROBE,
                                       STREAM_PART_DIED, STREAM_SHUTTING_DOWN, chunk_outputs, error_outputs)
from velocity.serving.settings import Settings
from velocity.serving.stream_board import CANCELLED, ENDED, StreamBoard
from velocity.tts.chunking import FRAMES_PER_SECOND, FrameChunker
from velocity.tts.sentence_stream import Carry, Refine, SentenceStream

log = logging.getLogger("velocity.llm")
Send = Callable[[object, "dict | None", bool], None]       # (sender, outputs or None: only the flag, final)
TICK = 0.02                    # seconds between the monitor's looks at the board
ASK = 0.1                      # seconds between its questions to Triton whether a client left
TELL_S = 0.5                   # seconds the streams get to end with a part's death before the watchdog is told
HOLD_LIMIT = 60.0              # seconds a finished stream waits for the vocoder at most (a vocoder that died)


class Stream:
    """One request: its sentences spoken in order with one speaker, ended exactly once."""

    def __init__(self, host: "Streams", sender, cancelled: Callable[[], bool], sentences: list, speaker, params,
                 hidden: bool, refine: Refine | None = None, ref: int = 0, timeout: float = 0.0,
                 texts: list[str] | None = None, carry: Carry | None = None) -> None:
        self.host, self.sender, self.cancelled = host, sender, cancelled
        self.speaker, self.params, self.hidden = speaker, params, hidden
        s = host.settings
        self.sentences = SentenceStream(sentences, FrameChunker(s.schedule, s.left_context, s.lookahead), host.end_code,
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


class Streams:
    """The streams in flight, the response thread that answers them, and the monitor thread
    (the stream board every 20 ms, each client every 0.1 s; engine gauges and serve.sh's drain
    request four times a second)."""

    def __init__(self, engine, settings: Settings, metrics: dict, send: Send, lender=None,
                 board: StreamBoard | None = None) -> None:
        self.engine, self.settings, self.metrics, self.send, self.lender = engine, settings, metrics, send, lender
        self.board = board
        model = engine.model
        self.end_code, self.num_vq = model.num_audio_tokens - 1, model.num_vq
        self.backlog_frames = settings.backlog_frames()
        self.live: dict[int, Stream] = {}
        self.drain = Drain(settings.run_dir)
        self._failing, self._told = 0.0, False   # another part died: when the streams were ended; the watchdog told
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.voicer = ThreadPoolExecutor(1, thread_name_prefix="llm-voicing")   # voice carry-over's samples
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
              refine: Refine | None = None, in_ensemble: bool = False, timeout: float = 0.0,
              texts: list[str] | None = None, carry: Carry | None = None) -> None:
        """Start a checked request; it holds a slot until its final flag is sent. in_ensemble: the
        `tts` ensemble's vocoder follows (the stream takes a board slot: probes, backpressure);
        timeout: seconds it may take (0: no limit); texts: its sentences' (for the marks); carry:
        voice carry-over (velocity.tts.carry_over)."""
        ref = (self.board.open() or 0) if in_ensemble and self.board is not None else 0
        if in_ensemble and self.board is not None and not ref:
            log.warning("the stream board is full (%d streams): this stream will not notice its client leaving",
                        self.board.slots)
        stream = Stream(self, sender, cancelled, sentences, speaker, params, hidden, refine, ref, timeout, texts, carry)
        self.live[id(stream)] = stream
        try:
            stream.start_requests()
        except Exception:                        # checked before, so our fault: end it, free its slot
            log.exception("llm: could not start stream %s", stream.rid)
            stream.end(STREAM_FAILED)

    def respond(self, stream: Stream, outputs: dict | None, final: bool = False) -> None:
        """Queue a response of the stream (None: only the final flag) for the response thread."""
        self.outbox.put((stream, outputs, final))

    def _send(self, stream: Stream, outputs: dict | None, final: bool) -> None:
        try:
            self.send(stream.sender, outputs, final)
        except Exception:                        # a broken sender must not stop the others
            log.exception("llm: could not send a response of %s", stream.rid)
        finally:
            if final:                            # the slot is free once the final flag is sent
                self.live.pop(id(stream), None)
                if stream.ref:
                    self.board.close(stream.ref)

    def _respond_loop(self) -> None:
        """Send queued responses in order."""
        while (item := self.outbox.get()) is not None:
            self._send(*item)

    def _look(self, stream: Stream, now: float, ask: bool) -> None:
        """One stream's board slot and deadline, and with `ask` its client (from the monitor thread).
        The client is asked here, not at each of its outputs on the engine thread: Triton's
        is_cancelled() is a round trip to the server process (benchmarks/bench_cancel_check.py), and
        one a frame per stream held up every step."""
        if stream.done or stream.stop_reason is not None:
            return
        if ask and stream.cancelled():
            stream.stop(None, "cancelled")
            return
        if stream.deadline is not None and now >= stream.deadline:
            stream.stop(STREAM_DEADLINE, "deadline")
            return
        if not stream.ref:
            return
        state, decoded = self.board.read(stream.ref)
        if state:
            stream.stop(None if state == CANCELLED else STREAM_FAILED, "cancelled" if state == CANCELLED else "failed")
        elif stream.generated_at is not None:
            if decoded >= stream.sent_frames or now - stream.generated_at > HOLD_LIMIT:
                stream.end()
            elif now - stream.last_sent >= self.settings.cancel_probe_seconds:
                stream.probe()
        else:
            if self.backlog_frames:
                stream.pace(decoded, self.backlog_frames)
            if now - stream.last_sent >= self.settings.cancel_probe_seconds:
                stream.probe()

    def _watch(self) -> None:
        seen_preemptions = seen_lent = seen_steps = 0
        seen_seconds, next_gauges, next_ask = 0.0, 0.0, 0.0
        while not self._stop.wait(TICK):
            now = time.monotonic()
            if ask := now >= next_ask:
                next_ask = now + ASK
            for stream in list(self.live.values()):
                try:
                    self._look(stream, now, ask)
                except Exception:                # one stream's fault must not stop the monitor
                    log.exception("llm: monitor failed on stream %s", stream.rid)
            if now < next_gauges:
                continue
            next_gauges = now + 0.25
            self._tell_failure()
            if self.drain.poll():
                if self.drain.expired():
                    for stream in list(self.live.values()):
                        stream.stop(STREAM_SHUTTING_DOWN, "shutdown")
                if not self.live:
                    self.drain.done()
            st, m = self.engine.stats(), self.metrics
            m["running"].set(st.running)
            m["waiting"].set(st.waiting + st.swapped)
            m["kv_used"].set(st.kv_blocks_used)
            m["kv_free"].set(st.kv_blocks_free)
            m["paused"].set(st.paused)
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

    def _tell_failure(self) -> None:
        """Another part died (the watchdog's `failed`): end every stream with an error naming it,
        and once they have all ended, tell the watchdog (which then kills the server)."""
        if self._told or not failed_part(self.settings.run_dir):
            return
        if not self._failing:
            self._failing = time.monotonic()
            for stream in list(self.live.values()):
                stream.stop(STREAM_PART_DIED, "failed")
        if not self.live or time.monotonic() - self._failing > TELL_S:
            self._told = True
            self.drain.told()

    def close(self) -> None:
        """Stop: the engine aborts what is in flight, every stream ends, queued responses go out."""
        self._stop.set()
        self.engine.shutdown()
        self.voicer.shutdown(wait=False, cancel_futures=True)
        for stream in list(self.live.values()):
            if not stream.done:
                stream.stop_reason = stream.stop_reason or "shutdown"
            stream.end(STREAM_SHUTTING_DOWN)
        self.outbox.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self.drain.done()
