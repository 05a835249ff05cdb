"""Text in pieces, by one sentence rule that the gateway (long texts, the WebSockets, Wyoming) and
the client (long-text mode) share: `split_long` cuts a text into pieces within the server's text
limit, at paragraphs and then sentences; `split_complete` takes the complete sentences from text
as it is written; `sentences_in` counts them. Plain Python: a client install imports it."""
from __future__ import annotations

import re

# a sentence is complete when its end mark is followed by space (so "3.14" waits for more text);
# the full-width marks of Chinese and Japanese end one at once
SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])")
PARAGRAPH = re.compile(r"\n\s*\n")


def split_long(text: str, limit: int) -> list[str]:
    """Pieces of at most `limit` characters, in order: whole paragraphs where they fit, else their
    sentences packed together; a sentence longer than the limit is cut at its last space or comma
    before it (at the limit if it has none)."""
    pieces: list[str] = []
    for para in (p.strip() for p in PARAGRAPH.split(text)):
        if not para:
            continue
        if len(para) <= limit:
            pieces.append(para)
            continue
        cur = ""
        for sent in (s.strip() for s in SENTENCE_END.split(para)):
            while len(sent) > limit:
                head, sent = cut_at_word(sent, limit)
                if cur:
                    pieces.append(cur)
                    cur = ""
                pieces.append(head)
            if not sent:
                continue
            if cur and len(cur) + 1 + len(sent) > limit:
                pieces.append(cur)
                cur = ""
            cur = f"{cur} {sent}" if cur else sent
        if cur:
            pieces.append(cur)
    return pieces


def cut_at_word(text: str, limit: int) -> tuple[str, str]:
    """(the head of text, at most `limit` characters, cut after its last space or comma; at the
    limit where it has none, the rest)."""
    head = text[:limit]
    cut = max(head.rfind(" "), head.rfind(","), head.rfind("，"), head.rfind("、"))
    cut = cut + 1 if cut > 0 else limit
    return text[:cut].strip(), text[cut:].lstrip()


def sentences_in(piece: str) -> int:
    """The sentences in a piece of text (at least one), by the same rule."""
    return max(1, len([s for s in SENTENCE_END.split(piece) if s.strip()]))


def split_complete(text: str) -> tuple[list[str], str]:
    """Streamed text -> (its complete sentences, the rest still being written)."""
    parts = SENTENCE_END.split(text)
    return [p.strip() for p in parts[:-1] if p.strip()], parts[-1]
