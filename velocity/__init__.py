"""velocity: a paged-KV-cache, continuous-batching LLM engine for ChatTTS-family models.

The public names are imported lazily, so `velocity.engine.block_manager` and
`velocity.engine.scheduler` can be used (and tested) without importing torch.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "velocity.llm",
    "AsyncLLMEngine": "velocity.engine.async_engine",
    "EngineConfig": "velocity.config",
    "LLMEngine": "velocity.engine.llm_engine",
    "RequestOutput": "velocity.engine.llm_engine",
    "SamplingParams": "velocity.sampling_params",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'velocity' has no attribute {name!r}")
