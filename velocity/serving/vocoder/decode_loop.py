"""The vocoder's decode thread (DecodeLoop): a stream's first chunk first, then the earliest
deadline (velocity.serving.vocoder.chunk_queue), with other queued chunks of the same shape up to
the batch; each job answered once decoded, with the final flag. A chunk of a stream whose client
left is answered with the final flag alone; a failed chunk of the ensemble's stream is marked
FAILED on the stream board, and the llm ends the stream with the error. The Triton adapter makes
the responses (`audio(outputs)`, `error(message, code name)`)."""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from velocity.serving.boards.stream_board import FAILED
from velocity.serving.metrics import count_decode
from velocity.serving.vocoder.chunk_queue import ChunkQueue
from velocity.serving.vocoder.jobs import Job
from velocity.serving.wire.protocol import vocoder_outputs

log = logging.getLogger("velocity.vocoder")


class DecodeLoop:
    """Jobs in (`put`), responses out through `send(job, response or None)`, on a thread of its own."""

    def __init__(self, decoder, device, batch: int, streams, board, cores, metrics,
                 audio: Callable[[dict], object], error: Callable[[str, str], object],
                 send: Callable[[Job, object], None]) -> None:
        self.decoder, self.device, self.batch, self.streams = decoder, device, batch, streams
        self.board, self.cores, self.metrics = board, cores, metrics
        self.audio, self.error, self.send = audio, error, send
        # a chunk is due once the audio before it (START frames) has played
        self.queue = ChunkQueue(lambda start: start / decoder.frames_per_second)
        self.thread = threading.Thread(target=self._run, name="vocoder-decode", daemon=True)
        self.thread.start()

    def put(self, job: Job) -> None:
        """Queue a job: an error chunk (index < 0) too, behind its stream's chunks (answered at once it
        could overtake them, and one such run left the ensemble request in flight on Triton 2.51)."""
        self.queue.put(-1 if job.chunk.number < 0 else job.chunk.start, job)

    def close(self, timeout: float = 60) -> None:
        """Decode what is queued, then stop."""
        self.queue.close()
        self.thread.join(timeout=timeout)

    def _run(self) -> None:
        while batch := self.queue.get_due(self.batch, key=self.streams.batch_key, one_of=self.streams.one_of):
            self.metrics["backlog"].set(len(self.queue))
            keep = []
            for deadline, job in batch:
                if job.error is None and self.board.ended(job.chunk.stream):     # its client left
                    self.metrics["dropped"].increment(1)
                    self.send(job, None)
                else:
                    keep.append((deadline, job))
            if keep:
                jobs = [job for _, job in keep]
                for job, response in zip(jobs, self._decode(jobs, [deadline for deadline, _ in keep])):
                    self.send(job, response)
            self.streams.sweep(self.board.gone)   # the decoders of streams that are over (left, failed, ended)

    def _decode(self, jobs: list[Job], deadlines: list[float]) -> list:
        """Responses for jobs of one shape (decoded in one call), or for one refused job (None: the
        final flag alone, for a chunk of a stream marked FAILED)."""
        if jobs[0].error is not None:
            return [jobs[0].error]
        start = time.monotonic()
        try:
            with self.cores.busy() if self.cores is not None else contextlib.nullcontext():
                audio, frames = self.streams.decode_chunks([j.chunk for j in jobs], self.device)
            audio = [a.float().cpu().numpy() for a in audio]                             # [b, samples] each
        except Exception as e:
            if len(jobs) > 1:             # a failed batch (e.g. out of GPU memory): each chunk on its own
                return [r for j, d in zip(jobs, deadlines) for r in self._decode([j], [d])]
            log.exception("vocoder: chunk %d failed", jobs[0].chunk.number)
            if jobs[0].chunk.stream:      # the llm ends the stream with the error
                self.board.mark(jobs[0].chunk.stream, FAILED)
                return [None]
            return [self.error(f"vocoder failed on chunk {jobs[0].chunk.number}: {e}", "INTERNAL")]
        count_decode(self.metrics, [j.queued for j in jobs], deadlines, start, time.monotonic(), frames,
                     sum(j.chunk.length * j.chunk.x.shape[0] for j in jobs))
        for j in jobs:
            self.board.decoded_to(j.chunk.stream, j.chunk.start + j.chunk.length)
        spf = self.decoder.samples_per_frame
        return [self.audio(vocoder_outputs(j.chunk, a, spf)) for j, a in zip(jobs, audio)]
