"""LLM: offline batch generation over the engine."""
from __future__ import annotations

import itertools
from dataclasses import fields

import numpy as np
from tqdm.auto import tqdm

from velocity.config import EngineConfig
from velocity.engine.llm_engine import LLMEngine, RequestOutput
from velocity.engine.sequence import Token
from velocity.sampling_params import SamplingParams


class LLM:
    """Generate for many prompts at once: LLM(model=..., device="cpu").generate(prompt_token_ids=[...])."""

    def __init__(self, model: str, **kwargs) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown engine options {sorted(unknown)}; known: {sorted(known)}")
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._ids = itertools.count()

    def generate(self, prompt_token_ids: list[list[Token]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False, speakers: list | None = None, head: str | None = None,
                 return_hidden: bool = False) -> list[RequestOutput]:
        """One output per prompt, in order. sampling_params: one for all, or one per prompt.
        Audio models: speakers gives one speaker vector (or None) per prompt; head="text"
        runs the text-refine head instead of audio frames. return_hidden: each output's
        `hidden` holds the hidden states of all its tokens, [len(token_ids), H]."""
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompt_token_ids)
        if len(params) != len(prompt_token_ids):
            raise ValueError(f"got {len(params)} sampling params for {len(prompt_token_ids)} prompts")
        speakers = speakers or [None] * len(prompt_token_ids)
        if len(speakers) != len(prompt_token_ids):
            raise ValueError(f"got {len(speakers)} speakers for {len(prompt_token_ids)} prompts")
        ids = [f"offline-{next(self._ids)}" for _ in prompt_token_ids]
        for rid, prompt, p, spk in zip(ids, prompt_token_ids, params, speakers):
            self.engine.add_request(rid, prompt, p, head=head, speaker=spk, return_hidden=return_hidden)
        done: dict[str, RequestOutput] = {}
        hidden: dict[str, list] = {r: [] for r in ids}
        with tqdm(total=len(ids), desc="generating", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.new_hidden is not None:
                        hidden[out.request_id].append(out.new_hidden)
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        if return_hidden:
            for r in ids:
                done[r].hidden = np.concatenate(hidden[r]) if hidden[r] else None
        return [done[r] for r in ids]
