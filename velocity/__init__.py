"""velocity: a paged-KV-cache, continuous-batching LLM engine for ChatTTS-family models."""

__version__ = "0.1.0"
