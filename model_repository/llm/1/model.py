"""Triton adapter: velocity's AsyncLLMEngine streaming ChatTTS audio codes in chunks.

The engine loop runs on its own thread; each request's frames are cut into vocoder chunks
(velocity.tts.streaming.FrameChunker) and sent as they are ready. Sentences of one request
are generated in order with one speaker. Every request ends with the final flag, errors too.
"""
import logging
import threading
import time

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from velocity import AsyncLLMEngine, EngineConfig, SamplingParams
from velocity.serving.settings import Settings
from velocity.tts.streaming import FrameChunker

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
FRAMES_PER_SECOND = 46.875      # 24000 Hz / 512 samples per frame
log = logging.getLogger("velocity.llm")


class Stream:
    """One Triton request: its sentences, chunker and response sender."""

    def __init__(self, model, request, sentences, speaker, params) -> None:
        self.model, self.request, self.sender = model, request, request.get_response_sender()
        self.sentences, self.speaker, self.params = sentences, speaker, params
        s = model.settings
        self.chunker = FrameChunker(s.schedule, s.left_context, s.lookahead)
        self.sentence = 0
        self.rid = ""
        self.done = False
        self.t0 = time.monotonic()
        self.first_chunk_at: float | None = None

    def start_sentence(self) -> None:
        self.rid = f"{id(self)}-{self.sentence}"
        self.model.engine.add_request(self.rid, self.sentences[self.sentence], self.params, self.on_output,
                                      speaker=self.speaker)

    def send_chunks(self, chunks) -> None:
        if chunks and self.first_chunk_at is None:
            self.first_chunk_at = time.monotonic()
            self.model.metrics["ttfa"].observe(self.first_chunk_at - self.t0)
        for c in chunks:
            codes = np.asarray(c.codes, np.int32).T[None]                      # [1, num_vq, T]
            self.sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("CODES", codes), pb_utils.Tensor("CONTEXT", np.array([[c.context]], np.int32)),
                pb_utils.Tensor("LENGTH", np.array([[c.length]], np.int32)),
                pb_utils.Tensor("CHUNK_INDEX", np.array([[c.index]], np.int32))]))

    def end(self, error: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        if error:
            self.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)), flags=FINAL)
        else:
            self.sender.send(flags=FINAL)
            frames = len(self.chunker.frames)
            if frames:
                self.model.metrics["rtf"].observe((time.monotonic() - self.t0) / (frames / FRAMES_PER_SECOND))
        self.model.streams.pop(id(self), None)

    def on_output(self, out) -> None:            # on the engine thread
        try:
            if self.done:
                return
            if self.request.is_cancelled():
                self.model.engine.abort(self.rid)
                self.end()
                return
            end_code = self.model.end_code
            frames = [f for f in out.new_token_ids if end_code not in f]
            if frames:
                self.model.metrics["frames"].increment(len(frames))
            self.send_chunks(self.chunker.push(frames))
            if not out.finished:
                return
            if out.error:
                self.end(out.error)
            elif out.finish_reason == "abort":
                self.end()
            elif self.sentence + 1 < len(self.sentences):
                self.sentence += 1
                self.start_sentence()
            else:
                self.send_chunks(self.chunker.finish())
                self.end()
        except Exception as e:                   # never leave a client hanging
            log.exception("stream failed")
            self.model.engine.abort(self.rid)
            self.end(f"llm: {e}")


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
    }


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.settings = s = Settings.from_env()
        s.set_threads("llm")
        try:
            self.engine = AsyncLLMEngine(EngineConfig(
                model=s.weights, device=s.device, dtype=s.dtype, kv_cache_bytes=s.kv_cache_bytes,
                gpu_memory_utilization=s.gpu_memory_utilization, max_num_seqs=s.max_num_seqs))
        except Exception as e:
            raise pb_utils.TritonModelException(f"llm: cannot start the engine on {s.weights}: {e}")
        self.end_code = self.engine.engine.worker.model.num_audio_tokens - 1
        self.streams: dict[int, Stream] = {}
        self.metrics = make_metrics()
        self._stop = threading.Event()
        self._gauges = threading.Thread(target=self._update_gauges, daemon=True)
        self._gauges.start()

    def _update_gauges(self) -> None:
        """Engine state as Prometheus gauges, four times a second."""
        seen_preemptions = 0
        while not self._stop.wait(0.25):
            st = self.engine.engine.stats()
            m = self.metrics
            m["running"].set(st.running)
            m["waiting"].set(st.waiting + st.swapped)
            m["kv_used"].set(st.kv_blocks_used)
            m["kv_free"].set(st.kv_blocks_free)
            if st.preemptions > seen_preemptions:
                m["preemptions"].increment(st.preemptions - seen_preemptions)
                seen_preemptions = st.preemptions

    def execute(self, requests: list) -> None:
        for request in requests:
            self._start(request)
        return None

    def _start(self, request) -> None:
        get = lambda n: pb_utils.get_input_tensor_by_name(request, n).as_numpy()  # noqa: E731
        try:
            ids = get("TOKEN_IDS").reshape(-1).tolist()
            lengths = get("SENTENCE_LENGTHS").reshape(-1).tolist()
            if sum(lengths) != len(ids) or not lengths or min(lengths) < 1:
                raise ValueError(f"SENTENCE_LENGTHS {lengths} do not split {len(ids)} TOKEN_IDS")
            bounds = np.cumsum([0] + lengths)
            sentences = [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
            spk = get("SPEAKER_VECTOR").reshape(-1)
            speaker = torch.from_numpy(spk.copy()) if spk.size else None
            (temp, top_p, rep), (top_k, max_new, seed) = get("PARAMS_F").reshape(-1), get("PARAMS_I").reshape(-1)
            params = SamplingParams(temperature=float(temp), top_p=float(top_p), top_k=int(top_k),
                                    repetition_penalty=float(rep), max_new_tokens=int(max_new),
                                    seed=None if seed < 0 else int(seed))
            stream = Stream(self, request, sentences, speaker, params)
            self.streams[id(stream)] = stream
            stream.start_sentence()
        except Exception as e:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse(
                error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)), flags=FINAL)

    def finalize(self) -> None:
        self._stop.set()
        self.engine.shutdown()               # aborts in-flight requests; their streams end with the final flag
        for stream in list(self.streams.values()):
            stream.end("server shutting down")
