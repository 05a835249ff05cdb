"""The llm model's requests in flight (Streams): each a Stream over the AsyncLLMEngine, its chunks
sent in order by one response thread (not the engine loop), a limit on streams in flight, and a
monitor thread. Triton's objects stay in the adapter: this module gets a
`send(sender, outputs or None, final)` function and each request's sender and cancel check.

The monitor has three jobs, each a method: it looks at every stream (_look: every 20 ms the
stream board, every 0.1 s whether the client has left, a round trip to the server process that
never runs on the engine thread; a stream whose vocoder saw its client leave is aborted, one with
VELOCITY_BACKLOG_SECONDS of audio waiting for the vocoder (or, as the gateway says through the `pace`
model, for its client to read it) pauses in the scheduler, a quiet one
sends a probe, one whose timeout passed is ended, and a finished one's final flag waits until the
vocoder has decoded all its audio; the questions and the probes of all streams together have a
rate each, so that many streams spread theirs out instead of crowding the server with them); four times a second it follows the server's life (_follow:
serve.sh's drain, a part that died); and it publishes the engine's gauges (EngineGauges).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from velocity.serving.drain import Drain, failed_part
from velocity.serving.protocol import (STREAM_BUSY, STREAM_DEADLINE, STREAM_DRAINING, STREAM_FAILED,
                                       STREAM_PART_DIED, STREAM_SHUTTING_DOWN)
from velocity.serving.settings import Settings
from velocity.serving.stream import Send, Stream
from velocity.serving.stream_board import CANCELLED, StreamBoard
from velocity.tts.sentence_stream import Carry, Refine

log = logging.getLogger("velocity.llm")
TICK = 0.02                    # seconds between the monitor's looks at the board
ASK = 0.1                      # seconds between its questions to Triton whether a client left
ASK_RATE = 1000.0              # its questions per second at most, over every stream (each a round trip: bench_cancel_check)
EVERY = 0.25                   # seconds between its looks at the server's life, and its gauges
TELL_S = 0.5                   # seconds the streams get to end with a part's death before the watchdog is told
HOLD_LIMIT = 60.0              # seconds a finished stream waits for the vocoder at most (a vocoder that died)


def spread(every: float, n: int, rate: float) -> float:
    """Seconds between one stream's turns at something done `every` seconds per stream, with n
    streams and at most `rate` turns a second over all of them (rate <= 0: no bound)."""
    return max(every, n / rate) if rate > 0 else every


class EngineGauges:
    """The engine's gauges and counters on the llm's metrics (velocity.serving.metrics.LLM): the
    counters move by what the engine counted since the last publish."""

    def __init__(self, engine, metrics: dict, lender=None) -> None:
        self.engine, self.metrics, self.lender = engine, metrics, lender
        self.preemptions = self.lent = self.steps = 0
        self.seconds = 0.0

    def publish(self, active: int) -> None:
        st, m = self.engine.stats(), self.metrics
        m["running"].set(st.running)
        m["waiting"].set(st.waiting + st.swapped)
        m["kv_used"].set(st.kv_blocks_used)
        m["kv_free"].set(st.kv_blocks_free)
        m["paused"].set(st.paused)
        m["active"].set(active)
        if st.preemptions > self.preemptions:
            m["preemptions"].increment(st.preemptions - self.preemptions)
            self.preemptions = st.preemptions
        steps, seconds = self.engine.steps, self.engine.step_seconds
        if steps > self.steps:
            m["steps"].increment(steps - self.steps)
            m["step_seconds"].increment(seconds - self.seconds)
            self.steps, self.seconds = steps, seconds
        if self.lender is not None and self.lender.lent_steps > self.lent:
            m["lent"].increment(self.lender.lent_steps - self.lent)
            self.lent = self.lender.lent_steps


class Streams:
    """The streams in flight, the response thread that answers them, and the monitor thread
    (see the module)."""

    def __init__(self, engine, settings: Settings, metrics: dict, send: Send, lender=None,
                 board: StreamBoard | None = None) -> None:
        self.engine, self.settings, self.metrics, self.send, self.lender = engine, settings, metrics, send, lender
        self.gauges = EngineGauges(engine, metrics, lender)
        self.board = board
        model = engine.model
        self.end_code, self.num_vq = model.num_audio_tokens - 1, model.num_vq
        self.backlog_frames = settings.backlog_frames()
        self.schedule = settings.schedule(gpu=engine.device.type == "cuda")    # every stream's chunk sizes
        self.live: dict[int, Stream] = {}
        self.probe_every = settings.cancel_probe_seconds     # seconds a quiet stream waits to probe (the monitor's)
        self.drain = Drain(settings.run_dir)
        self._failing, self._told = 0.0, False   # another part died: when the streams were ended; the watchdog told
        self._through_vocoder = 0                # of those streams' errors, the ones the vocoder sends on
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
        state, decoded, taken = self.board.read(stream.ref)
        if state:
            stream.stop(None if state == CANCELLED else STREAM_FAILED, "cancelled" if state == CANCELLED else "failed")
        elif stream.generated_at is not None:
            if decoded >= stream.sent_frames or now - stream.generated_at > HOLD_LIMIT:
                stream.end()
            elif now - stream.last_sent >= self.probe_every:
                stream.probe()
        else:
            if self.backlog_frames:              # behind the vocoder, or the gateway's client once it fell behind
                stream.pace(decoded if taken < 0 else min(decoded, taken), self.backlog_frames)
            if now - stream.last_sent >= self.probe_every:
                stream.probe()

    def _watch(self) -> None:
        """The monitor thread: its three jobs at their own rates."""
        next_life, next_ask = 0.0, 0.0
        while not self._stop.wait(TICK):
            now, n = time.monotonic(), len(self.live)
            self.probe_every = spread(self.settings.cancel_probe_seconds, n, self.settings.cancel_probes_per_second)
            if ask := now >= next_ask:
                next_ask = now + spread(ASK, n, ASK_RATE)
            for stream in list(self.live.values()):
                try:
                    self._look(stream, now, ask)
                except Exception:                # one stream's fault must not stop the monitor
                    log.exception("llm: monitor failed on stream %s", stream.rid)
            if now >= next_life:
                next_life = now + EVERY
                self._follow()
                self.gauges.publish(len(self.live))

    def _follow(self) -> None:
        """The server's life: a part that died (the watchdog), then serve.sh's drain."""
        self._tell_failure()
        if self.drain.poll():
            if self.drain.expired():
                for stream in list(self.live.values()):
                    stream.stop(STREAM_SHUTTING_DOWN, "shutdown")
            if not self.live:
                self.drain.done()

    def _tell_failure(self) -> None:
        """Another part died (the watchdog's `failed`): end every stream with an error naming it,
        and once they have all ended, tell the watchdog (which then kills the server)."""
        if self._told or not failed_part(self.settings.run_dir):
            return
        if not self._failing:
            self._failing = time.monotonic()
            for stream in list(self.live.values()):
                stream.stop(STREAM_PART_DIED, "failed")
                if stream.ref and stream.stop_code == STREAM_PART_DIED:    # its error goes through the vocoder
                    self._through_vocoder += 1
        if not self.live or time.monotonic() - self._failing > TELL_S:
            self._told = True
            self.drain.told(self._through_vocoder)

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
