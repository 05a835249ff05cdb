"""Text -> speech in one process: front end, velocity engine, DVAE + Vocos. The serving models
are thin adapters over these same pieces; this is also the in-process baseline for benchmarks."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from velocity.config import EngineConfig
from velocity.engine.llm_engine import LLMEngine
from velocity.sampling.params import SamplingParams
from velocity.tts.audio_models import load_dvae, load_vocos
from velocity.tts.frontend import DEFAULT_PROMPT, TextFrontend
from velocity.tts.speaker import decode_speaker, random_speaker
from velocity.tts.streaming import AudioDecoder, ChunkSchedule, StreamingDecoder

logger = logging.getLogger(__name__)
SAMPLE_RATE = 24000


def chattts_params(temperature: float = 0.3, top_p: float = 0.7, top_k: int = 20, repetition_penalty: float = 1.05,
                   max_new_tokens: int = 2048, seed: int | None = None) -> SamplingParams:
    """The reference's audio sampling defaults."""
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=repetition_penalty,
                          max_new_tokens=max_new_tokens, seed=seed)


@dataclass
class Chunk:
    index: int
    audio: np.ndarray          # float32, 24 kHz


class TTSPipeline:
    """synthesize(text) -> waveform; stream(text) yields chunks as frames are generated."""

    def __init__(self, folder: str | Path, device: str = "auto", schedule: ChunkSchedule = ChunkSchedule(),
                 lookahead: int | None = None, **engine_kwargs) -> None:
        self.frontend = TextFrontend(folder)
        self.engine = LLMEngine(EngineConfig(model=str(folder), device=device, **engine_kwargs))
        dev = self.engine.worker.device
        self.decoder = AudioDecoder(load_dvae(folder, dev), load_vocos(folder, dev))
        self.schedule, self.lookahead = schedule, lookahead
        self._n = 0

    def speaker_vector(self, speaker: str | int | None) -> torch.Tensor | None:
        """A release speaker string, a seed for a random speaker, or None for no speaker."""
        dim = self.engine.worker.model.config.hidden_size
        if speaker is None:
            return None
        if isinstance(speaker, int):
            return torch.from_numpy(random_speaker(speaker, dim))
        return torch.from_numpy(decode_speaker(speaker, dim))

    def stream(self, text: str, speaker: str | int | None = None, prompt: str = DEFAULT_PROMPT,
               params: SamplingParams | None = None) -> Iterator[Chunk]:
        """Sentences in order, one speaker; audio chunks as soon as each is decodable."""
        params = params or chattts_params()
        spk = self.speaker_vector(speaker)
        sentences, report = self.frontend.encode(text, speaker=spk is not None, prompt=prompt)
        if report.unknown_tokens:
            logger.warning("ignored unknown tokens %s", report.unknown_tokens)
        sd = StreamingDecoder(self.decoder, self.schedule, lookahead=self.lookahead)
        for s in sentences:
            self._n += 1
            rid = f"pipeline-{self._n}"
            self.engine.add_request(rid, s.token_ids, params, speaker=spk)
            while rid in self.engine.requests:
                for out in self.engine.step():
                    if out.request_id != rid:
                        continue
                    frames = [f for f in out.new_token_ids if self.engine.worker.model.num_audio_tokens - 1 not in f]
                    for i, audio in sd.push(frames):
                        yield Chunk(i, audio.cpu().numpy())
        for i, audio in sd.push([], final=True):
            yield Chunk(i, audio.cpu().numpy())

    def synthesize(self, text: str, **kwargs) -> np.ndarray:
        chunks = list(self.stream(text, **kwargs))
        return np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
