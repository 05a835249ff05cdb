"""The Prometheus metrics the llm and vocoder models export (through Triton's metrics port).

A python-backend metric is not safe to use from two threads at once: each operation releases the
GIL, writes the metric into shared memory (freeing what the last operation wrote there) and sends
it to the server, which reads it from its own thread. Two threads at one metric (the vocoder's
`dropped` and `backlog` from its execute and decode threads, say) free what the server is still
reading: under a burst of cancels, tritonserver died in `Metric::LoadFromSharedMemory` (SIGSEGV)
or in `~Metric` (an exception from the shared-memory pool, SIGABRT) in its stub-to-parent thread
(benchmarks/bench_cancel_burst.py). So every operation here goes through one lock.
"""
from __future__ import annotations

import threading

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
    "refused": ("velocity_refused_requests_total", "Requests refused: server busy or shutting down", "COUNTER", None),
    "aborted": ("velocity_aborted_requests_total", "Requests ended before their audio was complete, by reason: "
                "the client cancelled or left, its deadline passed, the server shut down, or generation failed",
                "COUNTER", ("reason", ABORT_REASONS)),
    "paused": ("velocity_paused_sequences", "Sequences paused: their stream has enough audio waiting for the vocoder",
               "GAUGE", None),
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
_FAMILIES: list = []      # a MetricFamily must outlive its metrics
_LOCK = threading.Lock()  # one metric operation at a time, in this process (see the module)


class Serialized:
    """A python-backend metric whose operations hold the module's lock."""

    __slots__ = ("metric",)

    def __init__(self, metric) -> None:
        self.metric = metric

    def increment(self, value: float) -> None:
        with _LOCK:
            self.metric.increment(value)

    def set(self, value: float) -> None:
        with _LOCK:
            self.metric.set(value)

    def observe(self, value: float) -> None:
        with _LOCK:
            self.metric.observe(value)


def make_metrics(pb_utils, model: str, specs: dict) -> dict:
    """One metric per spec, labelled with the model's name: {key: metric}; a labelled counter
    gives {key: {label value: metric}}."""
    MF = pb_utils.MetricFamily
    out = {}
    for key, (name, desc, kind, extra) in specs.items():
        _FAMILIES.append(family := MF(name=name, description=desc, kind=getattr(MF, kind)))
        if kind == "COUNTER" and extra:
            label, values = extra
            out[key] = {v: Serialized(family.Metric(labels={"model": model, label: v})) for v in values}
        else:
            out[key] = Serialized(family.Metric(labels={"model": model}, **({"buckets": extra} if extra else {})))
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
