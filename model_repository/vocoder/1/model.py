"""Triton adapter: one chunk -> its audio (velocity.tts.streaming.AudioDecoder). Stateless.

A chunk with HIDDEN (the GPT's hidden states, the default Decoder path) is decoded by the
Decoder, one without by the DVAE from its CODES; then Vocos. LAST marks an utterance's last
chunk, whose audio is half a frame (256 samples) shorter, as the reference's whole decode.

execute() only queues: a decode thread takes chunks earliest deadline first
(velocity.serving.chunk_queue), with other queued chunks of the same length up to
VELOCITY_VOCODER_BATCH (one call for all: on a GPU it costs about what one chunk does), and
answers each as soon as it is decoded, through the request's response sender (one response
with the final flag: allowed in default mode since Triton 24.06). So a new stream's first chunk
does not wait behind a batch of later chunks.
"""
import contextlib
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from velocity.serving.chunk_queue import ChunkQueue
from velocity.serving.core_share import CoreBoard, board_path
from velocity.serving.requests import stream_error
from velocity.serving.settings import Settings
from velocity.model.audio_models import load_decoder, load_dvae, load_vocos
from velocity.tts.streaming import FRAMES_PER_SECOND, AudioDecoder, default_decode_batch
from velocity.engine.worker import resolve_device

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger("vocoder")
FAMILIES: list = []   # a MetricFamily must outlive its metrics


def make_metrics() -> dict:
    MF = pb_utils.MetricFamily
    out = {}
    for key, name, desc in [
            ("chunks", "velocity_vocoder_chunks_total", "Chunks decoded by the vocoder"),
            ("calls", "velocity_vocoder_calls_total", "Decoder calls (chunks of one length decoded together)"),
            ("queue", "velocity_vocoder_queue_seconds_total", "Seconds chunks waited in the vocoder's queue"),
            ("decode", "velocity_vocoder_decode_seconds_total", "Seconds spent decoding chunks"),
            ("late", "velocity_vocoder_late_seconds_total", "Seconds chunks were decoded past their deadline")]:
        FAMILIES.append(MF(name=name, description=desc, kind=MF.COUNTER))
        out[key] = FAMILIES[-1].Metric(labels={"model": "vocoder"})
    return out


@dataclass(slots=True)
class Job:
    """One queued chunk request."""
    index: np.ndarray                 # CHUNK_INDEX as sent (echoed back)
    codes: np.ndarray                 # [b, num_vq, T]
    hidden: np.ndarray | None         # [b, T, H] for the Decoder path, else None
    context: int
    length: int
    last: bool
    sender: object
    queued: float
    error: object = None              # a response that answers it without decoding

    @property
    def number(self) -> int:
        """The chunk's index (< 0: the llm's error code for its stream)."""
        return int(self.index.reshape(-1)[0])


    def input(self) -> np.ndarray:
        """What it is decoded from: hidden states (Decoder path) or codes."""
        return self.codes if self.hidden is None else self.hidden


def same_shape(job: Job) -> tuple | None:
    """Jobs decodable in one call share this (path and shape); a refused job goes alone."""
    return None if job.error is not None else (job.hidden is None, job.input().shape[1:])


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.settings = s = Settings.from_env()
        s.set_threads("vocoder")
        try:
            dev = resolve_device(s.device)
            self.decoder = AudioDecoder(load_dvae(s.weights, dev), load_vocos(s.weights, dev),
                                        load_decoder(s.weights, dev))
        except Exception as e:
            raise pb_utils.TritonModelException(f"vocoder: cannot load {s.weights}: {e}")
        self.device = dev
        self.batch = s.vocoder_batch or default_decode_batch(dev)
        self.cores = None
        if s.lend_vocoder_cores and dev.type == "cpu":     # tell the llm when this one decodes
            self.cores = CoreBoard(board_path(s.run_dir))
            self.cores.claim()
        schedule = s.schedule
        self.queue = ChunkQueue(lambda i: schedule.start(i) / FRAMES_PER_SECOND)
        self.metrics = make_metrics()
        self.thread = threading.Thread(target=self._decode_loop, name="vocoder-decode", daemon=True)
        self.thread.start()

    def execute(self, requests: list) -> None:
        for r in requests:
            def get(name: str) -> np.ndarray | None:
                t = pb_utils.get_input_tensor_by_name(r, name)
                return None if t is None else t.as_numpy()

            # copies: the request's tensors are freed when execute returns. An error chunk
            # (index < 0) is queued too, behind its stream's chunks: answered at once it could
            # overtake them, and one such run left the ensemble request in flight (Triton 2.51)
            hidden, last = get("HIDDEN"), get("LAST")
            job = Job(get("CHUNK_INDEX").copy(), get("CODES").astype(np.int64),
                      None if hidden is None or hidden.size == 0 else hidden.astype(np.float32),
                      int(get("CONTEXT").reshape(-1)[0]), int(get("LENGTH").reshape(-1)[0]),
                      last is not None and bool(last.reshape(-1)[0]), r.get_response_sender(), time.monotonic())
            job.error = self._refusal(job)
            self.queue.put(job.number, job)
        return None

    def _refusal(self, job: Job):
        """The error response for a job that is not to be decoded, or None."""
        Err = pb_utils.TritonError
        index = job.number
        if index < 0:                     # the llm ended or refused the stream: its error code
            msg, unavailable = stream_error(index, self.settings)
            return pb_utils.InferenceResponse(error=Err(msg, Err.UNAVAILABLE if unavailable else Err.INTERNAL))
        codes, ctx, length, d = job.codes, job.context, job.length, self.decoder
        if codes.ndim != 3 or codes.shape[1] != d.num_vq:
            msg = f"CODES must be [1, {d.num_vq}, frames], got {list(codes.shape)}"
        elif not (0 <= ctx and length >= 1 and ctx + length <= codes.shape[-1]):
            msg = f"CODES {list(codes.shape)} does not hold CONTEXT={ctx} + LENGTH={length} frames"
        elif codes.min() < 0 or codes.max() >= d.num_codes:
            msg = f"CODES must hold codes in [0, {d.num_codes}), got values in [{codes.min()}, {codes.max()}]"
        elif job.hidden is not None and job.hidden.shape != (codes.shape[0], codes.shape[-1], d.hidden_size):
            msg = (f"HIDDEN must be [{codes.shape[0]}, {codes.shape[-1]}, {d.hidden_size}] (a hidden state per "
                   f"frame of CODES), got {list(job.hidden.shape)}")
        elif job.hidden is not None and not np.isfinite(job.hidden).all():
            msg = "HIDDEN must hold finite floats (got NaN or inf)"
        else:
            return None
        return pb_utils.InferenceResponse(error=Err(msg, Err.INVALID_ARG))

    def _decode_loop(self) -> None:
        while batch := self.queue.get_due_batch(self.batch, key=same_shape):
            jobs = [job for _, job in batch]
            for job, response in zip(jobs, self._decode(jobs, [deadline for deadline, _ in batch])):
                try:
                    job.sender.send(response, flags=FINAL)
                except Exception:                 # a broken sender must not stop the loop
                    log.exception("vocoder: could not answer chunk %d", job.number)

    def _decode(self, jobs: list[Job], deadlines: list[float]) -> list:
        """Responses for jobs of one shape (decoded in one call), or for one refused job."""
        if jobs[0].error is not None:
            return [jobs[0].error]
        start = time.monotonic()
        try:
            with self.cores.busy() if self.cores is not None else contextlib.nullcontext():
                audio = self.decoder.decode_chunks([(torch.from_numpy(j.input()).to(self.device), j.context, j.length,
                                                     j.last) for j in jobs], len(jobs))
            audio = [a.float().cpu().numpy() for a in audio]                             # [b, samples] each
        except Exception as e:
            if len(jobs) > 1:             # a failed batch (e.g. out of GPU memory): each chunk on its own
                return [r for j, d in zip(jobs, deadlines) for r in self._decode([j], [d])]
            log.exception("vocoder: chunk %d failed", jobs[0].number)
            Err = pb_utils.TritonError
            return [pb_utils.InferenceResponse(error=Err(
                f"vocoder failed on chunk {jobs[0].number}: {e}", Err.INTERNAL))]
        done = time.monotonic()
        m = self.metrics
        m["chunks"].increment(len(jobs))
        m["calls"].increment(1)
        m["queue"].increment(sum(start - j.queued for j in jobs))
        m["decode"].increment(done - start)
        m["late"].increment(sum(max(0.0, done - d) for d in deadlines))
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("WAVEFORM", a), pb_utils.Tensor("CHUNK_INDEX", j.index)]) for j, a in zip(jobs, audio)]

    def finalize(self) -> None:
        """Decode what is queued, then stop."""
        self.queue.close()
        self.thread.join(timeout=60)
        if self.cores is not None:
            self.cores.close(unlink=True)     # whichever of llm and vocoder stops last finds it gone
