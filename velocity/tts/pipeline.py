"""Text -> speech in one process: front end, velocity engine, DVAE + Vocos. The serving models
are thin adapters over these same pieces; this is also the in-process baseline for benchmarks."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from velocity.config import EngineConfig
from velocity.engine.llm_engine import LLMEngine
from velocity.sampling_params import SamplingParams, chattts_params, refine_params  # noqa: F401 (re-exported)
from velocity.tts.frontend import DEFAULT_PROMPT, TextFrontend
from velocity.tts.speaker import decode_sample, decode_speaker, random_speaker, sample_frames
from velocity.tts.audio_decoder import DECODERS, AudioDecoder, default_decode_batch
from velocity.tts.chunking import ChunkSchedule, CodeChunk, FrameChunker
from velocity.tts.stateful_decoder import StatefulDecoder, decode_together
from velocity.tts.sentence_stream import Carry, SentenceStream

logger = logging.getLogger(__name__)


@dataclass
class PipelineChunk:
    """A piece of a text's audio, in order."""
    index: int
    audio: np.ndarray          # float32, 24 kHz
    text: str = ""             # with refine: the refined text of the sentence this chunk begins


@dataclass
class Event:
    """What stream_many reports: a text started, one of its chunks, or its end."""
    text: int                  # index into the texts
    kind: str                  # "start" | "chunk" | "end"
    chunk: PipelineChunk | None = None


@dataclass
class _Text:
    index: int
    stream: SentenceStream
    params: SamplingParams
    hidden: bool                   # the Decoder path: decode the GPT's hidden states, not the codes
    audio: StatefulDecoder | None = None   # its stateful decoder, from its first chunk


class TTSPipeline:
    """synthesize(text) -> waveform; stream(text) yields chunks as frames are generated.

    decoder="hidden" (the default, as the reference's) turns the GPT's hidden states into mel
    with asset/Decoder.safetensors; "codes" decodes the audio codes with the DVAE. Each sentence
    is decoded as its own utterance, as the reference decodes each text."""

    def __init__(self, folder: str | Path, device: str = "auto", schedule: ChunkSchedule = ChunkSchedule(),
                 lookahead: int | None = None, decode_batch: int = 0, sentences_ahead: int = 2,
                 vocoder_quantize: str = "none", stateful_decode: bool = True, **engine_kwargs) -> None:
        """decode_batch: chunks of one step decoded per call (0: `default_decode_batch` of the device).
        stateful_decode: on CPU, each text's chunks through a decoder of its own that keeps each
        layer's input between them (velocity.tts.stateful_decoder: no chunk decodes its left
        context again); off, or on a GPU, which batches chunks across texts: the chunked decode.
        sentences_ahead: sentences generated while the one before them is spoken (0: one by one).
        vocoder_quantize: "int8" for the decoders' int8 linears (AudioDecoder.quantize);
        engine_kwargs go to EngineConfig (quantize="int8" for the GPT's)."""
        self.frontend, self.frontend_folder = TextFrontend(folder), folder
        self.engine = LLMEngine(EngineConfig(model=str(folder), device=device, **engine_kwargs))
        dev = self.engine.device
        cfg = self.engine.config
        self.decoder = AudioDecoder.load(folder, dev, vocoder_quantize, cfg.pack_cpu_weights, cfg.cpu_kernel)
        self.sample_rate = self.decoder.sample_rate                 # Vocos's: 24000 for the release
        self.schedule, self.lookahead = schedule, lookahead
        self.decode_batch = decode_batch or default_decode_batch(dev)
        # the layers each text's stateful decoder shares (None: the chunked decode)
        self.stateful = StatefulDecoder(self.decoder) if stateful_decode and dev.type == "cpu" else None
        self.sentences_ahead = sentences_ahead
        self._n = 0
        self._carrier = None                                        # loaded on the first carry-over

    def carry_plan(self, sentences: list, speaker: bool, prompt: str) -> Carry:
        """Voice carry-over for a text of several sentences (velocity.tts.carry_over)."""
        from velocity.tts.carry_over import VoiceCarrier

        if self._carrier is None:
            self._carrier = VoiceCarrier.load(self.frontend_folder, self.decoder)
        return self._carrier.plan(self.frontend.carried_prompts(sentences, speaker, prompt))

    def speaker_vector(self, speaker: str | int | None) -> torch.Tensor | None:
        """A release speaker string, a seed for a random speaker, or None for no speaker."""
        dim = self.engine.model.config.hidden_size
        if speaker is None:
            return None
        if isinstance(speaker, int):
            return torch.from_numpy(random_speaker(speaker, dim, self.frontend.speaker_stats))
        return torch.from_numpy(decode_speaker(speaker, dim))

    def sample_frames(self, sample: str | np.ndarray | None) -> list[tuple[int, ...]]:
        """A voice sample (its string, or codes [num_vq, T]) -> the frames that follow each prompt."""
        if sample is None:
            return []
        model = self.engine.model
        codes = decode_sample(sample, model.num_vq, model.num_audio_tokens - 1, self.engine.max_model_len) \
            if isinstance(sample, str) else np.asarray(sample)
        return sample_frames(codes)

    def stream(self, text: str, speaker: str | int | None = None, prompt: str = DEFAULT_PROMPT,
               params: SamplingParams | None = None, decoder: str = "hidden", sample: str | np.ndarray | None = None,
               sample_text: str = "", refine: SamplingParams | None = None, refine_prompt: str = "",
               carry_over: bool = False) -> Iterator[PipelineChunk]:
        """Sentences in order, one speaker; audio chunks as soon as each is decodable."""
        for ev in self.stream_many([text], speaker, prompt, params, decoder=decoder, sample=sample,
                                   sample_text=sample_text, refine=refine, refine_prompt=refine_prompt,
                                   carry_over=carry_over):
            if ev.chunk is not None:
                yield ev.chunk

    def stream_many(self, texts: list[str], speaker: str | int | None = None, prompt: str = DEFAULT_PROMPT,
                    params: SamplingParams | Callable[[int], SamplingParams] | None = None,
                    concurrency: int = 1, decoder: str = "hidden", sample: str | np.ndarray | None = None,
                    sample_text: str = "", refine: SamplingParams | None = None, refine_prompt: str = "",
                    carry_over: bool = False) -> Iterator[Event]:
        """Texts through one engine, at most `concurrency` at a time, each its sentences in order
        with one speaker; chunks are decoded in the step loop, a step's chunks of one length
        together (up to decode_batch). params: one for all, or a function of the text's index.
        decoder: "hidden" or "codes" (see the class). sample, sample_text: a voice sample (the
        reference's spk_smp: its string or codes) and its transcript (txt_smp). refine: refine
        each sentence's text first with these sampling parameters (`refine_params()`: the
        reference's), the text head's prompt ending in `refine_prompt`. carry_over: a text of several
        sentences without a sample (and without refine) takes the first sentence's voice for all, as
        the reference's (velocity.tts.carry_over)."""
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        spk = self.speaker_vector(speaker)
        if spk is not None:                    # checked once, reused by every sentence
            spk = self.engine.model.check_speaker(spk)
        end_code = self.engine.model.num_audio_tokens - 1
        frames = self.sample_frames(sample)
        left = self.decoder.exact_context
        todo, live, texts_live = list(range(len(texts))), {}, set()   # live: request id -> (its text, sentence)

        def add(t: _Text) -> None:
            texts_live.add(t.index)
            for j, prompt, sampling, kwargs in t.stream.requests(t.params, spk, t.hidden):
                self._n += 1
                rid = f"pipeline-{self._n}"
                live[rid] = (t, j)
                self.engine.add_request(rid, prompt, sampling, **kwargs)

        try:
            while todo or live:
                while todo and len(texts_live) < concurrency:
                    i = todo.pop(0)
                    yield Event(i, "start")
                    sentences, report = self.frontend.encode(texts[i], speaker=spk is not None, prompt=prompt,
                                                             sample_text=sample_text)
                    if report.unknown_tokens:
                        logger.warning("ignored unknown tokens %s", report.unknown_tokens)
                    p = params(i) if callable(params) else params or chattts_params()
                    chunker = FrameChunker(self.schedule, left, left if self.lookahead is None else self.lookahead)
                    plan = None if refine is None else self.frontend.refine_plan(
                        [self.frontend.refine_prompt(x.text, refine_prompt) for x in sentences], refine,
                        self.frontend.code_prefix(spk is not None, prompt, sample_text), frames)
                    carry = self.carry_plan(sentences, spk is not None, prompt) \
                        if carry_over and not frames and plan is None and len(sentences) > 1 else None
                    t = _Text(i, SentenceStream([x.token_ids + frames for x in sentences], chunker, end_code, plan,
                                                self.sentences_ahead, carry=carry), p, decoder == "hidden")
                    if not t.stream.done:
                        add(t)
                    else:
                        yield Event(i, "end")
                ready: list[tuple[_Text, CodeChunk | None]] = []          # None: the text's end
                for out in self.engine.step():
                    t, j = live[out.request_id]
                    chunks = t.stream.feed(j, out)
                    if (first := t.stream.voicing()) is not None:         # voice carry-over's sample
                        t.stream.voiced(t.stream.carry.sample(*first))
                    ready += [(t, c) for c in chunks]
                    if not out.finished:
                        if chunks:
                            add(t)                 # the sentences ahead start after the first chunk
                        continue
                    del live[out.request_id]
                    if out.finish_reason not in ("stop", "length"):
                        raise RuntimeError(f"text {t.index}: generation ended with {out.finish_reason}: {out.error}")
                    if t.stream.done:
                        texts_live.discard(t.index)
                        ready.append((t, None))
                    else:
                        add(t)
                audio = iter(self._decode(ready))
                for t, c in ready:
                    yield Event(t.index, "end") if c is None else \
                        Event(t.index, "chunk", PipelineChunk(c.index, next(audio)[0].cpu().numpy(), c.text))
        finally:                                    # closed early: free the engine's sequences
            for rid in live:
                self.engine.abort(rid)

    def _decode(self, ready: list[tuple[_Text, CodeChunk | None]]) -> list[torch.Tensor]:
        """The chunks' audio, each [1, samples]: each text's through its stateful decoder, in
        order, the texts' chunks through each layer together (decode_together: a text's next
        chunk in the next call); or all through the chunked decode (a step's chunks of one
        length together)."""
        if self.stateful is None:
            return self.decoder.decode_cut([c for _, c in ready if c], self.decode_batch)
        todo = [(t, c) for t, c in ready if c is not None]
        calls: dict[int, list[int]] = {}                     # a text's n-th chunk here goes in call n
        seen: dict[int, int] = {}                            # chunks so far, by text
        for k, (t, c) in enumerate(todo):
            if t.audio is None:
                t.audio = StatefulDecoder(self.stateful, position=c.start)
            n = seen[id(t)] = seen.get(id(t), -1) + 1
            calls.setdefault(n, []).append(k)
        audio: dict[int, torch.Tensor] = {}                  # by the chunk's place in todo
        for group in calls.values():
            audio.update(zip(group, decode_together([todo[k][0].audio.cut(todo[k][1]) for k in group])))
        return [audio[k] for k in range(len(todo))]

    def synthesize(self, text: str, **kwargs) -> np.ndarray:
        chunks = list(self.stream(text, **kwargs))
        return np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
