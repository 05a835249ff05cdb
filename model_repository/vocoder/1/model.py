"""Triton adapter: DVAE + Vocos on one chunk (velocity.tts.streaming.AudioDecoder). Stateless.

execute() only queues: a decode thread takes chunks earliest deadline first
(velocity.serving.chunk_queue) and answers each as soon as it is decoded, through the
request's response sender (one response with the final flag: allowed in default mode since
Triton 24.06). So a new stream's first chunk does not wait behind a batch of later chunks.
"""
import contextlib
import logging
import threading
import time

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from velocity.serving.chunk_queue import ChunkQueue
from velocity.serving.core_share import CoreBoard, board_path
from velocity.serving.requests import stream_error
from velocity.serving.settings import Settings
from velocity.tts.audio_models import load_dvae, load_vocos
from velocity.tts.streaming import FRAMES_PER_SECOND, AudioDecoder
from velocity.worker.worker import resolve_device

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger("vocoder")
FAMILIES: list = []   # a MetricFamily must outlive its metrics


def make_metrics() -> dict:
    MF = pb_utils.MetricFamily
    out = {}
    for key, name, desc in [
            ("chunks", "velocity_vocoder_chunks_total", "Chunks decoded by the vocoder"),
            ("queue", "velocity_vocoder_queue_seconds_total", "Seconds chunks waited in the vocoder's queue"),
            ("decode", "velocity_vocoder_decode_seconds_total", "Seconds spent decoding chunks"),
            ("late", "velocity_vocoder_late_seconds_total", "Seconds chunks were decoded past their deadline")]:
        FAMILIES.append(MF(name=name, description=desc, kind=MF.COUNTER))
        out[key] = FAMILIES[-1].Metric(labels={"model": "vocoder"})
    return out


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.settings = s = Settings.from_env()
        s.set_threads("vocoder")
        try:
            dev = resolve_device(s.device)
            self.decoder = AudioDecoder(load_dvae(s.weights, dev), load_vocos(s.weights, dev))
        except Exception as e:
            raise pb_utils.TritonModelException(f"vocoder: cannot load {s.weights}: {e}")
        self.device = dev
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
            sender = r.get_response_sender()
            get = lambda n: pb_utils.get_input_tensor_by_name(r, n).as_numpy()  # noqa: E731
            # copies: the request's tensors are freed when execute returns. An error chunk
            # (index < 0) is queued too, behind its stream's chunks: answered at once it could
            # overtake them, and one such run left the ensemble request in flight (Triton 2.51)
            chunk_index = get("CHUNK_INDEX").copy()
            work = (chunk_index, get("CODES").astype(np.int64), int(get("CONTEXT").reshape(-1)[0]),
                    int(get("LENGTH").reshape(-1)[0]), sender, time.monotonic())
            self.queue.put(int(chunk_index.reshape(-1)[0]), work)
        return None

    def _decode_loop(self) -> None:
        while (due := self.queue.get_due()) is not None:
            deadline, (chunk_index, codes, ctx, length, sender, queued) = due
            try:
                sender.send(self._decode(chunk_index, codes, ctx, length, queued, deadline), flags=FINAL)
            except Exception:                 # a broken sender must not stop the loop
                log.exception("vocoder: could not answer chunk %s", chunk_index.reshape(-1))

    def _decode(self, chunk_index: np.ndarray, codes: np.ndarray, ctx: int, length: int, queued: float,
                deadline: float):
        Err = pb_utils.TritonError
        index = int(chunk_index.reshape(-1)[0])
        if index < 0:                     # the llm ended or refused the stream: its error code
            msg, unavailable = stream_error(index, self.settings)
            return pb_utils.InferenceResponse(error=Err(msg, Err.UNAVAILABLE if unavailable else Err.INTERNAL))
        if codes.ndim != 3 or not (0 <= ctx and length >= 1 and ctx + length <= codes.shape[-1]):
            return pb_utils.InferenceResponse(error=Err(
                f"CODES {tuple(codes.shape)} does not hold CONTEXT={ctx} + LENGTH={length} frames", Err.INVALID_ARG))
        start = time.monotonic()
        try:
            with self.cores.busy() if self.cores is not None else contextlib.nullcontext():
                audio = self.decoder.decode_chunk(torch.from_numpy(codes).to(self.device), ctx, length)
            audio = audio.float().cpu().numpy()                                    # [1, samples]
        except Exception as e:
            log.exception("vocoder: chunk %d failed", index)
            return pb_utils.InferenceResponse(error=Err(f"vocoder failed on chunk {index}: {e}", Err.INTERNAL))
        done = time.monotonic()
        m = self.metrics
        m["chunks"].increment(1)
        m["queue"].increment(start - queued)
        m["decode"].increment(done - start)
        m["late"].increment(max(0.0, done - deadline))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("WAVEFORM", audio), pb_utils.Tensor("CHUNK_INDEX", chunk_index)])

    def finalize(self) -> None:
        """Decode what is queued, then stop."""
        self.queue.close()
        self.thread.join(timeout=60)
        if self.cores is not None:
            self.cores.close(unlink=True)     # whichever of llm and vocoder stops last finds it gone
