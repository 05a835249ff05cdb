"""When each word the client wrote is heard: exact at a sentence's edges, an estimate inside it.

ChatTTS gives no alignment of its audio to its text, so inside a sentence the times are an
estimate; a sentence's bounds are exact (its frames: 512 samples at 24 kHz a frame, the last
one half). The estimate reads the sentence's spoken text (normalised; refined, with text refine)
as syllables and pauses: a vowel group of an English word (a capitalised abbreviation: a letter),
a Chinese character, a pause at punctuation and at ChatTTS's break tokens (PAUSES). A speaking
rate turns them into seconds (RATE syllables a second at [speed_5], SPEED_STEP of it more a step
up). None of this was measured on speech: the release's weights are not on the machines it was
written on.

Each word the client wrote (`client_words`) is found in the spoken text by its own reading (the
lexicon, then the normaliser, on the word alone: "$5" reads "five dollars"), the readings matched
to the spoken text's words in order (difflib); a word not found there ("New York" under one
lexicon entry) takes a share of the gap between its found neighbours by its length.

As a sentence's chunks go out, `WordClock.place` hands each chunk the words estimated to start in
it; a word's end never passes the audio known to exist when it is sent, and the sentence's last
chunk places the words left before its exact end. A word once sent keeps its time.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from difflib import SequenceMatcher

from velocity.tts.control import CONTROL

SAMPLE_RATE = 24000
RATE = {"en": 3.8, "zh": 4.5}      # syllables (Chinese: characters) a second at [speed_5]
SPEED_STEP = 0.1                   # each [speed_N] step above (below) 5: this share of RATE faster (slower)
PAUSES = {"，": 0.8, ",": 0.8, "、": 0.5, "。": 1.2, ".": 1.2, "[uv_break]": 0.8, "[v_break]": 0.8,
          "[lbreak]": 1.6, "[laugh]": 2.0}      # in syllables; [break_N]: N / 4
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"   # ideographs, kana, hangul
_WORDS = re.compile(rf"[{_CJK}][^{_CJK}\w\s]*|(?:(?![{_CJK}])\S)+")
_TOKEN = re.compile(rf"{CONTROL.pattern}|[{_CJK}]|[A-Za-z0-9']+|[，,、。.]")
_VOWELS = re.compile(r"[aeiouy]+")


@dataclass(slots=True)
class Word:
    """One word as the client wrote it, where it is heard (samples of the stream's audio at 24
    kHz), and how it was read (its reading: the lexicon and the normaliser on it)."""
    word: str
    start: int
    end: int
    spoken: str = ""

    def to_dict(self) -> dict:
        return {"word": self.word, "start": self.start, "end": self.end, "spoken": self.spoken}


@dataclass(slots=True)
class SentenceWords:
    """A sentence's words as the client wrote them, each with its reading, and the speaking rate
    (syllables a second) of its [speed_N]: what the front end tells the llm."""
    words: list[tuple[str, str]]
    rate: float

    def to_json(self) -> str:
        return json.dumps({"rate": self.rate, "words": self.words}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, what: str = "SENTENCE_WORDS") -> "SentenceWords":
        """ValueError naming `what` for anything but {"rate": > 0, "words": [[word, reading], ...]}."""
        try:
            v = json.loads(text)
            words = [(str(w), str(r)) for w, r in v["words"]]
            rate = float(v["rate"])
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f'{what} must hold JSON {{"rate": syllables a second, "words": [[word, '
                             f'reading], ...]}} per sentence: {e}') from e
        if not 0.1 <= rate <= 50:
            raise ValueError(f"{what}: rate must be in [0.1, 50] syllables a second, got {rate}")
        return cls(words, rate)


def speaking_rate(prompt: str, lang: str) -> float:
    """Syllables a second for a prompt's [speed_N] (5 when it has none) in a language."""
    speeds = re.findall(r"\[speed_(\d)\]", prompt)
    n = int(speeds[-1]) if speeds else 5
    return RATE.get(lang, RATE["en"]) * (1 + SPEED_STEP * (n - 5))


def client_words(text: str) -> list[str]:
    """The words of a text as its writer wrote them, in order: what lies between spaces, each
    character of a script without spaces (Chinese) a word of its own with the punctuation after
    it. Control tokens ([uv_break]) are not words."""
    return _WORDS.findall(CONTROL.sub(" ", text))


def tokens(spoken: str) -> list[str]:
    """A spoken text's reading tokens: words, Chinese characters, punctuation, control tokens."""
    return _TOKEN.findall(spoken)


def _is_word(tok: str) -> bool:
    return tok[0] not in "，,、。.["


def reading_keys(reading: str) -> list[str]:
    """A reading's words, in lower case: what is matched against a spoken text's."""
    return [t.lower() for t in tokens(reading) if _is_word(t)]


def syllables(tok: str) -> float:
    """One spoken word's length in syllables (an estimate)."""
    if re.fullmatch(f"[{_CJK}]", tok):
        return 1.0
    if tok.isupper() and len(tok) <= 5:
        return float(len(tok))                     # an abbreviation, said letter by letter
    low = tok.lower()
    n = len(_VOWELS.findall(low))
    if n > 1 and low.endswith("e") and not low.endswith(("le", "ee")):
        n -= 1                                     # a silent final e
    return float(max(1, n))


def pause(tok: str) -> float:
    """A pause's length in syllables (0 for a control token that is none)."""
    m = re.fullmatch(r"\[break_(\d)\]", tok)
    return int(m[1]) / 4 if m else PAUSES.get(tok, 0.0)


def timeline(spoken: str) -> tuple[list[str], list[float], list[float], float]:
    """A spoken text -> (its words in lower case, each one's start and end in syllables, the
    whole text's length in syllables, its pauses counted)."""
    keys, starts, ends, at = [], [], [], 0.0
    for tok in tokens(spoken):
        if _is_word(tok):
            keys.append(tok.lower())
            starts.append(at)
            at += syllables(tok)
            ends.append(at)
        else:
            at += pause(tok)
    return keys, starts, ends, at


def match(readings: list[list[str]], keys: list[str]) -> list[tuple[int, int] | None]:
    """Each reading's span [a, b) of `keys` (a spoken text's words), found in order; None where
    none of its words was found."""
    flat = [k for r in readings for k in r]
    owner = [i for i, r in enumerate(readings) for _ in r]
    spans: list[list[int] | None] = [None] * len(readings)
    for a, b, size in SequenceMatcher(None, flat, keys, autojunk=False).get_matching_blocks():
        for j in range(size):
            s = spans[owner[a + j]]
            if s is None:
                spans[owner[a + j]] = [b + j, b + j + 1]
            else:
                s[1] = b + j + 1
    return [None if s is None else (s[0], s[1]) for s in spans]


def place_words(words: list[tuple[str, str]], spoken: str) -> tuple[list[tuple[float, float]], float]:
    """Each word's (start, end) in syllables of the spoken text, and the text's length: found words
    where their readings are, the others sharing the gap between found neighbours by their lengths."""
    keys, starts, ends, total = timeline(spoken)
    readings = [reading_keys(r) for _, r in words]
    spans = match(readings, keys)
    out: list[tuple[float, float] | None] = [None] * len(words)
    prev = 0.0
    for i, s in enumerate(spans):
        if s is not None:
            a = max(starts[s[0]], prev)
            out[i] = (a, max(ends[s[1] - 1], a))
            prev = out[i][1]
    i = 0
    while i < len(words):                            # the runs of words not found
        if out[i] is not None:
            i += 1
            continue
        j = i
        while j < len(words) and out[j] is None:
            j += 1
        lo = out[i - 1][1] if i else 0.0
        hi = out[j][0] if j < len(words) else max(total, lo)
        lengths = [sum(syllables(k) for k in readings[k]) for k in range(i, j)]
        share, at = (hi - lo) / (sum(lengths) or 1), lo
        for k, n in zip(range(i, j), lengths):
            out[k] = (at, at + n * share)
            at += n * share
        i = j
    return out, total


class WordClock:
    """One sentence's words placed in its audio as its chunks go out (sample positions within the
    sentence; `offset`: where it begins in the stream's audio)."""

    def __init__(self, plan: SentenceWords, spoken: str, offset: int) -> None:
        self.words, self.offset = plan.words, offset
        per = SAMPLE_RATE / plan.rate
        spans, _ = place_words(plan.words, spoken)
        self.est = [(round(a * per), round(b * per)) for a, b in spans]
        self.next = 0                    # the first word not yet placed
        self.end = 0                     # where the last placed word ends (in the sentence)

    def place(self, start: int, upto: int, known: int, last: bool) -> list[Word]:
        """The words a chunk of samples [start, upto) of the sentence carries: those estimated to
        start before `upto`, ending by `known` (the audio known to exist); with `last` (upto is the
        sentence's exact end), every word left, fitted into what is left of the chunk."""
        n, out = len(self.words), []
        if not last:
            while self.next < n and self.est[self.next][0] < upto:
                a, b = self.est[self.next]
                a = max(a, start)
                out.append(self._word(self.next, a, max(a, min(b, known))))
        elif self.next < n:
            first, span = self.est[self.next][0], self.est[-1][1] - self.est[self.next][0]
            base, lo, scale = max(self.end, start), max(first, self.end, start), 1.0
            if lo + span > upto:           # they do not fit where estimated: from the base, squeezed
                lo, scale = base, min(1.0, (upto - base) / span) if span > 0 else 0.0
            while self.next < n:
                a, b = self.est[self.next]
                out.append(self._word(self.next, round(lo + (a - first) * scale), round(lo + (b - first) * scale)))
        return out

    def _word(self, i: int, a: int, b: int) -> Word:
        self.next, self.end = i + 1, b
        word, reading = self.words[i]
        return Word(word, self.offset + a, self.offset + b, reading)


def sentence_words(words: list[str], readings: list[str], sentences: list[str]) -> list[list[int]]:
    """The client's words (each with its reading) shared out to the sentences spoken: each
    sentence's word numbers, in order. A word not found in any goes with the one before it."""
    keys, owner = [], []
    for i, s in enumerate(sentences):
        k = timeline(s)[0]
        keys += k
        owner += [i] * len(k)
    spans = match([reading_keys(r) for r in readings], keys)
    out: list[list[int]] = [[] for _ in sentences]
    at = 0
    for w, s in enumerate(spans):
        if s is not None:
            at = max(at, owner[s[0]])
        if sentences:
            out[at].append(w)
    return out
