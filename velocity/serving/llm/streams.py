"""The llm model's requests in flight (Streams), on the stub's side of the engine core
(velocity.serving.llm.engine_core, a process of its own): each a Stream, its chunks sent in order by
one response thread, a limit on streams in flight, and a monitor thread. Triton's objects stay in
the adapter: this module gets `send(sender, outputs or None, final)` and `fail(sender, message,
invalid)` functions and each request's sender and cancel check.

The core's reports arrive on a thread of their own (CoreClient): each chunk is queued for the
response thread, each stream's end too, and the core's totals are kept for the metrics.

The monitor thread looks at every stream (_look). Every 20 ms it reads the stream board, every
0.1 s it asks Triton whether the client has left (a round trip to the server process). A stream
whose vocoder saw its client leave is stopped. The frames each stream has decoded, or that its
client has read (the gateway says so through the `pace` model), go to the core, which pauses a
stream with VELOCITY_BACKLOG_SECONDS of audio waiting. A quiet stream sends a probe; one whose
timeout passed is ended; a finished one's final flag waits until the vocoder has decoded all its
audio. The questions and the probes of all streams together have a rate each, so that many
streams spread theirs out instead of crowding the server.

Four times a second the monitor follows the server's life (_follow: serve.sh's drain, a part
that died) and publishes the metrics: the core's totals (EngineGauges) and what the threads
counted (velocity.serving.metrics).
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from velocity.serving.llm.direct_callers import DirectCallers
from velocity.serving.lifecycle.drain import Drain, all_told, failed_part
from velocity.serving.llm.engine_core.client import CoreClient
from velocity.serving.llm.engine_core.wire import Report, Totals
from velocity.serving.llm.llm_inputs import LLMRequest
from velocity.serving.wire.protocol import (STREAM_BUSY, STREAM_DEADLINE, STREAM_DRAINING, STREAM_FAILED,
                                       STREAM_PART_DIED, STREAM_SHUTTING_DOWN)
from velocity.serving.settings import Settings
from velocity.serving.llm.stream import Fail, Failure, Send, Stream, StreamContext
from velocity.serving.boards.stream_board import CANCELLED, StreamBoard
from velocity.serving.lifecycle.watchdog import WITHIN

log = logging.getLogger("velocity.llm")
TICK = 0.02                    # seconds between the monitor's looks at the board
ASK = 0.1                      # seconds between its questions to Triton whether a client left
ASK_RATE = 1000.0              # its questions per second at most, over every stream (each a round trip: bench_cancel_check)
EVERY = 0.25                   # seconds between its looks at the server's life, and its metrics
TELL_S = 0.5                   # seconds the streams get to end with a part's death before the watchdog is told
HOLD_LIMIT = 60.0              # seconds a finished stream waits for the vocoder at most (a vocoder that died)


def spread(every: float, n: int, rate: float) -> float:
    """Seconds between one stream's turns at something done `every` seconds per stream, with n
    streams and at most `rate` turns a second over all of them (rate <= 0: no bound)."""
    return max(every, n / rate) if rate > 0 else every


class EngineGauges:
    """The engine core's totals on the llm's metrics (velocity.serving.metrics.LLM): the counters
    move by what the core counted since the last publish."""

    def __init__(self, metrics: dict) -> None:
        self.metrics, self.last = metrics, Totals()

    def publish(self, t: Totals, active: int) -> None:
        m, last = self.metrics, self.last
        m["running"].set(t.running)
        m["waiting"].set(t.waiting)
        m["kv_used"].set(t.kv_used)
        m["kv_free"].set(t.kv_free)
        m["paused"].set(t.paused)
        m["clients"].set(t.clients)
        m["active"].set(active)
        for key, name in (("preemptions", "preemptions"), ("steps", "steps"), ("step_seconds", "step_seconds"),
                          ("worker_seconds", "worker_seconds"), ("lent", "lent_steps"), ("frames", "frames")):
            if (now := getattr(t, name)) > getattr(last, name):
                m[key].increment(now - getattr(last, name))
        self.last = t                            # a report's own: never changed after it came


class Streams:
    """The streams in flight, the engine core they run in, the response thread that answers them,
    and the monitor thread (see the module)."""

    def __init__(self, settings: Settings, metrics, send: Send, fail: Fail, board: StreamBoard | None = None,
                 exit_process: Callable[[], None] | None = None) -> None:
        self.settings, self.metrics, self.send, self.fail, self.board = settings, metrics, send, fail, board
        self.exit_process = exit_process          # after the engine core died and the streams were told
        self.gauges = EngineGauges(metrics)
        self.totals = Totals()
        self.backlog_frames = settings.backlog_frames()
        self.live: dict[int, Stream] = {}
        self.direct = DirectCallers(settings)    # of them, direct Triton callers' (CLIENT unsigned)
        self._keys = itertools.count(1)
        self.probe_every = settings.cancel_probe_seconds     # seconds a quiet stream waits to probe (the monitor's)
        self.drain = Drain(settings.run_dir)
        self._failing, self._told = 0.0, False   # another part died: when the streams were ended; the watchdog told
        self._through_vocoder = 0                # of those streams' errors, the ones the vocoder sends on
        self.dead: str | None = None             # why the engine core is gone
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self.core = CoreClient(settings, self._on_report, self._core_died)     # the model loads there
        self.num_vq = self.core.info["num_vq"]
        self.context = StreamContext(self.respond, self.core.stop, board, metrics, self.num_vq)
        self._threads = [threading.Thread(target=self._respond_loop, name="llm-responses", daemon=True),
                         threading.Thread(target=self._watch, name="llm-monitor", daemon=True)]
        for t in self._threads:
            t.start()

    def refusal(self) -> int | None:
        """The STREAM_* code that refuses a new request now (stopping, the limit in flight, or the
        engine core gone), or None."""
        if self.dead:
            return STREAM_PART_DIED
        if self.drain.draining:
            return STREAM_DRAINING
        limit = self.settings.max_concurrent_requests
        return STREAM_BUSY if limit and len(self.live) >= limit else None

    def start(self, req: LLMRequest) -> None:
        """Start a request whose inputs were read (the core checks them against the engine and
        answers a mistake with an error); it holds a slot until its final flag is sent. One the
        `tts` ensemble's vocoder follows takes a board slot (probes, backpressure); a direct
        caller's counts against their own cap too (DirectCallers)."""
        ref = (self.board.open() or 0) if req.in_ensemble and self.board is not None else 0
        if req.in_ensemble and self.board is not None and not ref:
            log.warning("the stream board is full (%d streams): this stream will not notice its client leaving",
                        self.board.slots)
        stream = Stream(self.context, next(self._keys), req, ref)
        self.live[stream.key] = stream
        if req.direct:
            self.direct.keys.add(stream.key)
        self.core.start(stream.key, ref, req.inputs)

    # -- the core's reports (its receiving thread) -------------------------------------
    def _on_report(self, report: Report) -> None:
        self.totals = report.totals
        live = self.live
        for ev in report.events:
            if (stream := live.get(ev[1])) is None:      # ended here already
                continue
            kind = ev[0]
            if kind == "chunk":
                stream.on_chunk(ev[2])
            elif kind == "generated":
                stream.generated_at = time.monotonic()   # the monitor ends it once all is decoded
            elif kind == "end":
                if ev[2] is not None and stream.stop_reason is None:
                    stream.stop_reason = "failed"
                stream.end(ev[2])
            else:
                stream.reject(ev[2], ev[3])

    def _core_died(self, why: str) -> None:
        """The engine core is gone: every stream ends with an error naming it (through the vocoder
        for the ensemble's), then, under serve.sh, this process ends, and the watchdog restarts the
        server as for any part's death."""
        self.dead = why
        run_dir = self.settings.run_dir
        if run_dir:                               # the vocoder names the part from it
            tmp = Path(run_dir) / "failed.tmp"
            tmp.write_text(WITHIN["llm"])
            tmp.replace(Path(run_dir) / "failed")
        through = 0
        for stream in list(self.live.values()):
            stream.stop(STREAM_PART_DIED, "failed")
            through += bool(stream.ref)
        end = time.monotonic() + TELL_S
        while self.live and time.monotonic() < end:      # their errors sent
            time.sleep(0.01)
        self.drain.told(through)
        while run_dir and not all_told(run_dir) and time.monotonic() < end + TELL_S:   # and the vocoder's on
            time.sleep(0.02)
        if self.exit_process is not None:
            self.exit_process()

    # -- responses ----------------------------------------------------------------------
    def respond(self, stream: Stream, outputs, final: bool = False) -> None:
        """Queue a response of the stream (None: only the final flag; a Failure: an error
        response) for the response thread."""
        self.outbox.put((stream, outputs, final))

    def _send(self, stream: Stream, outputs, final: bool) -> None:
        try:
            if isinstance(outputs, Failure):
                self.fail(stream.sender, outputs.message, outputs.invalid)
            else:
                self.send(stream.sender, outputs, final)
        except Exception:                        # a broken sender must not stop the others
            log.exception("llm: could not send a response of %s", stream.rid)
        finally:
            if final:                            # the slot is free once the final flag is sent
                self.live.pop(stream.key, None)
                self.direct.keys.discard(stream.key)
                if stream.ref:
                    self.board.close(stream.ref)

    def _respond_loop(self) -> None:
        """Send queued responses in order."""
        while (item := self.outbox.get()) is not None:
            self._send(*item)

    # -- the monitor --------------------------------------------------------------------
    def _look(self, stream: Stream, now: float, ask: bool, progress: list) -> None:
        """One stream's board slot and deadline, and with `ask` its client (from the monitor thread):
        Triton's is_cancelled() is a round trip to the server process (bench_cancel_check)."""
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
            # behind the vocoder, or the gateway's client once it fell behind: the core paces it
            done = decoded if taken < 0 else min(decoded, taken)
            if self.backlog_frames and done != stream.told:
                stream.told = done
                progress.append((stream.key, done))
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
            progress: list = []
            for stream in list(self.live.values()):
                try:
                    self._look(stream, now, ask, progress)
                except Exception:                # one stream's fault must not stop the monitor
                    log.exception("llm: monitor failed on stream %s", stream.rid)
            if progress:
                self.core.progress(progress)
            if now >= next_life:
                next_life = now + EVERY
                self._follow()
                self.gauges.publish(self.totals, len(self.live))
                self.metrics.publish()           # what the threads counted since (velocity.serving.metrics)

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
        if self._told or self.dead or not failed_part(self.settings.run_dir):
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
        """Stop: every stream ends, the engine core shuts down, queued responses go out."""
        self._stop.set()
        for stream in list(self.live.values()):
            if not stream.done:
                stream.stop_reason = stream.stop_reason or "shutdown"
            stream.end(STREAM_SHUTTING_DOWN)
        self.core.close()
        self.outbox.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self.gauges.publish(self.totals, len(self.live))
        self.metrics.publish()
        self.drain.done()
