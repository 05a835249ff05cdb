"""A voice from a sample: a recording -> 24 kHz mono audio -> the DVAE encoder's codes -> the
reference's sample string (its `spk_smp`). With the recording's transcript (`txt_smp`) in the
prompt and its frames after the text, the GPT goes on in that voice.
The command `velocity-tts-voice` (client/voice.py) makes the string offline.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from velocity.model.networks.dvae_config import DVAEConfig
from velocity.tts.audio_file import SAMPLE_RATE, looks_like_audio, read_audio
from velocity.tts.speaker import SpeakerError, decode_sample


class VoiceEncoder:
    """The release's DVAE encoder side: 24 kHz audio -> codes [num_vq, T] (Chat.sample_audio_speaker
    before compression), and sample strings read and checked for the model. The encoder loads at
    the first recording to encode: a sample string needs only the codebooks' shape."""

    def __init__(self, folder: str | Path, max_seconds: float = 20.0) -> None:
        cfg, self.folder = DVAEConfig(), Path(folder)
        self.num_vq, self.num_codes = cfg.num_vq, cfg.num_codes
        self.max_seconds = max_seconds
        self.max_frames = int(max_seconds * SAMPLE_RATE / 512) + 1
        self._dvae = None

    @property
    def dvae(self):
        """velocity.model.networks.dvae.DVAE with its encoder side, loaded at the first use."""
        if self._dvae is None:
            from velocity.model.loading.audio_models import load_dvae

            self._dvae = load_dvae(self.folder, encoder=True)
        return self._dvae

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """24 kHz mono float32 audio -> codes [num_vq, T] (int64)."""
        import torch

        dvae = self.dvae
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
            return dvae.encode(x).numpy().astype(np.int64)

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
