"""Batched sampling where every row keeps its own parameters and its own random stream."""
from __future__ import annotations

import torch

from velocity.engine.sequence import Sequence


def top_k_top_p(x: torch.Tensor, ks: torch.Tensor, ps: torch.Tensor) -> torch.Tensor:
    """Per-row top-k (ks: [B], V = off) then top-p (ps: [B], 1 = off) as -inf masks. x: [B, V]"""
    V = x.shape[-1]
    xs, order = x.sort(dim=-1, descending=True)
    xs = xs.masked_fill(torch.arange(V, device=x.device)[None] >= ks[:, None], float("-inf"))
    probs = xs.softmax(dim=-1)
    xs = xs.masked_fill(probs.cumsum(dim=-1) - probs >= ps[:, None], float("-inf"))  # as transformers; keeps the top token
    return torch.full_like(x, float("-inf")).scatter(1, order, xs)


class Sampler:
    """logits [B, V] + the batch's sequences -> one token per row.

    Order as in transformers: repetition penalty, min-tokens stop mask, then for sampled
    rows temperature, top-k, top-p, and a draw from the row's own generator when it has a
    seed (so its tokens don't depend on its neighbours). Greedy rows take the exact argmax.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.generators: dict[int, torch.Generator] = {}

    def forget(self, seq: Sequence) -> None:
        self.generators.pop(seq.seq_id, None)

    def _generator(self, seq: Sequence) -> torch.Generator:
        g = self.generators.get(seq.seq_id)
        if g is None:
            g = self.generators[seq.seq_id] = torch.Generator(device=self.device)
            g.manual_seed(seq.params.seed)
        return g

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int]) -> list[int]:
        B, V = logits.shape
        dev = logits.device
        logits = self.apply_penalties(logits, seqs, stop_ids)
        tokens = logits.argmax(dim=-1)                                  # greedy rows
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if rows:
            idx = torch.tensor(rows, device=dev)
            ps = [seqs[i].params for i in rows]
            x = logits[idx] / torch.tensor([p.temperature for p in ps], device=dev)[:, None]
            ks = torch.tensor([p.top_k if 0 < p.top_k < V else V for p in ps], device=dev)
            tp = torch.tensor([p.top_p for p in ps], device=dev)
            if bool((ks < V).any()) or bool((tp < 1).any()):
                x = top_k_top_p(x, ks, tp)
            probs = x.softmax(dim=-1)
            noise = torch.empty_like(probs).exponential_()
            for j, i in enumerate(rows):
                if seqs[i].params.seed is not None:
                    noise[j].exponential_(generator=self._generator(seqs[i]))
            choice = (probs / noise).argmax(dim=-1)                     # exponential race = categorical draw
            tokens[idx] = choice
        return tokens.tolist()

    def apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int]) -> torch.Tensor:
        dev = logits.device
        pen = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1.0]
        if pen:
            logits = logits.clone()
            hist = [seqs[i].token_ids for i in pen]
            width = max(len(h) for h in hist)
            ids = torch.tensor([h + [h[0]] * (width - len(h)) for h in hist], device=dev)   # [P, L]
            r = torch.tensor([seqs[i].params.repetition_penalty for i in pen], device=dev)[:, None]
            idx = torch.tensor(pen, device=dev)
            score = logits[idx].gather(1, ids)
            score = torch.where(score < 0, score * r, score / r)
            logits[idx] = logits[idx].scatter(1, ids, score)
        masked = [(i, s) for i, s in enumerate(seqs) if len(s.output_token_ids) < s.params.min_new_tokens]
        if masked:
            logits = logits.clone() if not pen else logits
            for i, s in masked:
                stop = list((set() if s.params.ignore_eos else stop_ids) | set(s.params.stop_token_ids))
                if stop:
                    logits[i, stop] = float("-inf")
        return logits
