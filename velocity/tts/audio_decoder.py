"""Audio from GPT frames: the decoders (DVAE or Decoder, then Vocos), whole or chunk by chunk, the
chunks seamless with a whole decode.

A chunk of frames [start, end) is decoded from the codes (or, on the Decoder path, the GPT
hidden states) of frames [start - left, end + lookahead) and only its own samples
[start * 512, end * 512) are kept (the utterance's last chunk 256 fewer, as a whole decode).
With left and lookahead at the decoders' receptive field (`exact_context`), the concatenated
chunks equal a whole-utterance decode up to float rounding; smaller values trade exactness for latency (bounds measured in
tests/unit/tts/test_streaming_decode.py and stated in docs/benchmarks.md).
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from velocity.model.networks.dvae import DVAE
from velocity.model.networks.vocos import Vocos
from velocity.tts.chunking import ChunkSchedule, CodeChunk, FrameChunker

log = logging.getLogger("velocity.vocoder")

DECODERS = ("hidden", "codes")     # the reference's use_decoder=True (its default) and use_decoder=False


def exact_context(dvae: DVAE, vocos: Vocos) -> int:
    """GPT frames of context each side that make chunked decoding exact.

    DVAE and Vocos convolutions read `reach` mel frames each side, the ISTFT (centered,
    n_fft / hop = 4) two more; one GPT frame is two mel frames."""
    mel = dvae.reach + vocos.reach + vocos.cfg.n_fft // vocos.cfg.hop_length // 2
    return -(-mel // 2)


def default_decode_batch(device: torch.device) -> int:
    """Chunks decoded in one call: on a GPU a call costs about what one chunk does (kernel
    launches); on CPU a batch of the chunked decode costs what its chunks do one by one and only
    delays the first, and streams' chunks through their stateful decoders together (more chunks a
    second) give each stream's audio only within float32's rounding of its own (the convolutions
    sum in another order for another batch): one a call keeps a stream's audio its own whatever
    else is decoded (docs/benchmarks.md, "The vocoder's streams together")."""
    return 32 if device.type == "cuda" else 1


VocoderInput = tuple   # (x, context, length, last): x codes [b, num_vq, T] (integers) or hidden [b, T, H] (floats)


class AudioDecoder:
    """codes -> DVAE, or GPT hidden states -> Decoder; then Vocos -> waveform.
    samples_per_frame = 2 mel frames * hop. A whole decode of T frames gives T * 512 - 256
    samples, as the reference's (its ISTFT drops the last half hop pair); chunks give
    length * 512 each, the last one of an utterance 256 fewer, so they join to exactly that."""

    def __init__(self, dvae: DVAE, vocos: Vocos, decoder: DVAE | None = None) -> None:
        self.dvae, self.vocos, self.decoder = dvae, vocos, decoder
        self.samples_per_frame = 2 * vocos.cfg.hop_length
        self.sample_rate = vocos.cfg.sample_rate
        self.frames_per_second = self.sample_rate / self.samples_per_frame
        self.exact_context = max(exact_context(m, vocos) for m in (dvae, decoder) if m is not None)
        self.num_vq, self.num_codes = dvae.cfg.num_vq, dvae.cfg.num_codes     # codes in [0, num_codes)
        self.hidden_size = 2 * decoder.cfg.idim if decoder is not None else 0   # the Decoder's input

    @classmethod
    def load(cls, folder, device: torch.device = torch.device("cpu"), quantize: str = "none",
             pack: bool = True, cpu_kernel: bool = True) -> "AudioDecoder":
        """The release folder's DVAE, Vocos and Decoder on `device`, their linears as quantize()
        makes them (the default: packed float32 where the device allows)."""
        from velocity.model.loading.audio_models import load_decoder, load_dvae, load_vocos

        dec = cls(load_dvae(folder, device), load_vocos(folder, device), load_decoder(folder, device))
        if n := dec.quantize(quantize, pack=pack, cpu_kernel=cpu_kernel):
            log.info("decoders: %d ConvNeXt linears on %s weights", n, "int8" if quantize == "int8" else "packed")
        return dec

    def quantize(self, mode: str, pack: bool = True, cpu_kernel: bool = True) -> int:
        """mode "int8": the ConvNeXt linears on int8 (quantize_int8); "none": with `pack`, on packed
        float32 weights where the device allows (CPU, float32: the C++ f32_gemm where cpu_kernel
        and it is built, else oneDNN's; both faster than MKL's, docs/benchmarks.md; the same
        arithmetic in another order, about 120 dB from the plain decode). Returns how many linears
        changed."""
        if mode not in ("none", "int8"):
            raise ValueError(f"the vocoder's quantize (VELOCITY_VOCODER_QUANTIZE) must be none or int8, got {mode!r}")
        if mode == "int8":
            return self.quantize_int8(cpu_kernel)
        from velocity.model.networks.convnext import ConvNeXtBlock
        from velocity.model.kernels.cpu_kernels import kernels
        from velocity.model.layers.packed_linear import can_pack, packer, replace_linears_in
        p = next(self.vocos.parameters())
        if not (pack and can_pack(p.device, p.dtype)):
            return 0
        make = packer(kernels() if cpu_kernel else None, rows_hint=128)
        return sum(replace_linears_in(m, ConvNeXtBlock, make) for m in (self.dvae, self.decoder, self.vocos)
                   if m is not None)

    def quantize_int8(self, cpu_kernel: bool = True) -> int:
        """The ConvNeXt blocks' linears (most of the decoders' work) on int8 weights with per-row int8
        activations (velocity.model.layers.int8_linear), on the C++ int8_gemm where cpu_kernel and it
        is built for this CPU's row width (else fbgemm's op, which it equals within float rounding):
        faster on CPU, and its audio against the float32 decode's is in docs/benchmarks.md "int8 on
        CPU". Returns how many."""
        from velocity.model.kernels.cpu_kernels import kernels
        from velocity.model.networks.convnext import ConvNeXtBlock
        from velocity.model.layers.int8_linear import quantize_linears, require_int8
        p = next(self.vocos.parameters())
        require_int8(p.device, p.dtype, "the vocoder", "VELOCITY_VOCODER_QUANTIZE")
        K = kernels() if cpu_kernel else None
        return sum(quantize_linears(m, ConvNeXtBlock, K) for m in (self.dvae, self.decoder, self.vocos) if m is not None)

    def model_input(self, x: torch.Tensor) -> tuple[DVAE, torch.Tensor]:
        """codes [B, num_vq, T] or hidden [B, T, H] -> (the DVAE or the Decoder, x as it takes it:
        [B, num_vq, T] or [B, H, T], on its device and in its dtype)."""
        dev = next(self.vocos.parameters()).device
        if x.is_floating_point():
            if self.decoder is None:
                raise ValueError("hidden states given, but no Decoder is loaded")
            return self.decoder, x.to(dev, next(self.decoder.parameters()).dtype).transpose(1, 2)
        return self.dvae, x.to(dev)

    @torch.inference_mode()
    def _audio(self, x: torch.Tensor) -> torch.Tensor:
        """codes [B, num_vq, T] or hidden [B, T, H] -> audio [B, T * 512]"""
        m, x = self.model_input(x)
        return self.vocos(m(x))

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """A whole utterance: codes [B, num_vq, T] or hidden [B, T, H] -> audio [B, T * 512 - 256]"""
        return self._audio(x)[:, :-(self.samples_per_frame // 2)]

    def decode_chunks(self, chunks: list[VocoderInput], max_batch: int = 1) -> list[torch.Tensor]:
        """[(x, context, length, last)] -> each chunk's audio [b, length * 512 (- 256 if last)], in
        order. Chunks of one kind and T are decoded together, up to max_batch chunks per call."""
        out: list[torch.Tensor | None] = [None] * len(chunks)
        groups: dict[tuple, list[int]] = {}
        for i, (x, *_) in enumerate(chunks):
            groups.setdefault((x.is_floating_point(), x.shape[1:]), []).append(i)
        n, step = self.samples_per_frame, max(1, max_batch)
        for rows in groups.values():
            for s in range(0, len(rows), step):
                part = rows[s:s + step]
                audio = self._audio(torch.cat([chunks[i][0] for i in part]))          # [sum b, T * 512]
                row = 0
                for i in part:
                    x, ctx, length, last = chunks[i]
                    out[i] = audio[row:row + x.shape[0], ctx * n:(ctx + length) * n - (n // 2 if last else 0)]
                    row += x.shape[0]
        return out

    def decode_cut(self, chunks: list[CodeChunk], max_batch: int = 1) -> list[torch.Tensor]:
        """decode_chunks for the chunks a FrameChunker cut: each one's audio [1, samples]."""
        return self.decode_chunks([(chunk_input(c), c.context, c.length, c.last) for c in chunks], max_batch)


def chunk_input(c: CodeChunk) -> torch.Tensor:
    """What the chunk is decoded from: its hidden states [1, T, H] if it has them, else codes [1, num_vq, T]."""
    if c.hidden is not None:
        return torch.from_numpy(np.stack(c.hidden))[None]
    return torch.tensor(c.codes, dtype=torch.long).T[None]


class StreamingDecoder:
    """Feed frames as they are generated; get each chunk's audio as soon as its lookahead exists."""

    def __init__(self, decoder: AudioDecoder, schedule: ChunkSchedule = ChunkSchedule(),
                 left: int | None = None, lookahead: int | None = None) -> None:
        self.decoder = decoder
        self.chunker = FrameChunker(schedule, decoder.exact_context if left is None else left,
                                    decoder.exact_context if lookahead is None else lookahead)

    def cut(self, frames: list[tuple[int, ...]], final: bool = False,
            hidden: np.ndarray | None = None) -> list[CodeChunk]:
        """Add frames (and their hidden states, for the Decoder path); returns the chunks now
        complete, not yet decoded (to decode with others). final: the utterance ends here."""
        return self.chunker.push(frames, hidden) + (self.chunker.finish() if final else [])

    def push(self, frames: list[tuple[int, ...]], final: bool = False,
             hidden: np.ndarray | None = None) -> list[tuple[int, torch.Tensor]]:
        """Add frames; returns [(chunk index, audio [samples])] for every chunk now complete."""
        chunks = self.cut(frames, final, hidden)
        return [(c.index, a[0]) for c, a in zip(chunks, self.decoder.decode_cut(chunks))]
