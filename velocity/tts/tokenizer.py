"""The release's BERT tokenizer on the `tokenizers` library alone (the server's path must not need
transformers), behaving as transformers' BertTokenizer does with asset/tokenizer.
tests/unit/tts/test_tokenizer.py holds the two equal on the release's files and on ours."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers

# transformers' clean_up_tokenization, applied after decoding when the config asks for it
CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class BertTokenizer:
    """asset/tokenizer: tokenizer.json (vocabulary, added tokens) and tokenizer_config.json (case,
    Chinese characters, accents, clean-up). Encodes without automatic special tokens."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        if not (folder / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{folder / 'tokenizer.json'}: tokenizer file missing")
        conf_file = folder / "tokenizer_config.json"
        conf = json.loads(conf_file.read_text(encoding="utf-8")) if conf_file.is_file() else {}
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tok.no_padding()        # the release's file pads and truncates to 256: transformers resets
        tok.no_truncation()     # both on every call, and so do we, once
        # what transformers' BertTokenizer sets whatever the file says
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=conf.get("tokenize_chinese_chars", True),
            strip_accents=conf.get("strip_accents"), lowercase=conf.get("do_lower_case", True))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        self.tokenizer = tok
        self.clean_up = bool(conf.get("clean_up_tokenization_spaces", False))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if self.clean_up:
            for a, b in CLEANUPS:
                text = text.replace(a, b)
        return text

    def tokens(self, ids: list[int]) -> list[str]:
        """The vocabulary entries of ids (pieces keep their ##)."""
        return [self.tokenizer.id_to_token(i) for i in ids]

    def get_vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab(with_added_tokens=True)
