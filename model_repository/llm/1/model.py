"""Triton adapter: velocity's AsyncLLMEngine streaming ChatTTS audio in chunks.

Each request is a velocity.tts.streaming.SentenceStream (sentences in order, one speaker, each
its own utterance); its chunks leave as the tensors of velocity.serving.protocol, with the GPT's
hidden states on the Decoder path (DECODER "hidden", the default). The engine loop runs on its
own thread and only queues responses; a response thread sends them, as Triton's vllm_backend
does. Every request ends with the final flag, errors too.
"""
import logging
import queue
import threading
import time

import torch
import triton_python_backend_utils as pb_utils

from velocity import AsyncLLMEngine, EngineConfig, SamplingParams
from velocity.serving.core_share import CoreBoard, ThreadLender, board_path
from velocity.serving.drain import Drain
from velocity.serving.metrics import LLM, make_metrics
from velocity.serving.protocol import (STREAM_BUSY, STREAM_DRAINING, STREAM_FAILED, STREAM_SHUTTING_DOWN,
                                       chunk_outputs, error_outputs)
from velocity.serving.requests import decoder_input, llm_inputs
from velocity.serving.settings import Settings
from velocity.tts.streaming import FRAMES_PER_SECOND, FrameChunker, SentenceStream
from velocity.engine.worker import resolve_device

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger("velocity.llm")


class Stream:
    """One Triton request: its SentenceStream, sampling, speaker and response sender."""

    def __init__(self, model, request, sentences, speaker, params, hidden: bool) -> None:
        self.model, self.request, self.sender = model, request, request.get_response_sender()
        self.speaker, self.params, self.hidden = speaker, params, hidden
        s = model.settings
        self.sentences = SentenceStream(sentences, FrameChunker(s.schedule, s.left_context, s.lookahead),
                                        model.end_code)
        self.rid = ""
        self.done = False
        self._lock = threading.Lock()
        self.stop_code: int | None = None       # set by another thread: end with this STREAM_* code
        self.t0 = time.monotonic()
        self.first_chunk_at: float | None = None

    def start_sentence(self) -> None:
        self.rid = f"{id(self)}-{self.sentences.sentence}"
        self.model.engine.add_request(self.rid, self.sentences.prompt, self.params, self.on_output,
                                      speaker=self.speaker, return_hidden=self.hidden)

    def send_chunks(self, chunks) -> None:
        if chunks and self.first_chunk_at is None:
            self.first_chunk_at = time.monotonic()
            self.model.metrics["ttfa"].observe(self.first_chunk_at - self.t0)
        for c in chunks:
            self.model.respond(self, chunk_outputs(c))

    def stop(self, code: int) -> None:
        """From any thread: end this stream with a STREAM_* error code at its next output."""
        self.stop_code = code
        self.model.engine.abort(self.rid)        # a waiting sequence has no next output: make one

    def end(self, code: int | None = None) -> None:
        """Queue the final flag (with a STREAM_* code, on an error chunk); once, from any thread."""
        with self._lock:
            if self.done:
                return
            self.done = True
        if code is not None:
            self.model.respond(self, error_outputs(code, self.model.num_vq), final=True)
            return
        self.model.respond(self, None, final=True)
        frames = self.sentences.chunker.total
        if frames:
            self.model.metrics["rtf"].observe((time.monotonic() - self.t0) / (frames / FRAMES_PER_SECOND))

    def on_output(self, out) -> None:            # on the engine thread
        try:
            if self.done:
                return
            if self.request.is_cancelled() or self.stop_code is not None:
                if not out.finished:
                    self.model.engine.abort(self.rid)
                self.end(self.stop_code)
                return
            before = self.sentences.chunker.total
            self.send_chunks(self.sentences.feed(out))
            if (n := self.sentences.chunker.total - before) > 0:
                self.model.metrics["frames"].increment(n)
            if not out.finished:
                return
            if out.error:
                log.error("request %s failed: %s", self.rid, out.error)
                self.end(STREAM_FAILED)
            elif out.finish_reason == "abort":
                self.end()
            elif self.sentences.done:
                self.end()
            else:
                self.start_sentence()
        except Exception:                        # never leave a client hanging
            log.exception("stream %s failed", self.rid)
            self.model.engine.abort(self.rid)
            self.end(STREAM_FAILED)


def send_failure(sender, message: str, code) -> None:
    """An error response that ends a request the llm did not start (direct callers only)."""
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)


def response(outputs: dict) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.settings = s = Settings.from_env()
        own = s.set_threads("llm")
        self.lender, self.cores = None, None
        try:
            if s.lend_vocoder_cores and resolve_device(s.device).type == "cpu":
                # all cores while no vocoder decodes (velocity.serving.core_share)
                self.cores = CoreBoard(board_path(s.run_dir))
                self.lender = ThreadLender(self.cores, own, s.threads_lent(own), torch.set_num_threads)
            self.engine = AsyncLLMEngine(EngineConfig(
                model=s.weights, device=s.device, dtype=s.dtype, kv_cache_bytes=s.kv_cache_bytes,
                gpu_memory_utilization=s.gpu_memory_utilization, max_num_seqs=s.max_num_seqs,
                pack_cpu_weights=bool(s.pack_cpu_weights)), before_step=self.lender)
        except Exception as e:
            raise pb_utils.TritonModelException(f"llm: cannot start the engine on {s.weights}: {e}") from e
        self.end_code = self.engine.engine.worker.model.num_audio_tokens - 1
        self.num_vq = self.engine.engine.worker.model.num_vq
        self.streams: dict[int, Stream] = {}
        self.metrics = make_metrics(pb_utils, "llm", LLM)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._responder = threading.Thread(target=self._respond_loop, name="llm-responses", daemon=True)
        self._responder.start()
        self.drain = Drain(s.run_dir)
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch, daemon=True)
        self._monitor.start()

    def _watch(self) -> None:
        """Four times a second: engine state as Prometheus gauges, and serve.sh's drain request."""
        seen_preemptions = seen_lent = 0
        while not self._stop.wait(0.25):
            if self.drain.poll():
                if self.drain.expired():
                    for stream in list(self.streams.values()):
                        if stream.stop_code is None:
                            stream.stop(STREAM_SHUTTING_DOWN)
                if not self.streams:
                    self.drain.done()
            st = self.engine.engine.stats()
            m = self.metrics
            m["running"].set(st.running)
            m["waiting"].set(st.waiting + st.swapped)
            m["kv_used"].set(st.kv_blocks_used)
            m["kv_free"].set(st.kv_blocks_free)
            m["active"].set(len(self.streams))
            if st.preemptions > seen_preemptions:
                m["preemptions"].increment(st.preemptions - seen_preemptions)
                seen_preemptions = st.preemptions
            if self.lender is not None and self.lender.lent_steps > seen_lent:
                lent = self.lender.lent_steps
                m["lent"].increment(lent - seen_lent)
                seen_lent = lent

    def respond(self, stream: Stream, outputs: dict | None, final: bool = False) -> None:
        """Queue a response of the stream (None: only the final flag) for the response thread."""
        self.outbox.put((stream, outputs, FINAL if final else 0))

    def _respond_loop(self) -> None:
        """Send queued responses in order; a stream's slot is free once its final flag is sent."""
        while (item := self.outbox.get()) is not None:
            stream, outputs, flags = item
            try:
                if outputs is None:
                    stream.sender.send(flags=flags)
                else:
                    stream.sender.send(response(outputs), flags=flags)
            except Exception:                    # a broken sender must not stop the others
                log.exception("llm: could not send a response of %s", stream.rid)
            finally:
                if flags:
                    self.streams.pop(id(stream), None)

    def execute(self, requests: list) -> None:
        for request in requests:
            self._start(request)
        return None

    def _refusal(self) -> int | None:
        if self.drain.draining:
            return STREAM_DRAINING
        limit = self.settings.max_concurrent_requests
        return STREAM_BUSY if limit and len(self.streams) >= limit else None

    def _start(self, request) -> None:
        """Refuse, reject or start one request; every path ends it or leaves it in self.streams."""
        if refusal := self._refusal():
            self.metrics["refused"].increment(1)
            request.get_response_sender().send(response(error_outputs(refusal, self.num_vq)), flags=FINAL)
            return
        try:
            sentences, speaker, params, hidden = self._parse(request)
        except ValueError as e:                  # what the caller sent
            send_failure(request.get_response_sender(), str(e), pb_utils.TritonError.INVALID_ARG)
            return
        except Exception as e:                   # our fault
            log.exception("llm: could not read a request")
            send_failure(request.get_response_sender(), f"llm: internal error ({e}); see the server log",
                         pb_utils.TritonError.INTERNAL)
            return
        stream = Stream(self, request, sentences, speaker, params, hidden)
        self.streams[id(stream)] = stream
        try:
            stream.start_sentence()
        except Exception:                        # checked above, so our fault: end it, free its slot
            log.exception("llm: could not start stream %s", stream.rid)
            stream.end(STREAM_FAILED)

    def _parse(self, request) -> tuple[list, torch.Tensor | None, SamplingParams, bool]:
        """The request's sentences, speaker, sampling and whether it takes the Decoder path,
        checked as the engine will check them."""
        def get(name):
            t = pb_utils.get_input_tensor_by_name(request, name)
            return None if t is None else t.as_numpy()

        sentences, spk, params = llm_inputs(get, self.settings.max_new_tokens)
        engine = self.engine.engine
        for i, ids in enumerate(sentences):
            try:
                engine.validate(ids, params)
            except ValueError as e:
                raise ValueError(f"TOKEN_IDS, sentence {i}: {e}") from e
        speaker = None if spk is None else torch.from_numpy(spk)
        if speaker is not None:
            try:
                engine.worker.model.check_speaker(speaker)
            except ValueError as e:
                raise ValueError(f"SPEAKER_VECTOR: {e}") from e
        return sentences, speaker, params, decoder_input(get("DECODER")) == "hidden"

    def finalize(self) -> None:
        self._stop.set()
        self.engine.shutdown()               # aborts in-flight requests; their streams end with the final flag
        for stream in list(self.streams.values()):
            stream.end(STREAM_SHUTTING_DOWN)
        self.outbox.put(None)                # send what is queued, then stop
        self._responder.join(timeout=30)
        self.drain.done()
        if self.cores is not None:
            self.cores.close(unlink=True)
