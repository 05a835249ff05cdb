"""velocity: a paged-KV-cache, continuous-batching LLM engine for ChatTTS-family models."""

__version__ = "0.1.0"

from velocity.config import EngineConfig  # noqa: E402
from velocity.engine.async_engine import AsyncLLMEngine  # noqa: E402
from velocity.engine.llm_engine import LLMEngine, RequestOutput  # noqa: E402
from velocity.llm import LLM  # noqa: E402
from velocity.sampling.params import SamplingParams  # noqa: E402

__all__ = ["LLM", "AsyncLLMEngine", "EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "__version__"]
