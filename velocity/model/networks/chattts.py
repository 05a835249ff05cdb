"""The ChatTTS GPT: a Llama body fed embeddings, with text and audio-code tables and heads."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from velocity.model.layers.attention import AttentionMetadata
from velocity.model.layers.heads import Head
from velocity.model.networks.llama import LlamaBody, fused_weight
from velocity.model.networks.llama_config import LlamaConfig


def speaker_row(v: torch.Tensor) -> torch.Tensor:
    """A speaker vector -> what the [spk_emb] position takes, as the reference computes it: float16
    (what a speaker string holds), L2-normalised in float16 (F.normalize, eps 1e-12), then float32."""
    return F.normalize(v.to(torch.float16), p=2.0, dim=0, eps=1e-12).float()


@dataclass(frozen=True)
class CheckedSpeaker:
    """A speaker already checked and normalised (ChatTTSGPT.check_speaker): the [spk_emb] row and
    the digest that salts the prefix cache. Passing it again costs nothing."""
    row: torch.Tensor
    digest: str


class ChatTTSGPT(nn.Module):
    """Text positions embed with emb_text; an audio frame embeds as the sum of its num_vq code
    embeddings. head_code gives all num_vq codes of the next frame at once; head_text is for
    the text-refine mode. A request's speaker vector replaces the [spk_emb] position's embedding.

    Tokens: an int is a text token; a num_vq-tuple is an audio frame. As a tensor, [T, num_vq]
    with a text token written as (id, -1, -1, ...).
    """

    default_head = "audio"
    pad_token = 0

    def __init__(self, cfg: LlamaConfig, num_text_tokens: int, num_audio_tokens: int, num_vq: int,
                 spk_emb_token_id: int | None, text_stop_ids: set[int]) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.config = cfg
        self.num_vq, self.num_text_tokens, self.num_audio_tokens = num_vq, num_text_tokens, num_audio_tokens
        self.spk_emb_token_id = spk_emb_token_id
        self.model = LlamaBody(cfg)
        self.emb_text = nn.Embedding(num_text_tokens, H)
        self.emb_code = nn.ModuleList(nn.Embedding(num_audio_tokens, H) for _ in range(num_vq))
        self.head_text = nn.Linear(H, num_text_tokens, bias=False)
        self.head_code = nn.ModuleList(nn.Linear(H, num_audio_tokens, bias=False) for _ in range(num_vq))
        self.head_code_fused: nn.Module | None = None        # fuse_code_heads()
        self.heads = {
            # the last code of the audio vocabulary ends the sequence
            "audio": Head(self.audio_logits, num_vq, {num_audio_tokens - 1}, sampling_style="chattts",
                          repetition_window=16),
            "text": Head(lambda h: self.head_text(h).float()[:, None], 1, text_stop_ids, sampling_style="chattts"),
        }

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    def audio_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] -> [B, num_vq, num_audio_tokens]"""
        if self.head_code_fused is not None:
            return self.head_code_fused(hidden).view(-1, self.num_vq, self.num_audio_tokens).float()
        return torch.stack([h(hidden) for h in self.head_code], dim=1).float()

    def fuse_code_heads(self) -> None:
        """The num_vq code heads as one linear [H -> num_vq * V]. For a CPU whose linears are then
        prepacked: one oneDNN call instead of num_vq (bench_step measures the step), and the same
        values as the heads' own prepacked calls (tests/unit/model/test_packed_linear.py). On CUDA with the
        GPU kernels: one GEMM instead of num_vq (a row's values may round apart from the heads'
        own, as cuBLAS picks its kernel by the output width). Not for MKL. Once is enough."""
        if self.head_code_fused is not None:
            return
        w = torch.cat([h.weight for h in self.head_code])               # [num_vq * V, H]
        fused = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        fused.weight = nn.Parameter(w, requires_grad=False)
        self.head_code_fused, self.head_code = fused, nn.ModuleList()

    def token_tensor(self, tokens: list, device: torch.device) -> torch.Tensor:
        pad = (-1,) * (self.num_vq - 1)
        rows = [(t, *pad) if type(t) is int else t for t in tokens]
        # numpy reads a list of tuples several times faster than torch.tensor does
        return torch.from_numpy(np.array(rows, dtype=np.int64).reshape(len(tokens), self.num_vq)).to(device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: [T, num_vq] -> [T, H]"""
        is_text = ids[:, 1:2] < 0 if self.num_vq > 1 else torch.ones_like(ids[:, :1], dtype=torch.bool)
        text = self.emb_text(ids[:, 0].clamp(0, self.num_text_tokens - 1))
        audio = sum(emb(ids[:, i].clamp(0, self.num_audio_tokens - 1)) for i, emb in enumerate(self.emb_code))
        return torch.where(is_text, text, audio)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata,
                overrides: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        return self.model(self.embed(input_ids), positions, md, overrides)

    def fused_weight(self, name: str) -> tuple[str, int, int] | None:
        return fused_weight(self.model.layers[0], name)

    # -- requests --------------------------------------------------------------------
    def check_prompt(self, prompt: list) -> None:
        """Text token ids (ints), then optionally audio frames (num_vq-tuples of codes, a voice
        sample's, which the reference appends after the text)."""
        V, C, K = self.num_text_tokens, self.num_audio_tokens - 1, self.num_vq

        def ok(t) -> bool:
            if isinstance(t, int):
                return 0 <= t < V
            return isinstance(t, tuple) and len(t) == K and all(isinstance(c, int) and 0 <= c < C for c in t)

        bad = [t for t in prompt if not ok(t)]
        if bad:
            raise ValueError(f"prompt tokens must be text token ids (integers in [0, {V})) or audio frames "
                             f"({K} codes in [0, {C})), got {bad[:5]}")
        first_frame = next((i for i, t in enumerate(prompt) if not isinstance(t, int)), len(prompt))
        if any(isinstance(t, int) for t in prompt[first_frame:]):
            raise ValueError("a prompt's audio frames must come after all of its text tokens")

    def check_speaker(self, speaker: object) -> CheckedSpeaker:
        """-> the vector the [spk_emb] position takes and a digest that salts the prefix cache
        (ValueError if the speaker is not usable).

        As the reference: the speaker in float16 (what a speaker string holds), L2-normalised in
        float16 (F.normalize, eps 1e-12), then float32 next to the float32 embeddings."""
        if isinstance(speaker, CheckedSpeaker):
            return speaker
        H = self.config.hidden_size
        try:
            v = torch.as_tensor(speaker, dtype=torch.float32).flatten().cpu()
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"speaker must be {H} floats ({e})") from e
        if v.numel() != H:
            raise ValueError(f"speaker must be {H} floats, got {v.numel()}")
        if not bool(torch.isfinite(v).all()):
            raise ValueError("speaker must hold finite floats (got NaN or inf)")
        if float(v.abs().max()) > 65504:
            raise ValueError("speaker values must fit float16 (|x| <= 65504)")
        if float(v.to(torch.float16).float().norm()) == 0:
            raise ValueError("speaker must not be all zeros")
        v = speaker_row(v)
        return CheckedSpeaker(v, hashlib.sha1(v.numpy().tobytes()).hexdigest())

    def embed_overrides(self, seq, start: int, end: int) -> list[tuple[int, torch.Tensor]]:
        """The [spk_emb] positions of seq in [start, end) take its speaker vector."""
        if seq.speaker is None or self.spk_emb_token_id is None:
            return []
        p = seq.prompt_token_ids
        return [(i, seq.speaker) for i in range(start, min(end, len(p))) if p[i] == self.spk_emb_token_id]
