"""Text front end: normalise, split into sentences, build the prompt, tokenize with the release's tokenizer."""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from velocity.tts.normalizer import CONTROL, Normalized, Normalizer, split_sentences
from velocity.tts.speaker import STATS_FILE, load_speaker_stats

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "[speed_5]"


@dataclass
class Sentence:
    text: str                 # normalised
    token_ids: list[int]      # the whole prompt: [Stts][spk_emb|empty_spk]{prompt}{text}[Ptts]


class TextFrontend:
    """Loads asset/tokenizer of a ChatTTS release folder (BertTokenizerFast, no automatic specials)."""

    def __init__(self, folder: str | Path) -> None:
        from transformers import AutoTokenizer

        path = Path(folder) / "asset" / "tokenizer"
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path / 'tokenizer.json'}: tokenizer file missing")
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        cfg = Path(folder) / "asset" / "gpt" / "config.json"
        self.speaker_dim = json.loads(cfg.read_text(encoding="utf-8")).get("hidden_size", 768) if cfg.is_file() else 768
        self.speaker_stats = load_speaker_stats(folder, self.speaker_dim)   # for random speakers
        if self.speaker_stats is None:
            logger.warning("%s has no %s: random speakers (SPEAKER_SEED) come from a plain normal, not the "
                           "release's speaker statistics (scripts/download_weights.py fetches it)", folder, STATS_FILE)
        vocab = self.tokenizer.get_vocab()
        self.normalizer = Normalizer(keep=lambda ch: ch in vocab)

    def normalize(self, text: str) -> Normalized:
        return self.normalizer.normalize(text)

    def check_prompt(self, prompt: str) -> None:
        if CONTROL.sub("", prompt).strip():
            raise ValueError(f"PROMPT must hold only control tokens such as [speed_5] or [oral_2], got {prompt!r}")

    def encode(self, text: str, speaker: bool, prompt: str = DEFAULT_PROMPT) -> tuple[list[Sentence], Normalized]:
        """Text -> one prompt per sentence, in order, and the normalisation report."""
        self.check_prompt(prompt)
        norm = self.normalize(text)
        spk = "[spk_emb]" if speaker else "[empty_spk]"
        out = []
        for s in split_sentences(norm.text):
            if not re.sub(CONTROL.pattern, "", s).strip(" ，。、,."):
                continue                      # nothing left to speak
            ids = self.tokenizer.encode(f"[Stts]{spk}{prompt}{s}[Ptts]", add_special_tokens=False)
            out.append(Sentence(s, ids))
        return out, norm
