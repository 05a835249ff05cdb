"""Triton adapter: one chunk -> its audio (velocity.tts.audio_decoder.AudioDecoder). Stateless.

A chunk with HIDDEN (the GPT's hidden states, the default Decoder path) is decoded by the
Decoder, one without by the DVAE from its CODES; then Vocos. LAST marks an utterance's last
chunk, whose audio is half a frame (256 samples) shorter, as the reference's whole decode.

execute() only queues: a decode thread takes chunks earliest deadline first
(velocity.serving.chunk_queue), with other queued chunks of the same length up to
VELOCITY_VOCODER_BATCH (one call for all: on a GPU it costs about what one chunk does), and
answers each as soon as it is decoded, through the request's response sender (one response
with the final flag). So a new stream's first chunk does not wait behind a batch of later chunks.

Decoupled, so that a chunk may also get no response at all, only the final flag: a probe of the
llm (see velocity.serving.protocol), and a chunk of a stream whose client has left. A chunk
request that Triton marks cancelled (the client left the `tts` ensemble) marks its stream on the
stream board, where the llm sees it and aborts the stream; queued chunks of a stream that is no
longer live are not decoded. Each decoded chunk advances its stream's decoded frames there (the
llm's backpressure). Triton 2.51 leaves an ensemble request in flight for ever when a step
answers with an error after data unless that error answers the llm's final response, so a chunk
that fails to decode is not answered with its error: the stream is marked FAILED and the llm
ends it with an error chunk (its final response), which is answered with the error.
"""
import contextlib
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from velocity.serving.chunk_queue import ChunkQueue
from velocity.serving.core_board import CoreBoard, board_path
from velocity.serving.metrics import VOCODER, make_metrics
from velocity.serving.protocol import STREAM_PROBE, ChunkIn, chunk_problem, read_chunk, stream_error
from velocity.serving.requests import input_reader
from velocity.serving.settings import Settings
from velocity.serving.stub_exit import end_quickly
from velocity.serving.stream_board import CANCELLED, FAILED, StreamBoard
# torch and the decoders are imported in initialize: Triton's auto-complete step also runs this
# file, in a stub of its own, and needs none of them

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger("velocity.vocoder")


@dataclass(slots=True)
class Job:
    """One queued chunk request."""
    chunk: ChunkIn
    sender: object
    queued: float
    error: object = None              # a response that answers it without decoding


def same_shape(job: Job) -> tuple | None:
    """Jobs decodable in one call share this (path and shape); a refused job goes alone."""
    return None if job.error is not None else (job.chunk.hidden is None, job.chunk.x.shape[1:])


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from velocity.device import resolve_device
        from velocity.model.audio_models import load_decoder, load_dvae, load_vocos
        from velocity.tts.audio_decoder import AudioDecoder, default_decode_batch

        self.settings = s = Settings.from_env()
        s.configure_logging()
        end_quickly()                   # no interpreter teardown at unload (velocity.serving.stub_exit)
        s.set_threads("vocoder")
        try:
            dev = resolve_device(s.device)
            self.decoder = AudioDecoder(load_dvae(s.weights, dev), load_vocos(s.weights, dev),
                                        load_decoder(s.weights, dev))
            if n := self.decoder.quantize(s.vocoder_quantize, pack=bool(s.pack_cpu_weights)):
                log.info("vocoder: %d ConvNeXt linears on %s weights", n,
                         "int8" if s.vocoder_quantize == "int8" else "oneDNN-prepacked")
        except Exception as e:
            raise pb_utils.TritonModelException(f"vocoder: cannot load {s.weights}: {e}") from e
        self.device = dev
        self.batch = s.vocoder_batch or default_decode_batch(dev)
        self.cores = None
        if s.lend_vocoder_cores and dev.type == "cpu":     # tell the llm when this one decodes
            self.cores = CoreBoard(board_path(s.run_dir))
            self.cores.claim()
        self.board = StreamBoard(board_path(s.run_dir, "streams"))
        # a chunk is due once the audio before it (START frames) has played
        self.queue = ChunkQueue(lambda start: start / self.decoder.frames_per_second)
        self.metrics = make_metrics(pb_utils, "vocoder", VOCODER)
        self.thread = threading.Thread(target=self._decode_loop, name="vocoder-decode", daemon=True)
        self.thread.start()

    def execute(self, requests: list) -> None:
        for r in requests:
            chunk, sender = read_chunk(input_reader(r, pb_utils)), r.get_response_sender()
            if chunk.stream and r.is_cancelled():           # the client left: tell the llm
                self.board.mark(chunk.stream, CANCELLED)
                self.metrics["dropped"].increment(int(chunk.number >= 0))
                sender.send(flags=FINAL)
                continue
            if chunk.number == STREAM_PROBE:
                sender.send(flags=FINAL)
                continue
            # An error chunk (index < 0) is queued too, behind its stream's chunks: answered at once
            # it could overtake them, and one such run left the ensemble request in flight (Triton 2.51)
            job = Job(chunk, sender, time.monotonic())
            job.error = self._refusal(chunk)
            self.queue.put(-1 if chunk.number < 0 else chunk.start, job)
        self.metrics["backlog"].set(len(self.queue))
        return None

    def _refusal(self, c: ChunkIn):
        """The error response for a chunk that is not to be decoded, or None."""
        Err = pb_utils.TritonError
        if c.number < 0:                  # the llm ended or refused the stream: its error code
            msg, unavailable = stream_error(c.number, self.settings)
            return pb_utils.InferenceResponse(error=Err(msg, Err.UNAVAILABLE if unavailable else Err.INTERNAL))
        d = self.decoder
        msg = chunk_problem(c, d.num_vq, d.num_codes, d.hidden_size)
        return None if msg is None else pb_utils.InferenceResponse(error=Err(msg, Err.INVALID_ARG))

    def _decode_loop(self) -> None:
        while batch := self.queue.get_due(self.batch, key=same_shape):
            self.metrics["backlog"].set(len(self.queue))
            keep = []
            for deadline, job in batch:
                if job.error is None and self.board.ended(job.chunk.stream):     # its client left
                    self.metrics["dropped"].increment(1)
                    self._answer(job, None)
                else:
                    keep.append((deadline, job))
            if keep:
                jobs = [job for _, job in keep]
                for job, response in zip(jobs, self._decode(jobs, [deadline for deadline, _ in keep])):
                    self._answer(job, response)

    def _answer(self, job: Job, response) -> None:
        """The job's response with the final flag (None: the final flag alone)."""
        try:
            if response is None:
                job.sender.send(flags=FINAL)
            else:
                job.sender.send(response, flags=FINAL)
        except Exception:                         # a broken sender must not stop the loop
            log.exception("vocoder: could not answer chunk %d", job.chunk.number)

    def _decode(self, jobs: list[Job], deadlines: list[float]) -> list:
        """Responses for jobs of one shape (decoded in one call), or for one refused job (None: the
        final flag alone, for a chunk of a stream marked FAILED)."""
        import torch

        if jobs[0].error is not None:
            return [jobs[0].error]
        start = time.monotonic()
        try:
            with self.cores.busy() if self.cores is not None else contextlib.nullcontext():
                audio = self.decoder.decode_chunks([(torch.from_numpy(j.chunk.x).to(self.device), j.chunk.context,
                                                     j.chunk.length, j.chunk.last) for j in jobs], len(jobs))
            audio = [a.float().cpu().numpy() for a in audio]                             # [b, samples] each
        except Exception as e:
            if len(jobs) > 1:             # a failed batch (e.g. out of GPU memory): each chunk on its own
                return [r for j, d in zip(jobs, deadlines) for r in self._decode([j], [d])]
            log.exception("vocoder: chunk %d failed", jobs[0].chunk.number)
            if jobs[0].chunk.stream:      # the llm ends the stream with the error (see the top)
                self.board.mark(jobs[0].chunk.stream, FAILED)
                return [None]
            Err = pb_utils.TritonError
            return [pb_utils.InferenceResponse(error=Err(
                f"vocoder failed on chunk {jobs[0].chunk.number}: {e}", Err.INTERNAL))]
        done = time.monotonic()
        m = self.metrics
        m["chunks"].increment(len(jobs))
        m["calls"].increment(1)
        m["queue"].increment(sum(start - j.queued for j in jobs))
        m["decode"].increment(done - start)
        m["late"].increment(sum(max(0.0, done - d) for d in deadlines))
        for j in jobs:
            self.board.decoded_to(j.chunk.stream, j.chunk.start + j.chunk.length)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("WAVEFORM", a), pb_utils.Tensor("CHUNK_INDEX", j.chunk.index),
            pb_utils.Tensor("TEXT", np.array([[j.chunk.text]], object)),
            pb_utils.Tensor("SENTENCE_INDEX", np.array([[j.chunk.sentence]], np.int32)),
            pb_utils.Tensor("SAMPLE_OFFSET", np.array([[j.chunk.sample_offset(self.decoder.samples_per_frame)]], np.int64)),
            pb_utils.Tensor("SENTENCE_TEXT", np.array([[j.chunk.sentence_text]], object))])
            for j, a in zip(jobs, audio)]

    def finalize(self) -> None:
        """Decode what is queued, then stop."""
        self.queue.close()
        self.thread.join(timeout=60)
        self.board.close_file(unlink=True)
        if self.cores is not None:
            self.cores.close(unlink=True)     # whichever of llm and vocoder stops last finds it gone
