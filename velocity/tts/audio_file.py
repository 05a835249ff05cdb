"""Audio files as the server takes them (a voice to clone): told apart from text by their magic
number, read with soundfile, mixed to mono and resampled to 24 kHz. No torch: the clients use it."""
from __future__ import annotations

import io

import numpy as np

SAMPLE_RATE = 24000                  # what the DVAE encoder's mel front end takes (the release's)
MIN_SECONDS = 0.2                    # below this a sample is at most a few frames
SILENCE_RMS = 1e-4                   # -80 dBFS: nothing to take a voice from
AUDIO_MAGIC = (b"RIFF", b"fLaC", b"OggS", b"FORM")   # WAV, FLAC, Ogg, AIFF: what soundfile reads


def looks_like_audio(data: bytes) -> bool:
    """A file's bytes (by its magic number) rather than a sample string."""
    return data[:4] in AUDIO_MAGIC


def read_audio(data: bytes, max_seconds: float, what: str = "SPEAKER_SAMPLE") -> np.ndarray:
    """An audio file's bytes -> float32 mono at 24 kHz (mixed down, resampled with soxr);
    ValueError naming `what` and the problem: unreadable, empty, too short or long, silent."""
    import soundfile as sf
    import soxr

    try:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as e:            # soundfile raises its own LibsndfileError, RuntimeError, ...
        raise ValueError(f"{what} is neither a sample string nor audio soundfile can read "
                         f"(WAV, FLAC, Ogg, AIFF): {e}") from e
    if audio.size == 0:
        raise ValueError(f"{what} audio is empty (0 samples)")
    seconds = len(audio) / rate
    if not MIN_SECONDS <= seconds <= max_seconds:
        raise ValueError(f"{what} audio is {seconds:.2f} s long; it must be {MIN_SECONDS}-{max_seconds:g} s")
    mono = audio.mean(axis=1)
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ").astype(np.float32)
    if not np.isfinite(mono).all():
        raise ValueError(f"{what} audio holds NaN or inf samples")
    if float(np.sqrt(np.mean(mono.astype(np.float64) ** 2))) < SILENCE_RMS:
        raise ValueError(f"{what} audio is silent (RMS below -80 dBFS): record the voice to clone")
    return mono
