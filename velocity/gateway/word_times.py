"""The words of `tts` chunks on the gateway's own audio (velocity.tts.word_timing makes them; a
chunk's `words` hold samples of its own `tts` stream at 24 kHz): moved to where that stream
begins in a socket's or a long text's audio (`moved`), and laid on audio messages that another
encoding cut differently, as ElevenLabs' character alignment (`MessageWords`, `alignment`).
"""
from __future__ import annotations

from collections import deque

from velocity.tts.word_timing import SAMPLE_RATE


def moved(words: list[dict], samples: int) -> list[dict]:
    """A chunk's words, `samples` later ({"word", "start", "end", ...}, samples at 24 kHz)."""
    return [{**w, "start": w["start"] + samples, "end": w["end"] + samples} for w in words]


def shown(words: list[dict]) -> list[dict]:
    """What a client is told of a chunk's words: {"word", "start", "end"} (samples at 24 kHz)."""
    return [{"word": w["word"], "start": w["start"], "end": w["end"]} for w in words]


def in_seconds(words: list[dict]) -> list[dict]:
    """{"word", "start", "end"} in seconds (3 decimals), from samples at 24 kHz."""
    return [{"word": w["word"], "start": round(w["start"] / SAMPLE_RATE, 3), "end": round(w["end"] / SAMPLE_RATE, 3)}
            for w in words]


class MessageWords:
    """The words of one stream of audio messages (an ElevenLabs context): added as their chunks
    come (`add`, with the samples of the stream's audio before the chunk's `tts` stream), taken
    by the audio messages as they go out (`take`: those estimated to start before the message's
    end, every one left with the last)."""

    def __init__(self) -> None:
        self.waiting: deque[dict] = deque()
        self.sent = 0.0                     # seconds of audio in the messages so far

    def add(self, words: list[dict], base: int) -> None:
        for w in words:
            self.waiting.append({"word": w["word"], "spoken": w.get("spoken", w["word"]),
                                 "start": (base + w["start"]) / SAMPLE_RATE, "end": (base + w["end"]) / SAMPLE_RATE})

    def take(self, seconds: float, last: bool = False) -> tuple[list[dict], float, float]:
        """(the words of a message of `seconds` of audio, where it begins, where it ends)."""
        t0, t1 = self.sent, self.sent + seconds
        out = []
        while self.waiting and (last or self.waiting[0]["start"] < t1):
            out.append(self.waiting.popleft())
        self.sent = t1
        return out, t0, t1


def alignment(words: list[dict], t0: float, t1: float, absolute: bool, key: str = "word") -> dict:
    """ElevenLabs' alignment of an audio message of seconds [t0, t1) of its context: each word's
    characters (key "word": as written; "spoken": as read) spread over its time within the
    message, each word followed by a space that lasts to the next word (or the message's end), so
    that the last character ends where the message's audio does. Times in ms from the message's
    start, or with `absolute` (sync_alignment) from the context's. A message with no word is one
    space over all of it when its times are its own (so that a reader's clock, which adds up the
    messages' spans, moves on), and has no characters when they are the context's."""
    base = 0 if absolute else round(t0 * 1000)

    def ms(t: float) -> int:
        return round(min(max(t, t0), t1) * 1000) - base

    chars, starts, durations = [], [], []

    def put(text: str, a: float, b: float) -> None:
        n = len(text)
        for k, ch in enumerate(text):
            s, e = ms(a + (b - a) * k / n), ms(a + (b - a) * (k + 1) / n)
            chars.append(ch)
            starts.append(s)
            durations.append(e - s)

    said = [w for w in words if w[key]]
    for k, w in enumerate(said):
        put(w[key], w["start"], min(w["end"], t1))
        put(" ", min(w["end"], t1), said[k + 1]["start"] if k + 1 < len(said) else t1)
    if not said and not absolute:
        put(" ", t0, t1)
    return {"chars": chars, "charStartTimesMs": starts, "charDurationsMs": durations}
