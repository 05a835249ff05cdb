"""The one place serving is configured: environment variables (set by scripts/serve.sh or the
Docker image) with these defaults."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

from velocity.tts.streaming import ChunkSchedule


@dataclass(slots=True)
class Settings:
    weights: str = "checkpoints/demo-tiny"   # VELOCITY_WEIGHTS: a ChatTTS release folder
    device: str = "auto"                     # VELOCITY_DEVICE: auto (cuda if present), cpu, cuda, cuda:1
    dtype: str = "auto"                      # VELOCITY_DTYPE: auto (bf16 on cuda, fp32 on cpu), float32, ...
    kv_cache_bytes: int = 1 << 30            # VELOCITY_KV_CACHE_BYTES: CPU KV budget
    gpu_memory_utilization: float = 0.85     # VELOCITY_GPU_MEMORY_UTILIZATION
    max_num_seqs: int = 64                   # VELOCITY_MAX_NUM_SEQS
    chunk_first: int = 12                    # VELOCITY_CHUNK_FIRST: frames in the first audio chunk
    chunk_rest: int = 36                     # VELOCITY_CHUNK_REST: frames in later chunks
    lookahead: int = 16                      # VELOCITY_LOOKAHEAD: frames past a chunk before it is cut
    left_context: int = 52                   # VELOCITY_LEFT_CONTEXT: frames of context before a chunk
    max_text_chars: int = 2000               # VELOCITY_MAX_TEXT_CHARS
    max_new_tokens: int = 2048               # VELOCITY_MAX_NEW_TOKENS: upper limit per request

    @classmethod
    def from_env(cls) -> "Settings":
        s = cls()
        for f in fields(cls):
            raw = os.environ.get(f"VELOCITY_{f.name.upper()}")
            if raw is not None:
                try:
                    setattr(s, f.name, type(getattr(s, f.name))(raw))
                except ValueError as e:
                    raise ValueError(f"VELOCITY_{f.name.upper()}={raw!r}: {e}") from e
        return s

    @property
    def schedule(self) -> ChunkSchedule:
        return ChunkSchedule(self.chunk_first, self.chunk_rest)
