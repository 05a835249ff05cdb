"""Triton adapter: velocity's AsyncLLMEngine streaming ChatTTS audio codes in chunks.

The engine loop runs on its own thread; each request's frames are cut into vocoder chunks
(velocity.tts.streaming.FrameChunker) and sent as they are ready, with the GPT's hidden state
per frame (HIDDEN) on the Decoder path (DECODER "hidden", the default). Sentences of one request
are generated in order with one speaker; each is its own utterance, whose last chunk is marked
LAST. Every request ends with the final flag, errors too.
"""
import logging
import threading
import time

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from velocity import AsyncLLMEngine, EngineConfig, SamplingParams
from velocity.serving.core_share import CoreBoard, ThreadLender, board_path
from velocity.serving.drain import Drain
from velocity.serving.requests import (STREAM_BUSY, STREAM_DRAINING, STREAM_FAILED, STREAM_SHUTTING_DOWN,
                                      decoder_input, llm_inputs)
from velocity.serving.settings import Settings
from velocity.tts.streaming import FRAMES_PER_SECOND, FrameChunker
from velocity.engine.worker import resolve_device

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger("velocity.llm")


class Stream:
    """One Triton request: its sentences, chunker and response sender."""

    def __init__(self, model, request, sentences, speaker, params, hidden: bool) -> None:
        self.model, self.request, self.sender = model, request, request.get_response_sender()
        self.sentences, self.speaker, self.params = sentences, speaker, params
        self.hidden = hidden                     # the Decoder path: chunks carry hidden states
        s = model.settings
        self.chunker = FrameChunker(s.schedule, s.left_context, s.lookahead)
        self.sentence = 0
        self.rid = ""
        self.done = False
        self.stop_code: int | None = None       # set by another thread: end with this STREAM_* code
        self.t0 = time.monotonic()
        self.first_chunk_at: float | None = None

    def start_sentence(self) -> None:
        self.rid = f"{id(self)}-{self.sentence}"
        self.model.engine.add_request(self.rid, self.sentences[self.sentence], self.params, self.on_output,
                                      speaker=self.speaker, return_hidden=self.hidden)

    def send_chunks(self, chunks) -> None:
        if chunks and self.first_chunk_at is None:
            self.first_chunk_at = time.monotonic()
            self.model.metrics["ttfa"].observe(self.first_chunk_at - self.t0)
        for c in chunks:
            send_chunk(self.sender, np.asarray(c.codes, np.int32).T[None], c.context, c.length, c.index,
                       None if c.hidden is None else np.stack(c.hidden)[None], c.last)

    def stop(self, code: int) -> None:
        """From any thread: end this stream with a STREAM_* error code at its next output."""
        self.stop_code = code
        self.model.engine.abort(self.rid)        # a waiting sequence has no next output: make one

    def end(self, code: int | None = None) -> None:
        """Send the final flag; with a STREAM_* code, on an error chunk."""
        if self.done:
            return
        self.done = True
        try:
            if code is not None:
                send_error(self.sender, code, self.model.num_vq)
            else:
                self.sender.send(flags=FINAL)
                frames = self.chunker.total
                if frames:
                    self.model.metrics["rtf"].observe((time.monotonic() - self.t0) / (frames / FRAMES_PER_SECOND))
        finally:                                 # a sender that fails must not keep the slot
            self.model.streams.pop(id(self), None)

    def on_output(self, out) -> None:            # on the engine thread
        try:
            if self.done:
                return
            if self.request.is_cancelled() or self.stop_code is not None:
                if not out.finished:
                    self.model.engine.abort(self.rid)
                self.end(self.stop_code)
                return
            end_code = self.model.end_code
            keep = [i for i, f in enumerate(out.new_token_ids) if end_code not in f]
            if keep:
                self.model.metrics["frames"].increment(len(keep))
            self.send_chunks(self.chunker.push([out.new_token_ids[i] for i in keep],
                                               None if out.new_hidden is None else out.new_hidden[keep]))
            if not out.finished:
                return
            if out.error:
                log.error("request %s failed: %s", self.rid, out.error)
                self.end(STREAM_FAILED)
            elif out.finish_reason == "abort":
                self.end()
            else:
                self.send_chunks(self.chunker.finish())          # the sentence is one utterance
                if self.sentence + 1 < len(self.sentences):
                    self.sentence += 1
                    self.start_sentence()
                else:
                    self.end()
        except Exception:                        # never leave a client hanging
            log.exception("stream %s failed", self.rid)
            self.model.engine.abort(self.rid)
            self.end(STREAM_FAILED)


NO_HIDDEN = np.zeros((1, 0, 0), np.float32)      # the codes path: the vocoder decodes CODES


def send_chunk(sender, codes: np.ndarray, context: int, length: int, index: int, hidden: np.ndarray | None = None,
               last: bool = False, flags: int = 0) -> None:
    """One chunk: codes [1, num_vq, T], of which `length` frames after `context` are new; hidden
    [1, T, H] on the Decoder path; last: it ends its utterance."""
    i32 = lambda v: np.array([[v]], np.int32)  # noqa: E731
    sender.send(pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor("CODES", codes), pb_utils.Tensor("CONTEXT", i32(context)),
        pb_utils.Tensor("LENGTH", i32(length)), pb_utils.Tensor("CHUNK_INDEX", i32(index)),
        pb_utils.Tensor("HIDDEN", NO_HIDDEN if hidden is None else hidden.astype(np.float32, copy=False)),
        pb_utils.Tensor("LAST", i32(int(last)))]), flags=flags)


def send_failure(sender, message: str, code) -> None:
    """An error response that ends a request the llm did not start (direct callers only)."""
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)


def send_error(sender, code: int, num_vq: int) -> None:
    """End a stream with an error chunk (LENGTH 0, CHUNK_INDEX = a STREAM_* code, see
    velocity.serving.requests): the vocoder turns it into the error response."""
    send_chunk(sender, np.zeros((1, num_vq, 1), np.int32), 0, 0, code, flags=FINAL)


FAMILIES: list = []   # a MetricFamily must outlive its metrics


def make_metrics() -> dict:
    MF = pb_utils.MetricFamily
    labels = {"model": "llm"}

    def fam(name, desc, kind, **kw):
        FAMILIES.append(MF(name=name, description=desc, kind=kind))
        return FAMILIES[-1].Metric(labels=labels, **kw)

    return {
        "ttfa": fam("velocity_time_to_first_chunk_seconds", "Request arrival to its first code chunk",
                    MF.HISTOGRAM, buckets=[0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5, 10]),
        "rtf": fam("velocity_request_rtf", "Generation time / audio seconds, per request", MF.HISTOGRAM,
                   buckets=[0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5]),
        "frames": fam("velocity_frames_generated_total", "Audio frames generated", MF.COUNTER),
        "running": fam("velocity_running_sequences", "Sequences in the running batch", MF.GAUGE),
        "waiting": fam("velocity_waiting_sequences", "Sequences waiting or swapped out", MF.GAUGE),
        "kv_used": fam("velocity_kv_blocks_used", "KV cache blocks in use", MF.GAUGE),
        "kv_free": fam("velocity_kv_blocks_free", "KV cache blocks free", MF.GAUGE),
        "preemptions": fam("velocity_preemptions_total", "Sequences preempted", MF.COUNTER),
        "active": fam("velocity_active_requests", "Requests in flight in the llm", MF.GAUGE),
        "lent": fam("velocity_llm_lent_steps_total", "Engine steps run with the idle vocoder's CPU threads too",
                    MF.COUNTER),
        "refused": fam("velocity_refused_requests_total", "Requests refused: server busy or shutting down",
                       MF.COUNTER),
    }


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
        self.metrics = make_metrics()
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
            send_error(request.get_response_sender(), refusal, self.num_vq)
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
        self.drain.done()
        if self.cores is not None:
            self.cores.close(unlink=True)
