"""Triton adapter: one chunk -> its audio (velocity.tts.audio_decoder.AudioDecoder; on CPU a
stream's chunks through its own stateful decoder, velocity.serving.vocoder_streams).

A chunk with HIDDEN (the GPT's hidden states) goes through the Decoder, one without through the DVAE
from its CODES; then Vocos. LAST: an utterance's last chunk, half a frame (256 samples) shorter.

execute() only queues: a decode thread takes a stream's first chunk first, then the earliest deadline
(velocity.serving.chunk_queue), with other queued chunks of the same shape up to VELOCITY_VOCODER_BATCH,
and answers each when decoded (one response with the final flag). Decoupled: a probe of the llm, or
a chunk of a stream whose client left, gets the final flag alone; the stream board carries a client's
cancel, each stream's decoded frames and a failed chunk back to the llm (docs/architecture.md).
"""
import contextlib
import logging
import threading
import time

import triton_python_backend_utils as pb_utils

from velocity.serving.chunk_queue import ChunkQueue
from velocity.serving.core_board import CoreBoard, board_path
from velocity.serving.metrics import VOCODER, count_decode, make_metrics
from velocity.serving.protocol import STREAM_PROBE, CodeChunkIn, Job, Relay, chunk_refusal, read_chunk, vocoder_outputs
from velocity.serving.passed_inputs import input_reader
from velocity.serving.settings import Settings
from velocity.serving.stub_exit import end_quickly
from velocity.serving.stream_board import CANCELLED, FAILED, StreamBoard
# torch and the decoders are imported in initialize: where Triton's auto-complete is on (a
# bare tritonserver; serve.sh turns it off) it runs this file in a stub of its own, which needs none of them

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger("velocity.vocoder")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from velocity.device import resolve_device
        from velocity.serving.vocoder_streams import StreamDecoders
        from velocity.tts.audio_decoder import AudioDecoder, default_decode_batch

        self.settings = s = Settings.from_env()
        s.configure_logging()
        end_quickly()                   # no interpreter teardown at unload (velocity.serving.stub_exit)
        s.set_threads("vocoder")
        try:
            dev = resolve_device(s.device)
            self.decoder = AudioDecoder.load(s.weights, dev, s.vocoder_quantize, s.pack_cpu_weights, s.cpu_kernel)
        except Exception as e:
            raise pb_utils.TritonModelException(f"vocoder: cannot load {s.weights}: {e}") from e
        self.device = dev
        self.batch = s.vocoder_batch or default_decode_batch(dev)
        self.cores = None
        if s.lend_vocoder_cores and dev.type == "cpu":     # tell the llm when this one decodes
            self.cores = CoreBoard(board_path(s.run_dir))
            self.cores.claim()
        self.board, self.relay = StreamBoard(board_path(s.run_dir, "streams")), Relay(s.run_dir)
        # a chunk is due once the audio before it (START frames) has played
        self.queue = ChunkQueue(lambda start: start / self.decoder.frames_per_second)
        self.metrics = make_metrics(pb_utils, "vocoder", VOCODER).start(name="vocoder")   # sent by a timer
        self.streams = StreamDecoders(self.decoder, s.max_concurrent_requests or 1024, s.vocoder_stateful
                                      and dev.type == "cpu", self.metrics["stream_decoders"].set)
        self.thread = threading.Thread(target=self._decode_loop, name="vocoder-decode", daemon=True)
        self.thread.start()

    def execute(self, requests: list) -> None:
        for r in requests:
            chunk, sender = read_chunk(input_reader(r, pb_utils)), r.get_response_sender()
            if chunk.stream and r.is_cancelled():           # the client left: tell the llm
                self.board.mark(chunk.stream, CANCELLED)
                self.streams.drop(chunk.stream)
                self.metrics["dropped"].increment(int(chunk.number >= 0))
                sender.send(flags=FINAL)
                continue
            if chunk.number == STREAM_PROBE:
                sender.send(flags=FINAL)
                continue
            # An error chunk (index < 0) is queued too, behind its stream's chunks: answered at once
            # it could overtake them, and one such run left the ensemble request in flight (Triton 2.51)
            job = Job(chunk, sender, time.monotonic(), self._refusal(chunk))
            self.queue.put(-1 if chunk.number < 0 else chunk.start, job)
        self.metrics["backlog"].set(len(self.queue))
        return None

    def _refusal(self, c: CodeChunkIn):
        """The error response for a chunk that is not to be decoded, or None."""
        d, Err = self.decoder, pb_utils.TritonError
        why = chunk_refusal(c, self.settings, d.num_vq, d.num_codes, d.hidden_size)
        return None if why is None else pb_utils.InferenceResponse(error=Err(why[0], getattr(Err, why[1])))

    def _decode_loop(self) -> None:
        while batch := self.queue.get_due(self.batch, key=self.streams.batch_key, one_of=self.streams.one_of):
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
            self.streams.sweep(self.board.gone)   # the decoders of streams that are over (left, failed, ended)

    def _answer(self, job: Job, response) -> None:
        """The job's response with the final flag (None: the final flag alone)."""
        try:
            job.sender.send(flags=FINAL) if response is None else job.sender.send(response, flags=FINAL)
        except Exception:                         # a broken sender must not stop the loop
            log.exception("vocoder: could not answer chunk %d", job.chunk.number)
        self.relay.answered(job.chunk.number)

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
            if jobs[0].chunk.stream:      # the llm ends the stream with the error (see the top)
                self.board.mark(jobs[0].chunk.stream, FAILED)
                return [None]
            Err = pb_utils.TritonError
            return [pb_utils.InferenceResponse(error=Err(
                f"vocoder failed on chunk {jobs[0].chunk.number}: {e}", Err.INTERNAL))]
        count_decode(self.metrics, [j.queued for j in jobs], deadlines, start, time.monotonic(), frames,
                     sum(j.chunk.length * j.chunk.x.shape[0] for j in jobs))
        for j in jobs:
            self.board.decoded_to(j.chunk.stream, j.chunk.start + j.chunk.length)
        spf = self.decoder.samples_per_frame
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in
                                                           vocoder_outputs(j.chunk, a, spf).items()])
                for j, a in zip(jobs, audio)]

    def finalize(self) -> None:
        """Decode what is queued, then stop."""
        self.queue.close()
        self.thread.join(timeout=60)
        self.metrics.close()
        self.board.close_file(unlink=True)
        if self.cores is not None:
            self.cores.close(unlink=True)     # whichever of llm and vocoder stops last finds it gone
