"""LLM: offline batch generation over the engine."""
from __future__ import annotations

from dataclasses import fields

from tqdm.auto import tqdm

from velocity.config import EngineConfig
from velocity.engine.llm_engine import LLMEngine, RequestOutput
from velocity.engine.sequence import Token
from velocity.sampling.params import SamplingParams


class LLM:
    """Generate for many prompts at once: LLM(model=..., device="cpu").generate(prompt_token_ids=[...])."""

    def __init__(self, model: str, **kwargs) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown engine options {sorted(unknown)}; known: {sorted(known)}")
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))

    def generate(self, prompt_token_ids: list[list[Token]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """One output per prompt, in order. sampling_params: one for all, or one per prompt."""
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompt_token_ids)
        if len(params) != len(prompt_token_ids):
            raise ValueError(f"got {len(params)} sampling params for {len(prompt_token_ids)} prompts")
        ids = [f"offline-{i}" for i in range(len(prompt_token_ids))]
        for rid, prompt, p in zip(ids, prompt_token_ids, params):
            self.engine.add_request(rid, prompt, p)
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generating", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        return [done[r] for r in ids]
