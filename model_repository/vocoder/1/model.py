"""Triton adapter: one chunk -> its audio (velocity.tts.audio_decoder.AudioDecoder; on CPU a
stream's chunks through its own stateful decoder, velocity.serving.vocoder.stream_decoders).

A chunk with HIDDEN (the GPT's hidden states) goes through the Decoder, one without through the DVAE
from its CODES; then Vocos. LAST: an utterance's last chunk, half a frame (256 samples) shorter.

execute() only queues: a decode thread takes a stream's first chunk first, then the earliest deadline
(velocity.serving.vocoder.chunk_queue), with other queued chunks of the same shape up to VELOCITY_VOCODER_BATCH,
and answers each when decoded (one response with the final flag). Decoupled: a probe of the llm, or
a chunk of a stream whose client left, gets the final flag alone; the stream board carries a client's
cancel, each stream's decoded frames and a failed chunk back to the llm (docs/architecture.md).
"""
import logging
import time

import triton_python_backend_utils as pb_utils

from velocity.serving.boards.core_board import CoreBoard, board_path
from velocity.serving.boards.stream_board import CANCELLED, StreamBoard
from velocity.serving.lifecycle.drain import Relay
from velocity.serving.lifecycle.stub_exit import end_quickly
from velocity.serving.metrics import VOCODER, make_metrics
from velocity.serving.settings import Settings
from velocity.serving.vocoder.jobs import Job, chunk_refusal
from velocity.serving.wire.passed_inputs import input_reader
from velocity.serving.wire.protocol import STREAM_PROBE, CodeChunkIn, read_chunk
# torch and the decoders are imported in initialize: where Triton's auto-complete is on (a
# bare tritonserver; serve.sh turns it off) it runs this file in a stub of its own, which needs none of them

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger("velocity.vocoder")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from velocity.device import resolve_device
        from velocity.serving.vocoder.decode_loop import DecodeLoop
        from velocity.serving.vocoder.stream_decoders import StreamDecoders
        from velocity.tts.audio_decoder import AudioDecoder, default_decode_batch

        self.settings = s = Settings.from_env()
        s.configure_logging()
        end_quickly()                   # no interpreter teardown at unload (velocity.serving.lifecycle.stub_exit)
        s.set_threads("vocoder")
        try:
            dev = resolve_device(s.device)
            self.decoder = AudioDecoder.load(s.weights, dev, s.vocoder_quantize, s.pack_cpu_weights, s.cpu_kernel)
        except Exception as e:
            raise pb_utils.TritonModelException(f"vocoder: cannot load {s.weights}: {e}") from e
        self.cores = None
        if s.lend_vocoder_cores and dev.type == "cpu":     # tell the llm when this one decodes
            self.cores = CoreBoard(board_path(s.run_dir))
            self.cores.claim()
        self.board, self.relay = StreamBoard(board_path(s.run_dir, "streams")), Relay(s.run_dir)
        self.metrics = make_metrics(pb_utils, "vocoder", VOCODER).start(name="vocoder")   # sent by a timer
        self.streams = StreamDecoders(self.decoder, s.max_concurrent_requests or 1024, s.vocoder_stateful
                                      and dev.type == "cpu", self.metrics["stream_decoders"].set)
        Err = pb_utils.TritonError
        self.loop = DecodeLoop(self.decoder, dev, s.vocoder_batch or default_decode_batch(dev), self.streams,
                               self.board, self.cores, self.metrics,
                               lambda outputs: pb_utils.InferenceResponse(
                                   output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()]),
                               lambda message, code: pb_utils.InferenceResponse(error=Err(message, getattr(Err, code))),
                               self._answer)

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
            self.loop.put(Job(chunk, sender, time.monotonic(), self._refusal(chunk)))
        self.metrics["backlog"].set(len(self.loop.queue))
        return None

    def _refusal(self, c: CodeChunkIn):
        """The error response for a chunk that is not to be decoded, or None."""
        d, Err = self.decoder, pb_utils.TritonError
        why = chunk_refusal(c, self.settings, d.num_vq, d.num_codes, d.hidden_size)
        return None if why is None else pb_utils.InferenceResponse(error=Err(why[0], getattr(Err, why[1])))

    def _answer(self, job: Job, response) -> None:
        """The job's response with the final flag (None: the final flag alone)."""
        try:
            job.sender.send(flags=FINAL) if response is None else job.sender.send(response, flags=FINAL)
        except Exception:                         # a broken sender must not stop the loop
            log.exception("vocoder: could not answer chunk %d", job.chunk.number)
        self.relay.answered(job.chunk.number)

    def finalize(self) -> None:
        """Decode what is queued, then stop."""
        self.loop.close()
        self.metrics.close()
        self.board.close_file(unlink=True)
        if self.cores is not None:
            self.cores.close(unlink=True)     # whichever of llm and vocoder stops last finds it gone
