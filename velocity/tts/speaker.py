"""Speaker strings of the ChatTTS release: float16 bytes, raw LZMA2 (preset 9 | extreme), base16384."""
from __future__ import annotations

import lzma

import numpy as np
import pybase16384 as b14

FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


class SpeakerError(ValueError):
    """A speaker string or vector that cannot be used; the message says why."""


def encode_speaker(vec: np.ndarray) -> str:
    """A speaker vector -> the release's string form."""
    data = np.asarray(vec, dtype=np.float16).tobytes()
    return b14.encode_to_string(lzma.compress(data, format=lzma.FORMAT_RAW, filters=FILTERS))


def decode_speaker(s: str, dim: int = 768) -> np.ndarray:
    """The release's string form -> a float32 vector of `dim` values; SpeakerError if malformed."""
    if not isinstance(s, str) or not s.strip():
        raise SpeakerError("speaker string is empty")
    try:
        raw = b14.decode_from_string(s.strip())
    except Exception as e:
        raise SpeakerError(f"speaker string is not base16384 ({e})") from e
    try:
        data = lzma.decompress(raw, format=lzma.FORMAT_RAW, filters=FILTERS)
    except lzma.LZMAError as e:
        raise SpeakerError(f"speaker string does not hold LZMA2 data ({e})") from e
    if len(data) != 2 * dim:
        raise SpeakerError(f"speaker string holds {len(data) // 2} float16 values, expected {dim}")
    vec = np.frombuffer(data, dtype=np.float16).astype(np.float32)
    if not np.isfinite(vec).all():
        raise SpeakerError("speaker string holds NaN or inf values")
    return vec


def seeded_speaker(seed: int, dim: int) -> np.ndarray:
    """The speaker SPEAKER_SEED picks: random_speaker(seed, dim) as its speaker string holds it
    (float16), so SPEAKER=encode_speaker(random_speaker(seed, dim)) gives the same voice."""
    return random_speaker(seed, dim).astype(np.float16).astype(np.float32)


def random_speaker(seed: int, dim: int = 768, mean: np.ndarray | None = None,
                   std: np.ndarray | None = None) -> np.ndarray:
    """randn(dim) * std + mean from a seed (standard normal without the release's statistics)."""
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    if std is not None:
        v = v * np.asarray(std, dtype=np.float32)
    if mean is not None:
        v = v + np.asarray(mean, dtype=np.float32)
    return v
