"""The vocoder's jobs: one queued chunk request (Job), which jobs decode together (same_shape), and
what answers a chunk it does not decode (chunk_refusal: the llm's STREAM_* code as its message,
stream_error, or what is wrong with the chunk)."""
from __future__ import annotations

from dataclasses import dataclass

from velocity.serving.lifecycle.drain import failed_part
from velocity.serving.lifecycle.watchdog import DIED
from velocity.serving.settings import Settings
from velocity.serving.wire.protocol import (STREAM_BUSY, STREAM_DEADLINE, STREAM_DIRECT_BUSY, STREAM_DRAINING,
                                            STREAM_PART_DIED, STREAM_SHUTTING_DOWN, CodeChunkIn, chunk_problem)


def stream_error(code: int, settings: Settings) -> tuple[str, bool]:
    """-> (the message for a STREAM_* code, whether it is UNAVAILABLE (retry) rather than INTERNAL)."""
    if code == STREAM_DEADLINE:
        return "deadline exceeded: the request's timeout passed before its audio was complete", True
    if code == STREAM_SHUTTING_DOWN:
        return "server shutting down: this stream was ended before it finished; retry on another instance", True
    if code == STREAM_BUSY:
        return (f"server busy: {settings.max_concurrent_requests} requests are in flight, the limit "
                f"(VELOCITY_MAX_CONCURRENT_REQUESTS); retry later"), True
    if code == STREAM_DIRECT_BUSY:
        return (f"server busy: direct Triton callers have {settings.direct_limit()} requests in flight, their "
                f"limit (VELOCITY_MAX_DIRECT_REQUESTS), which keeps room for the gateway's clients; retry "
                f"later, or speak through the gateway"), True
    if code == STREAM_DRAINING:
        return "server shutting down: new requests are refused; retry on another instance", True
    if code == STREAM_PART_DIED:
        part = failed_part(settings.run_dir) or "another part of the server"
        return f"the {part} {DIED}: the server is restarting; retry in a few seconds", True
    return "generation failed (the server log has the cause); retry the request", False


@dataclass(slots=True)
class Job:
    """One queued chunk request of the vocoder: the chunk, its response sender, when it was queued."""
    chunk: CodeChunkIn
    sender: object
    queued: float
    error: object = None              # a response that answers it without decoding


def same_shape(job: Job) -> tuple | None:
    """Jobs decodable in one call share this (path and shape); a refused job goes alone."""
    return None if job.error is not None else (job.chunk.hidden is None, job.chunk.x.shape[1:])


def chunk_refusal(c: CodeChunkIn, settings: Settings, num_vq: int, num_codes: int, hidden_size: int) -> tuple[str, str] | None:
    """(message, TritonError code name) for a chunk the vocoder does not decode, or None: the
    llm's error code (UNAVAILABLE to retry, else INTERNAL), or what is wrong with it (INVALID_ARG)."""
    if c.number < 0:                      # the llm ended or refused the stream: its error code
        msg, unavailable = stream_error(c.number, settings)
        return msg, "UNAVAILABLE" if unavailable else "INTERNAL"
    msg = chunk_problem(c, num_vq, num_codes, hidden_size)
    return None if msg is None else (msg, "INVALID_ARG")
