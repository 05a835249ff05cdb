"""JSON from clients, bounded: a body or a WebSocket message nested deeper than MAX_DEPTH is
refused before it is parsed (the parser recurses once a level), in time linear in its length."""
from __future__ import annotations

import json
import re

import numpy as np

from velocity.gateway.upstream import ApiError

MAX_DEPTH = 32                                   # our bodies nest 3 deep (a lexicon inside a body)
STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')   # a JSON string: its brackets do not nest
NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def depth(text: str) -> int:
    """How deep the text's arrays and objects nest (of valid JSON; an estimate of other text); a
    text with no more opening brackets than MAX_DEPTH, strings' included, says only that count."""
    opening = text.count("[") + text.count("{")
    if opening <= MAX_DEPTH:
        return opening               # no deeper than that: the scan below costs more than the parse
    brackets = NOT_BRACKETS.sub("", STRINGS.sub("", text)).encode()
    if not brackets:
        return 0
    b = np.frombuffer(brackets, dtype=np.uint8)
    return int(np.cumsum(np.where((b == ord("[")) | (b == ord("{")), 1, -1)).max())


def loads(raw: str | bytes, what: str) -> object:
    """The JSON value of a body or message; ApiError 400 naming `what` where it is not JSON, not
    UTF-8 or nested deeper than MAX_DEPTH."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise ApiError(400, f"{what} must be UTF-8 JSON ({e})") from e
    if depth(text) > MAX_DEPTH:
        raise ApiError(400, f"{what} nests arrays and objects more than {MAX_DEPTH} deep")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"{what} must be JSON ({e})") from e
