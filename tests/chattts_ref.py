"""A plain ChatTTS GPT reference for tests: transformers.LlamaModel on embeddings, the embedding
and head tables read straight from the release files, one sequence at a time, no paging."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig, LlamaModel


class RefChatTTS:
    def __init__(self, folder: Path) -> None:
        asset = Path(folder) / "asset"
        cfg = LlamaConfig(**json.loads((asset / "gpt" / "config.json").read_text()))
        self.body = LlamaModel(cfg).eval()
        missing, unexpected = self.body.load_state_dict(load_file(str(asset / "gpt" / "model.safetensors")),
                                                        strict=False)
        assert set(missing) <= {"embed_tokens.weight"} and not unexpected, (missing, unexpected)
        e = load_file(str(asset / "Embed.safetensors"))
        self.num_vq = len([k for k in e if k.startswith("emb_code.")])
        self.emb_text = e["emb_text.weight"]
        self.emb_code = [e[f"emb_code.{i}.weight"] for i in range(self.num_vq)]

        def fold(name):   # weight norm: g * v / ||v|| per output row
            g, v = e[f"{name}.parametrizations.weight.original0"], e[f"{name}.parametrizations.weight.original1"]
            return g * v / v.norm(dim=1, keepdim=True)

        self.head_code = [fold(f"head_code.{i}") for i in range(self.num_vq)]
        self.head_text = fold("head_text")
        self.end = self.emb_code[0].shape[0] - 1
        self.tok = AutoTokenizer.from_pretrained(str(asset / "tokenizer"))
        self.spk_id = self.tok.convert_tokens_to_ids("[spk_emb]")
        self.ebreak_id = self.tok.convert_tokens_to_ids("[Ebreak]")

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def embed(self, prompt: list[int], frames: list[tuple], speaker: torch.Tensor | None) -> torch.Tensor:
        rows = []
        for t in prompt:
            if t == self.spk_id and speaker is not None:
                rows.append(speaker / speaker.norm())
            else:
                rows.append(self.emb_text[t])
        for f in frames:
            rows.append(sum(self.emb_code[i][c] for i, c in enumerate(f)))
        return torch.stack(rows)

    @torch.no_grad()
    def last_hidden(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(inputs_embeds=x[None]).last_hidden_state[0, -1]

    @torch.no_grad()
    def greedy_frames(self, prompt: list[int], n: int, speaker=None, min_new: int = 0) -> list[tuple]:
        frames: list[tuple] = []
        while len(frames) < n:
            h = self.last_hidden(self.embed(prompt, frames, speaker))
            logits = torch.stack([w @ h for w in self.head_code])            # [num_vq, V]
            if len(frames) < min_new:
                logits[:, self.end] = float("-inf")
            frames.append(tuple(logits.argmax(-1).tolist()))
            if self.end in frames[-1]:
                break
        return frames

    @torch.no_grad()
    def greedy_text(self, prompt: list[int], n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            h = self.last_hidden(self.embed(prompt + out, [], None))
            out.append(int((self.head_text @ h).argmax()))
            if out[-1] == self.ebreak_id:
                break
        return out
