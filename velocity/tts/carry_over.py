"""Voice carry-over, as the reference speaks a text of several pieces without a voice sample: the
first sentence is generated on its own first; its audio, decoded whole, becomes a voice sample
(Chat.sample_audio_speaker: the DVAE encoder's codes) that every sentence, the first again, is
spoken with, the first sentence's text as the sample's transcript. So the voice stays the same
from sentence to sentence. It costs the first sentence twice, and the first audio waits for it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from velocity.tts.audio_decoder import AudioDecoder
from velocity.tts.sentence_stream import Carry
from velocity.tts.speaker import sample_frames
from velocity.tts.voice_sample import VoiceEncoder


class VoiceCarrier:
    """A sentence's frames (with their hidden states on the Decoder path) -> the frames of the
    voice sample made of its audio (`sample`), and the Carry plan of a request (`plan`)."""

    def __init__(self, decoder: AudioDecoder, encoder: VoiceEncoder) -> None:
        self.decoder, self.encoder = decoder, encoder

    @classmethod
    def load(cls, folder: str | Path, decoder: AudioDecoder | None = None) -> "VoiceCarrier":
        """The release's DVAE encoder side, and its decoders (given, or loaded here on the CPU)."""
        if decoder is None:
            decoder = AudioDecoder.load(folder, pack=False)
        encoder = VoiceEncoder(folder)
        encoder.dvae            # loaded here with the decoders, not at the first carried request
        return cls(decoder, encoder)

    @torch.inference_mode()
    def sample(self, frames: list[tuple[int, ...]], hidden: list[np.ndarray] | None) -> list[tuple[int, ...]]:
        """The first sentence's frames (and hidden-state rows [H]) -> its whole audio (one utterance,
        as the reference's _decode_to_wavs) -> the sample's codes -> the frames after each prompt."""
        if hidden:
            x = torch.from_numpy(np.stack(hidden))[None]                      # hidden: [1, T, H]
        else:
            x = torch.tensor(frames, dtype=torch.long).T[None]                # codes: [1, num_vq, T]
        audio = self.decoder.decode(x)[0].float().cpu().numpy()
        return sample_frames(self.encoder.encode(audio))

    def plan(self, prompts: list[list[int]]) -> Carry:
        """prompts: each sentence's audio prompt with the first sentence's text as the sample's
        transcript (TextFrontend.encode(..., sample_text=that text)), before the sample's frames."""
        return Carry(prompts, self.sample)
