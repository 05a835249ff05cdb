"""A voice from a sample: a recording -> 24 kHz mono audio -> the DVAE encoder's codes -> the
reference's sample string (its `spk_smp`). With the recording's transcript (`txt_smp`) in the
prompt and its frames after the text, the GPT goes on in that voice.
The command `velocity-tts-voice` (client/voice.py) makes the string offline.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from velocity.tts.speaker import SpeakerError, decode_sample, encode_sample

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


class VoiceEncoder:
    """The release's DVAE encoder side: 24 kHz audio -> codes [num_vq, T] (Chat.sample_audio_speaker
    before compression), and sample strings read and checked for the model."""

    def __init__(self, folder: str | Path, max_seconds: float = 20.0) -> None:
        from velocity.model.audio_models import load_dvae

        self.dvae = load_dvae(folder, encoder=True)
        cfg = self.dvae.cfg
        self.num_vq = cfg.groups * cfg.residuals
        self.num_codes = int(np.prod(cfg.levels))
        self.max_seconds = max_seconds
        self.max_frames = int(max_seconds * SAMPLE_RATE / 512) + 1

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> np.ndarray:
        """24 kHz mono float32 audio -> codes [num_vq, T] (int64)."""
        return self.dvae.encode(torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))).numpy().astype(np.int64)

    def sample_codes(self, data: bytes | str, what: str = "SPEAKER_SAMPLE") -> np.ndarray:
        """A sample string, or an audio file's bytes -> codes [num_vq, T]; ValueError naming `what`."""
        if isinstance(data, bytes) and looks_like_audio(data):
            return self.encode(read_audio(data, self.max_seconds, what))
        try:
            s = data.decode("utf-8") if isinstance(data, bytes) else data
        except UnicodeDecodeError as e:
            raise ValueError(f"{what} is neither a sample string nor a WAV, FLAC, Ogg or AIFF file") from e
        try:
            return decode_sample(s, self.num_vq, self.num_codes, self.max_frames)
        except SpeakerError as e:
            raise ValueError(str(e)) from e
