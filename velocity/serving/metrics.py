"""The Prometheus metrics the llm and vocoder models export (through Triton's metrics port),
counted in the process and published by a timer.

Every operation on a python-backend metric is a round trip to the server process: the stub
writes the metric into shared memory and waits for the server's answer, as it does for
`is_cancelled()` (benchmarks/bench_cancel_check.py). Counted at each event (a frame, a chunk) on
the engine's or the decoder's thread, those round trips held up their work. So `increment`,
`set` and `observe` here only count in the process (a lock held for an addition), and `publish`,
from a timer (`Publisher`, or the llm's monitor), sends what changed since the last one.

A python-backend metric is not safe to use from two threads at once either: each operation
releases the GIL, writes the metric into shared memory (freeing what the last operation wrote
there) and sends it to the server, which reads it from its own thread. Two threads at one metric
freed what the server was still reading: under a burst of cancels, tritonserver died in
`Metric::LoadFromSharedMemory` (SIGSEGV) or in `~Metric` (SIGABRT) in its stub-to-parent thread
(benchmarks/bench_cancel_burst.py). So every publish goes through one lock too.
"""
from __future__ import annotations

import logging
import threading
from collections import deque

LATENCY = [0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5, 10]
RTF = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5]

# Why the llm ended a stream before its audio was complete (velocity_aborted_requests_total's `reason`)
ABORT_REASONS = ("cancelled", "deadline", "shutdown", "failed")

# key -> (name, description, kind, histogram buckets, or for a labelled counter (label, its values), or None)
LLM = {
    "ttfa": ("velocity_time_to_first_chunk_seconds", "Request arrival to its first code chunk", "HISTOGRAM", LATENCY),
    "rtf": ("velocity_request_rtf", "Generation time / audio seconds, per request", "HISTOGRAM", RTF),
    "frames": ("velocity_frames_generated_total", "Audio frames generated", "COUNTER", None),
    "running": ("velocity_running_sequences", "Sequences in the running batch", "GAUGE", None),
    "waiting": ("velocity_waiting_sequences", "Sequences waiting or swapped out", "GAUGE", None),
    "kv_used": ("velocity_kv_blocks_used", "KV cache blocks in use", "GAUGE", None),
    "kv_free": ("velocity_kv_blocks_free", "KV cache blocks free", "GAUGE", None),
    "preemptions": ("velocity_preemptions_total", "Sequences preempted", "COUNTER", None),
    "active": ("velocity_active_requests", "Requests in flight in the llm", "GAUGE", None),
    "lent": ("velocity_llm_lent_steps_total", "Engine steps run with the idle vocoder's CPU threads too",
             "COUNTER", None),
    "steps": ("velocity_engine_steps_total", "Engine steps", "COUNTER", None),
    "step_seconds": ("velocity_engine_step_seconds_total",
                     "Seconds in engine steps, with their callbacks (not the responses, which a thread sends)",
                     "COUNTER", None),
    "worker_seconds": ("velocity_engine_worker_seconds_total",
                       "Of those, seconds in the engine's worker: the model, its heads and the sampler with their "
                       "inputs (on a GPU, their launch and the wait for the tokens)", "COUNTER", None),
    "refused": ("velocity_refused_requests_total", "Requests refused: server busy or shutting down", "COUNTER", None),
    "aborted": ("velocity_aborted_requests_total", "Requests ended before their audio was complete, by reason: "
                "the client cancelled or left, its deadline passed, the server shut down, or generation failed",
                "COUNTER", ("reason", ABORT_REASONS)),
    "paused": ("velocity_paused_sequences", "Sequences paused: their stream has enough audio waiting for the vocoder",
               "GAUGE", None),
    "clients": ("velocity_engine_clients", "Clients (the CLIENT input) with requests in the engine, which shares "
                "its batch between them", "GAUGE", None),
}
VOCODER = {
    "chunks": ("velocity_vocoder_chunks_total", "Chunks decoded by the vocoder", "COUNTER", None),
    "calls": ("velocity_vocoder_calls_total", "Decoder calls (chunks of one length decoded together)", "COUNTER", None),
    "queue": ("velocity_vocoder_queue_seconds_total", "Seconds chunks waited in the vocoder's queue", "COUNTER", None),
    "decode": ("velocity_vocoder_decode_seconds_total", "Seconds spent decoding chunks", "COUNTER", None),
    "late": ("velocity_vocoder_late_seconds_total", "Seconds chunks were decoded past their deadline", "COUNTER", None),
    "backlog": ("velocity_vocoder_backlog_chunks", "Chunks the llm sent that wait in the vocoder's queue", "GAUGE", None),
    "dropped": ("velocity_vocoder_dropped_chunks_total", "Chunks not decoded because their client had left",
                "COUNTER", None),
    "frames": ("velocity_vocoder_frames_total", "GPT frames the decoders computed: each chunk's context and "
               "lookahead included, or the stateful decoders' positions (each layer by its cost) over two",
               "COUNTER", None),
    "audio_frames": ("velocity_vocoder_audio_frames_total", "GPT frames of audio the vocoder produced", "COUNTER", None),
    "stream_decoders": ("velocity_vocoder_stream_decoders", "Streams whose stateful decoder the vocoder holds",
                        "GAUGE", None),
}
log = logging.getLogger("velocity.metrics")
PUBLISH_EVERY = 0.25      # seconds between the publishes of Metrics.start
PENDING = 65536           # observations a histogram keeps between two publishes at most
_FAMILIES: list = []      # a MetricFamily must outlive its metrics
_LOCK = threading.Lock()  # one python-backend metric operation at a time, in this process (see the module)


class Counted:
    """One metric, counted in the process: increment (a counter), set (a gauge) or observe (a
    histogram) from any thread; publish() sends what changed to the python-backend metric."""

    __slots__ = ("metric", "pending", "value", "sent", "observed", "lost", "lock")

    def __init__(self, metric) -> None:
        self.metric = metric
        self.pending = 0.0                  # a counter's increments since the last publish
        self.value = self.sent = None       # a gauge's value, and the one published
        self.observed: deque = deque()      # a histogram's observations since the last publish
        self.lost = 0                       # of those, the ones past PENDING (dropped, logged)
        self.lock = threading.Lock()

    def increment(self, value: float) -> None:
        with self.lock:
            self.pending += value

    def set(self, value: float) -> None:
        self.value = value

    def observe(self, value: float) -> None:
        with self.lock:
            if len(self.observed) < PENDING:
                self.observed.append(value)
            else:
                self.lost += 1

    def publish(self) -> None:
        """Send what changed since the last publish (hold _LOCK)."""
        with self.lock:
            pending, self.pending = self.pending, 0.0
            observed, self.observed = self.observed, deque()
            lost, self.lost = self.lost, 0
        if pending:
            self.metric.increment(pending)
        if (value := self.value) is not None and value != self.sent:
            self.metric.set(value)
            self.sent = value
        for v in observed:
            self.metric.observe(v)
        if lost:
            log.warning("metrics: %d observations over %d between two publishes were not recorded", lost, PENDING)


class Metrics(dict):
    """{key: Counted}, and for a labelled counter {key: {label value: Counted}}; publish() sends
    every change to the server, from one thread at a time: a timer's (start), or the caller's."""

    _stop: threading.Event | None = None
    _thread: threading.Thread | None = None

    def each(self):
        for m in self.values():
            yield from (m.values() if isinstance(m, dict) else (m,))

    def publish(self) -> None:
        try:
            with _LOCK:
                for m in self.each():
                    m.publish()
        except Exception:                   # a metric that fails must not stop the caller
            log.exception("metrics: publishing failed")

    def start(self, every: float = PUBLISH_EVERY, name: str = "metrics") -> "Metrics":
        """Publish every `every` seconds from a thread of its own, until close()."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), name=f"{name}-metrics", daemon=True)
        self._thread.start()
        return self

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.publish()

    def close(self) -> None:
        """Stop the timer (if started) and publish what is left."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
        self.publish()


def make_metrics(pb_utils, model: str, specs: dict) -> Metrics:
    """One metric per spec, labelled with the model's name, counted in the process (see the module):
    {key: Counted}; a labelled counter gives {key: {label value: Counted}}."""
    MF = pb_utils.MetricFamily
    out = Metrics()
    for key, (name, desc, kind, extra) in specs.items():
        _FAMILIES.append(family := MF(name=name, description=desc, kind=getattr(MF, kind)))
        if kind == "COUNTER" and extra:
            label, values = extra
            out[key] = {v: Counted(family.Metric(labels={"model": model, label: v})) for v in values}
        else:
            out[key] = Counted(family.Metric(labels={"model": model}, **({"buckets": extra} if extra else {})))
    return out


def count_decode(m: dict, queued: list[float], deadlines: list[float], start: float, done: float,
                 frames: float = 0, audio_frames: int = 0) -> None:
    """One vocoder call on the VOCODER metrics: chunks queued at `queued`, due at `deadlines`,
    decoded from `start` to `done` (monotonic seconds), `frames` computed for `audio_frames`."""
    m["frames"].increment(frames)
    m["audio_frames"].increment(audio_frames)
    m["chunks"].increment(len(queued))
    m["calls"].increment(1)
    m["queue"].increment(sum(start - q for q in queued))
    m["decode"].increment(done - start)
    m["late"].increment(sum(max(0.0, done - d) for d in deadlines))
