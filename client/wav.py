"""The client's WAV output: a file, or a stream to stdout that cannot seek (WavStream)."""
from __future__ import annotations

import struct
import sys

import numpy as np

SAMPLE_RATE = 24000                 # the release's (the server's Vocos); the WAV's rate
WAV_FORMATS = {"pcm16": "PCM_16", "float": "FLOAT"}      # --format -> soundfile subtype


class WavStream:
    """A WAV of unknown length written as it comes to a stream that cannot seek (stdout): its
    header's sizes are 0xFFFFFFFF, as ffmpeg and sox write to a pipe (soundfile needs to seek)."""

    def __init__(self, out, subtype: str) -> None:
        self.out, self.subtype = out, subtype
        bits, tag = (16, 1) if subtype == "PCM_16" else (32, 3)          # PCM or IEEE float
        block = bits // 8
        self.out.write(b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt "
                       + struct.pack("<IHHIIHH", 16, tag, 1, SAMPLE_RATE, SAMPLE_RATE * block, block, bits)
                       + b"data" + struct.pack("<I", 0xFFFFFFFF))

    def write(self, audio: np.ndarray) -> None:
        """The samples as soundfile writes them into a file (the same rounding)."""
        import io

        import soundfile as sf
        buf = io.BytesIO()
        sf.write(buf, audio, SAMPLE_RATE, subtype=self.subtype, format="RAW", endian="LITTLE")
        self.out.write(buf.getvalue())

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        self.flush()


def open_wav(path: str, subtype: str):
    """The WAV file at path, or a WavStream to stdout for "-"."""
    import soundfile as sf
    return WavStream(sys.stdout.buffer, subtype) if path == "-" else sf.SoundFile(path, "w", SAMPLE_RATE, 1, subtype)
