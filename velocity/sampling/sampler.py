"""Batched sampling where every row keeps its own parameters and its own random stream.

Logits are [B, K, V]: K = 1 for text, K = num_vq codebooks for an audio frame.
"""
from __future__ import annotations

import torch

from velocity.engine.sequence import Sequence, Token


def top_k_top_p(x: torch.Tensor, ks: torch.Tensor, ps: torch.Tensor, p_first: bool = False) -> torch.Tensor:
    """Per-row top-k (ks: [R], V = off) and top-p (ps: [R], 1 = off) as -inf masks. x: [R, V]

    Default order is transformers' (top-k, then top-p on the renormalised rest);
    p_first=True is the ChatTTS reference's (top-p, then top-k).
    """
    V = x.shape[-1]
    xs, order = x.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=x.device)[None]
    if not p_first:
        xs = xs.masked_fill(rank >= ks[:, None], float("-inf"))
    probs = xs.softmax(dim=-1)
    xs = xs.masked_fill(probs.cumsum(dim=-1) - probs >= ps[:, None], float("-inf"))  # as transformers; keeps the top token
    if p_first:
        xs = xs.masked_fill(rank >= ks[:, None], float("-inf"))
    return torch.full_like(x, float("-inf")).scatter(1, order, xs)


class Sampler:
    """logits [B, K, V] + the batch's sequences -> one token (int, or K-tuple) per row.

    Repetition penalty and the min-tokens stop mask first, then for sampled rows temperature
    (one per codebook if given), top-k/top-p, and a draw from the row's own generator when it
    has a seed (so its tokens don't depend on its neighbours). Greedy rows take the exact argmax.
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
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int],
                 p_first: bool = False, window: int | None = None) -> list[Token]:
        """window: the repetition window of requests that set none (the head's default)."""
        if logits.dim() == 2:
            logits = logits[:, None]
        B, K, V = logits.shape
        dev = logits.device
        logits = self.apply_penalties(logits, seqs, stop_ids, window)
        tokens = logits.argmax(dim=-1)                                   # [B, K] greedy rows
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if rows:
            idx = torch.tensor(rows, device=dev)
            ps = [seqs[i].params for i in rows]
            temps = torch.tensor([p.temperatures(K) for p in ps], device=dev)          # [R, K]
            x = logits[idx] / temps[:, :, None]
            ks = torch.tensor([p.top_k if 0 < p.top_k < V else V for p in ps], device=dev)
            tp = torch.tensor([p.top_p for p in ps], device=dev)
            if bool((ks < V).any()) or bool((tp < 1).any()):
                x = top_k_top_p(x.view(-1, V), ks.repeat_interleave(K), tp.repeat_interleave(K), p_first)
                x = x.view(len(rows), K, V)
            probs = x.softmax(dim=-1)
            noise = torch.empty_like(probs).exponential_()
            for j, i in enumerate(rows):
                if seqs[i].params.seed is not None:
                    noise[j].exponential_(generator=self._generator(seqs[i]))
            tokens[idx] = (probs / noise).argmax(dim=-1)                 # exponential race = categorical draw
        return [t[0] if K == 1 else tuple(t) for t in tokens.tolist()]

    def apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int],
                        window: int | None = None) -> torch.Tensor:
        """Repetition penalty and min_new_tokens' stop mask. logits: [B, K, V]"""
        B, K, V = logits.shape
        dev = logits.device
        pen = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1.0]
        if pen:
            logits = logits.clone()
            counts = torch.zeros(len(pen), K, V, device=dev)
            for j, i in enumerate(pen):
                s = seqs[i]
                w = s.params.repetition_window or window
                # audio frames: only generated frames count (the prompt is text)
                hist = (s.token_ids if K == 1 else s.output_token_ids) if w is None else s.output_token_ids[-w:]
                if hist:
                    ids = torch.tensor(hist, device=dev).view(len(hist), -1)[:, :K].T      # [K, L]
                    counts[j].scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
                if w is None:        # transformers' rule: every earlier token penalised once
                    counts[j].clamp_(max=1)
            r = torch.tensor([seqs[i].params.repetition_penalty for i in pen], device=dev)[:, None, None]
            alpha = r ** counts                                           # [P, K, V]
            sub = logits[pen]
            logits[pen] = torch.where(sub < 0, sub * alpha, sub / alpha)
        masked = [(i, s) for i, s in enumerate(seqs) if len(s.output_token_ids) < s.params.min_new_tokens]
        if masked:
            logits = logits.clone() if not pen else logits
            for i, s in masked:
                stop = list((set() if s.params.ignore_eos else stop_ids) | set(s.params.stop_token_ids))
                if stop:
                    logits[i, :, stop] = float("-inf")
        return logits
