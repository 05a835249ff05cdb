"""Audio chunks (float32, 24 kHz mono) -> the bytes of a response format, incrementally: each
chunk's bytes leave as soon as the encoder has them. PyAV (FFmpeg) encodes mp3, opus (Ogg),
aac (ADTS) and flac; wav is a header with the 0xFFFFFFFF "size unknown" convention of streamed
WAV, then 16-bit PCM; pcm is the bare 16-bit little-endian samples, at another rate if asked
(`pcm_rate`: FFmpeg's resampler, its state kept from chunk to chunk).

    enc = Encoder("mp3", 24000)
    try:
        for chunk in chunks: yield enc.push(chunk)
        yield enc.finish()
    finally:
        enc.close()              # a hang-up too: the codec's threads go now
"""
from __future__ import annotations

import struct

import numpy as np

FORMATS = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
           "wav": "audio/wav", "pcm": "audio/pcm"}
# response_format -> (FFmpeg muxer, encoder, the rate it encodes at (0: the audio's; Ogg Opus is
# 48 kHz), samples per frame it takes: known before the encoder opens, which is at the first frame)
CODECS = {"mp3": ("mp3", "libmp3lame", 0, 1152), "opus": ("ogg", "libopus", 48000, 960), "aac": ("adts", "aac", 0, 1024),
          "flac": ("flac", "flac", 0, 4608)}


def pcm16(audio: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> 16-bit little-endian PCM (clipped)."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header whose sizes say "unknown" (0xFFFFFFFF): for a stream of unknown length."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + b"data" + struct.pack("<I", 0xFFFFFFFF))


class _Sink:
    """A write-only, non-seekable file for PyAV: collects what the muxer writes until taken."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class Encoder:
    """One response's encoder; push(chunk) -> the bytes ready now, finish() -> the rest.
    pcm_rate: pcm at this rate (0: the audio's)."""

    def __init__(self, fmt: str, rate: int, pcm_rate: int = 0) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"response_format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        self.fmt, self.rate, self.started = fmt, rate, False
        self.pcm_resampler = None
        if fmt == "pcm" and pcm_rate and pcm_rate != rate:
            import av

            self.pcm_resampler = av.AudioResampler(format="s16", layout="mono", rate=pcm_rate)
        if fmt in CODECS:
            import av

            muxer, codec, out_rate, self.frame_size = CODECS[fmt]
            self.sink = _Sink()
            # Ogg: a page per packet (page_duration, µs), not per second: bytes leave with each chunk
            self.container = av.open(self.sink, mode="w", format=muxer,
                                     container_options={"page_duration": "20000"} if muxer == "ogg" else None)
            self.stream = self.container.add_stream(codec, rate=out_rate or rate, layout="mono")
            cc = self.stream.codec_context
            self.fifo = av.AudioFifo()
            self.resampler = av.AudioResampler(format=cc.format.name, layout="mono", rate=out_rate or rate)

    def _frame(self, audio: np.ndarray):
        import av

        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, np.float32)[None], format="flt", layout="mono")
        frame.sample_rate = self.rate
        return frame

    def _resampled_pcm(self, frame) -> bytes:
        """16-bit pcm at the asked rate of a frame (None: what the resampler still holds); float ->
        s16 by FFmpeg here (its rounding)."""
        return b"".join(f.to_ndarray().astype("<i2").tobytes() for f in self.pcm_resampler.resample(frame))

    def push(self, audio: np.ndarray) -> bytes:
        if self.pcm_resampler is not None:
            return self._resampled_pcm(self._frame(np.clip(audio, -1.0, 1.0)))
        if self.fmt in ("wav", "pcm"):
            head = wav_header(self.rate) if self.fmt == "wav" and not self.started else b""
            self.started = True
            return head + pcm16(audio)
        for f in self.resampler.resample(self._frame(audio)):
            self.fifo.write(f)
        self._encode(self.frame_size)
        return self.sink.take()

    def _encode(self, size: int) -> None:
        while self.fifo.samples >= size:
            for packet in self.stream.encode(self.fifo.read(size)):
                self.container.mux(packet)

    def finish(self) -> bytes:
        """Flush the encoder and close the container (its trailer); the last bytes."""
        if self.pcm_resampler is not None:
            return self._resampled_pcm(None)
        if self.fmt == "wav" and not self.started:
            self.started = True
            return wav_header(self.rate)
        if self.fmt in ("wav", "pcm"):
            return b""
        for f in self.resampler.resample(None):          # what the resampler still holds
            self.fifo.write(f)
        self._encode(self.frame_size)
        if self.fifo.samples:                            # a shorter last frame (these encoders take one)
            for packet in self.stream.encode(self.fifo.read()):
                self.container.mux(packet)
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.close()
        return self.sink.take()

    def close(self) -> None:
        """Free the encoder now (FFmpeg's codec holds threads of its own until then), whatever is
        left unencoded: at every end of a response, a hang-up too. Once is enough."""
        container, self.container = getattr(self, "container", None), None
        if container is not None:
            try:
                container.close()
            except Exception:     # noqa: BLE001 - a half-written stream nobody reads: nothing to save
                pass
            self.stream = self.fifo = self.resampler = None
        self.pcm_resampler = None
