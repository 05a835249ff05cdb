"""Per-request sampling parameters."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    """How one request samples; every field applies to that request alone.

    temperature 0 is greedy (exact argmax). top_k 0 and top_p 1 switch those filters off.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
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

        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            bad("temperature", ">= 0", self.temperature)
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
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "an integer or None", self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
