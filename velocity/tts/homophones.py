"""Chinese characters the tokenizer lacks, replaced by ones it has.

The reference replaces characters from a fixed map of 16k entries, every traditional character
among them, even those its vocabulary has (so `時間` never reaches the GPT as written). We derive
replacements instead: every character becomes its simplified form (OpenCC t2s, character by
character) when the vocabulary has that; a character the vocabulary still lacks becomes one with
the same pinyin and tone (pypinyin) that it has, the one with the lowest token id (BERT
vocabularies put common characters first); else none, and the character is dropped.

Where the reference's map picks a homophone other than the simplified form (`時` -> `石`, not
`时`), the prompt ids differ while the reading is the same (tests/unit/tts/test_conformance.py shows which).
"""
from __future__ import annotations

from functools import lru_cache

from velocity.tts.normalizer import CJK


class Homophones:
    """homophones(ch) -> its simplified form when the vocabulary has it, else ch itself when the
    vocabulary has it, else a same-pinyin replacement, or "" (see the module)."""

    def __init__(self, vocab: dict[str, int]) -> None:
        import opencc

        self.vocab = vocab
        self._t2s = opencc.OpenCC("t2s")
        self._by_pinyin: dict[str, str] | None = None        # built on the first miss
        self.lookup = lru_cache(maxsize=65536)(self._lookup)

    def __call__(self, ch: str) -> str:
        return self.lookup(ch)

    @staticmethod
    def _pinyin(ch: str) -> str | None:
        from pypinyin import Style, pinyin

        p = pinyin(ch, style=Style.TONE3, heteronym=False, errors="ignore")
        return p[0][0] if p and p[0] else None

    def _lookup(self, ch: str) -> str:
        simple = self._t2s.convert(ch)
        if len(simple) == 1 and simple in self.vocab:
            return simple
        if ch in self.vocab:
            return ch
        if self._by_pinyin is None:
            self._by_pinyin = {}
            for tok, _ in sorted(self.vocab.items(), key=lambda kv: kv[1]):
                if CJK.fullmatch(tok) and (p := self._pinyin(tok)):
                    self._by_pinyin.setdefault(p, tok)
        p = self._pinyin(simple if len(simple) == 1 else ch)
        return self._by_pinyin.get(p, "") if p else ""
