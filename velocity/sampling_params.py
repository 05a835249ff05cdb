"""Per-request sampling parameters."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    """How one request samples; every field applies to that request alone.

    temperature 0 is greedy (exact argmax); for audio frames it may be a list, one per
    codebook. top_k 0 and top_p 1 switch those filters off. repetition_window N applies
    ChatTTS's rule (each occurrence in the last N generated tokens penalised again, per
    codebook); None takes the head's default: 16 frames for ChatTTS audio, and for text
    transformers' rule (every earlier token, prompt included, penalised once).
    """

    temperature: float | list[float] = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    repetition_window: int | None = None
    seed: int | None = None
    max_new_tokens: int = 256
    min_new_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the parameter and its allowed range."""
        def bad(name: str, allowed: str, value: object) -> None:
            raise ValueError(f"{name} must be {allowed}, got {value!r}")

        temps = self.temperature if isinstance(self.temperature, (list, tuple)) else [self.temperature]
        if not temps or not all(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in temps):
            bad("temperature", ">= 0 (one value, or one per codebook)", self.temperature)
        if isinstance(self.temperature, (list, tuple)) and len(set(t == 0 for t in temps)) > 1:
            bad("temperature", "all zero (greedy) or all above zero", self.temperature)
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            bad("top_p", "in (0, 1]", self.top_p)
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            bad("top_k", "an integer >= 0 (0 = off)", self.top_k)
        if not (isinstance(self.repetition_penalty, (int, float)) and math.isfinite(self.repetition_penalty)
                and self.repetition_penalty > 0):
            bad("repetition_penalty", "> 0", self.repetition_penalty)
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            bad("max_new_tokens", "an integer >= 1", self.max_new_tokens)
        if not (isinstance(self.min_new_tokens, int) and 0 <= self.min_new_tokens <= self.max_new_tokens):
            bad("min_new_tokens", f"an integer in [0, max_new_tokens={self.max_new_tokens}]", self.min_new_tokens)
        if self.repetition_window is not None and not (isinstance(self.repetition_window, int)
                                                       and self.repetition_window >= 1):
            bad("repetition_window", "None or an integer >= 1", self.repetition_window)
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "an integer or None", self.seed)

    @property
    def greedy(self) -> bool:
        t = self.temperature
        return (t[0] if isinstance(t, (list, tuple)) else t) == 0

    def stops(self, head_stop_ids) -> frozenset[int]:
        """The tokens that end the request: its stop_token_ids, and the head's unless ignore_eos."""
        return frozenset(self.stop_token_ids) | (frozenset() if self.ignore_eos else frozenset(head_stop_ids))

    def temperatures(self, k: int) -> list[float]:
        """One temperature per codebook."""
        t = self.temperature
        if isinstance(t, (list, tuple)):
            if len(t) != k:
                raise ValueError(f"temperature has {len(t)} values; the model has {k} codebooks")
            return [float(x) for x in t]
        return [float(t)] * k


def refine_params(temperature: float = 0.7, top_p: float = 0.7, top_k: int = 20, repetition_penalty: float = 1.0,
                  max_new_tokens: int = 384, seed: int | None = None) -> SamplingParams:
    """The reference's (chattts==0.2.5) text-refine sampling defaults (its RefineTextParams)."""
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=repetition_penalty,
                          max_new_tokens=max_new_tokens, seed=seed)


def chattts_params(temperature: float = 0.3, top_p: float = 0.7, top_k: int = 20, repetition_penalty: float = 1.05,
                   max_new_tokens: int = 2048, seed: int | None = None) -> SamplingParams:
    """The reference's (chattts==0.2.5) audio sampling defaults; the one place they are written."""
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=repetition_penalty,
                          max_new_tokens=max_new_tokens, seed=seed)
