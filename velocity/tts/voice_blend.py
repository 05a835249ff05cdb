"""Voice blends: `amber(2)+ash(1)` (Kokoro-FastAPI's syntax) names a voice mixed of named voices by
weight. Each speaker vector is standardised by the release's speaker statistics ((v - mean) / std,
the draw a random speaker is made of), the standardised vectors are averaged by weight, and the
mix is scaled back to the weighted mean of their norms (an average of different voices is
shorter than any of them: a speaker of that norm sounds like no one), then un-standardised and
rounded to float16, as the release's vectors are. A blend of one voice with itself is that voice.
Voices cloned from a recording have no speaker vector to mix and are refused.

`parse` is plain Python (the gateway checks a blend's names before it asks the server).
"""
from __future__ import annotations

import re

MAX_PARTS = 8
MAX_WEIGHT = 100.0
_PART = re.compile(r"\s*([^()+\s]+)\s*(?:\(\s*([^()]*?)\s*\))?\s*")


def is_blend(voice: str) -> bool:
    """Whether a voice field names a blend rather than one voice."""
    return "+" in voice or "(" in voice


def parse(voice: str, what: str = "VOICE") -> list[tuple[str, float]]:
    """`name(weight)+name(weight)...` (a weight left out is 1) -> [(name, weight)]; ValueError
    naming `what` and what is wrong."""
    parts = voice.split("+")
    if len(parts) > MAX_PARTS:
        raise ValueError(f"{what} {voice!r} blends {len(parts)} voices; at most {MAX_PARTS}")
    out = []
    for part in parts:
        m = _PART.fullmatch(part)
        if m is None:
            raise ValueError(f"{what} {voice!r}: {part.strip()!r} is not a voice with a weight, such as amber(2) "
                             "(blend voices as amber(2)+ash(1))")
        name, weight = m[1], m[2]
        try:
            w = 1.0 if weight is None else float(weight)
        except ValueError:
            w = float("nan")
        if not 0 < w <= MAX_WEIGHT:
            raise ValueError(f"{what} {voice!r}: the weight of {name!r} must be a number in (0, {MAX_WEIGHT:g}], "
                             f"got {weight!r}")
        out.append((name, w))
    return out


def mix(vectors: list, weights: list[float], stats=None):
    """Speaker vectors [dim] mixed by weight (see the module); stats: [2, dim] (std, mean), or
    None (std 1, mean 0). -> float32 [dim] holding float16 values."""
    import numpy as np

    v = np.stack([np.asarray(x, np.float64) for x in vectors])              # [n, dim]
    std, mean = (np.ones(v.shape[1]), np.zeros(v.shape[1])) if stats is None else \
        (np.asarray(stats[0], np.float64), np.asarray(stats[1], np.float64))
    std = np.where(std == 0, 1.0, std)
    w = np.asarray(weights, np.float64) / sum(weights)
    z = (v - mean) / std                                                       # [n, dim]
    mixed = w @ z
    norm, want = np.linalg.norm(mixed), float(w @ np.linalg.norm(z, axis=1))
    if norm > 0:
        mixed *= want / norm
    return (mixed * std + mean).astype(np.float16).astype(np.float32)
