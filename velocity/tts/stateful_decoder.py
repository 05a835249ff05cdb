"""A stream's chunks through the decoders with each frame's layers computed once.

The chunked decode (AudioDecoder.decode_cut) decodes a chunk of frames [start, end) from the
frames [start - left, end + lookahead): each chunk computes its left context again, in every
layer. Here each layer keeps, per stream, the tail of its input that its next outputs need, and
computes an output position once its input reaches far enough right: `reach` positions past it.
What a chunk's audio needs beyond that frontier (the outputs that read past the lookahead) is
computed as the chunked decode computes it, with the input ending at the lookahead (zeros past
it, each layer's padding). Of those, the positions of the audio out (before the chunk's end) are
kept as they are; the ones after it are computed again, from the layer's kept input, once later
frames arrive. The ISTFT is an overlap-add over the frames a chunk's samples need, divided by the
window's squared sum as torch.istft divides.

So each position is computed once, and once more at most where it lies within a chunk's reach
past its end. Where the lookahead reaches the decoders' exact context, a chunk's audio is the
chunked decode's up to float rounding. Where it falls short, the kept positions differ from the
ones the chunked decode computes again with later frames by the lookahead's own error: the audio
is as near a whole decode as the chunked decode's is (tests/unit/tts/test_streaming_decode.py measures both).
Positions are mel frames (two per GPT frame). `computed` says how many positions each layer
computed, against those a whole decode computes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from velocity.model.networks.convnext import ConvNeXtBlock
from velocity.model.networks.dvae import DVAE
from velocity.model.networks.vocos import Vocos
from velocity.tts.audio_decoder import AudioDecoder, chunk_input
from velocity.tts.chunking import CodeChunk

BUCKET = 8           # a layer's outputs are computed in multiples of this many positions


@dataclass(slots=True)
class Layer:
    """One layer over mel positions: run(window [1, C, n + 2 * reach]) -> [1, C', n]."""
    reach: int
    run: Callable[[torch.Tensor], torch.Tensor]
    cost: int                                     # multiply-adds a position (its weights' size)


def conv_layer(conv: torch.nn.Conv1d, after: Callable | None = None, before: torch.nn.Module | None = None) -> Layer:
    """A Conv1d padded by its reach, run on a window without padding; `before` and `after` are
    position-wise (a 1x1 conv, an activation, a norm)."""
    d, k = conv.dilation[0], conv.kernel_size[0]

    def run(x: torch.Tensor) -> torch.Tensor:
        if before is not None:
            x = before(x)
        y = F.conv1d(x, conv.weight, conv.bias, dilation=d, groups=conv.groups)
        return after(y) if after is not None else y

    cost = conv.weight.numel() + (sum(p.numel() for p in before.parameters()) if before is not None else 0)
    return Layer(d * (k // 2), run, cost)


def block_layer(block: ConvNeXtBlock) -> Layer:
    """A ConvNeXt block: its depthwise conv on the window, the rest on the centre positions."""
    r = block.reach

    def run(x: torch.Tensor) -> torch.Tensor:
        conv = block.dwconv
        y = F.conv1d(x, conv.weight, conv.bias, dilation=conv.dilation[0], groups=conv.groups)
        return block.mix(x[:, :, r:x.shape[-1] - r], y)

    return Layer(r, run, sum(p.numel() for p in block.parameters()))


def layers_of(m: DVAE, vocos: Vocos) -> list[Layer]:
    """The DVAE's (or Decoder's) convolution stack, its out_conv, and Vocos' backbone and head."""
    stack, b = m.decoder, vocos.backbone

    def norm(x: torch.Tensor) -> torch.Tensor:
        return b.norm(x.transpose(1, 2)).transpose(1, 2)

    def head(x: torch.Tensor) -> torch.Tensor:                # -> [1, n_fft + 2, n]
        return vocos.head.out(b.final_layer_norm(x.transpose(1, 2))).transpose(1, 2)

    head_layer = Layer(0, head, vocos.head.out.weight.numel())
    return [conv_layer(stack.conv_in[0], after=stack.conv_in[1]), conv_layer(stack.conv_in[2]),
            *[block_layer(blk) for blk in stack.decoder_block],
            conv_layer(m.out_conv, before=stack.conv_out, after=lambda y: y * m.coef),
            conv_layer(b.embed, after=norm), *[block_layer(blk) for blk in b.convnext], head_layer]


@dataclass
class LayerState:
    """A layer's kept input, positions [start, start + kept.shape[-1]), all final; and its outputs'
    final frontier."""
    kept: torch.Tensor | None = None
    start: int = 0
    out_final: int = 0


@dataclass
class Utterance:
    """One utterance's state: each layer's, the spectrum frames the next chunk's samples need, and
    the GPT frames received so far."""
    layers: list[LayerState]
    frames: int = 0                                # GPT frames received
    emitted: int = 0                               # GPT frames whose audio is out
    spec: torch.Tensor | None = None               # final spectrum frames [1, bins, k] from spec_start
    spec_start: int = 0


class StatefulDecoder:
    """decode(chunk) -> its audio [1, samples], for one stream's chunks in order (a FrameChunker's:
    left context whole, any lookahead); each utterance (sentence) has its own state, freed at its
    last chunk. `computed` totals the positions each layer computed."""

    def __init__(self, decoder: AudioDecoder | "StatefulDecoder", position: int = 0) -> None:
        """decoder: the decoders, or another StatefulDecoder whose layers this one shares (a
        stream's next utterance, another stream). position: the stream's frames before its first
        chunk."""
        if isinstance(decoder, StatefulDecoder):
            self.decoder, self.layers = decoder.decoder, decoder.layers
            self.after, self.costs = decoder.after, decoder.costs
        else:
            self.decoder = decoder
            self.layers = {False: layers_of(decoder.dvae, decoder.vocos)}
            if decoder.decoder is not None:
                self.layers[True] = layers_of(decoder.decoder, decoder.vocos)
            # per layer: the reach of the layers after it (what its outputs must cover past the samples')
            self.after = {k: [sum(layer.reach for layer in v[i + 1:]) for i in range(len(v))]
                          for k, v in self.layers.items()}
            self.costs = [layer.cost for layer in self.layers[False]]     # each layer's share: weighted()
        vocos = self.decoder.vocos
        self.hop, self.n_fft, self.window = vocos.cfg.hop_length, vocos.cfg.n_fft, vocos.window
        self.utt: Utterance | None = None
        self.computed = [0] * len(self.layers[False])        # all utterances' positions, per layer
        self.final_positions = 0                             # mel positions of the audio out
        self.position = position                             # GPT frames of the stream's audio out

    def cost_ratio(self) -> float:
        """Positions computed per audio position, each layer weighted by its cost (1: each once;
        the chunked decode: (left + length + lookahead) / length)."""
        return self.weighted() / max(1, self.final_positions)

    def weighted(self) -> float:
        """The positions computed so far, each layer weighted by its share of the cost (a whole
        decode of n mel positions: n)."""
        return sum(c * n for c, n in zip(self.costs, self.computed)) / sum(self.costs)

    def decode_cut(self, chunk: CodeChunk) -> torch.Tensor:
        """decode() of a FrameChunker's chunk: its audio [1, samples]."""
        return decode_together([self.cut(chunk)])[0]

    def cut(self, chunk: CodeChunk) -> tuple:
        """A FrameChunker's chunk as decode_together takes it."""
        return self, chunk_input(chunk), chunk.context, chunk.length, chunk.last, chunk.start

    def decode(self, x: torch.Tensor, context: int, length: int, last: bool, at: int | None = None) -> torch.Tensor:
        """The next chunk of the stream, as AudioDecoder.decode_chunks takes one: x the frames
        [start - context, end + lookahead) (codes [1, num_vq, T] or hidden states [1, T, H]), of
        which `length` after the context are its own -> their audio [1, length * 512 (- 256 if
        last)]. Only the frames after those already seen are read. at: the chunk's first frame in
        the stream (CodeChunk.start), checked against the frames decoded so far."""
        return decode_together([(self, x, context, length, last, at)])[0]

    def fits(self, x: torch.Tensor, context: int, at: int | None) -> bool:
        """Whether a chunk continues this stream where its decoder is (nothing is changed)."""
        start, seen = (self.utt.emitted, self.utt.frames) if self.utt is not None else (0, 0)
        hi = start + x.shape[1 if x.is_floating_point() else 2] - context    # its frames reach this far
        return (at is None or at == self.position) and context <= start and hi >= seen

    def _begin(self, x: torch.Tensor, context: int, length: int, last: bool, at: int | None) -> "_Pass":
        """A chunk's decode under way: its first layer's input, before the layers."""
        if not self.fits(x, context, at):
            raise ValueError(f"a chunk out of order: context {context}, starting at frame {at} of the stream's audio "
                             f"at {self.position} (a stream's chunks, each once, in order)")
        hidden = x.is_floating_point()
        if self.utt is None:
            self.utt = Utterance([LayerState() for _ in self.layers[hidden]])
        u = self.utt
        start = u.emitted                                    # the chunk's first frame in its utterance
        hi = start + x.shape[1 if hidden else 2] - context   # its frames reach this far
        new = hi - u.frames                                  # frames not seen before
        feats = None
        if new:                                              # the first layer's input, 2 mel positions a frame
            m, tail = self.decoder.model_input(x[:, -new:] if hidden else x[:, :, -new:])
            feats = m.features(tail)
        u.frames = hi
        cut = 2 * hi                                         # mel positions known (the input ends here)
        return _Pass(self, u, hidden, start, start + length, cut, last, feats, None, cut)

    def _window(self, p: "_Pass", i: int) -> tuple[torch.Tensor, int]:
        """Layer i's input window for the chunk `p` (its padding included) and the outputs it wants.
        The outputs this chunk's samples need: the ISTFT's frames to 2 past its end, and each later
        layer's reach; the final ones, which later chunks read, whatever they are: those whose
        input is final, and those before the chunk's end, which its audio read. The layer's
        input ends at the cut (zeros past it, as the chunked decode pads)."""
        layer, st, cut = self.layers[p.hidden][i], p.u.layers[i], p.cut
        done = cut if p.last else max(st.out_final, min(cut, p.frontier - layer.reach))
        want = max(done, min(cut, 2 * p.end + 2 + self.after[p.hidden][i]))
        p.done = max(done, min(want, 2 * p.end))
        r = layer.reach
        if p.final is not None and (st.kept is None or p.final.shape[-1]):
            st.kept = p.final if st.kept is None else torch.cat([st.kept, p.final], dim=-1)
        lo, hi = st.out_final - r, min(cut, want + r)        # the input positions the outputs read
        parts = [st.kept[:, :, max(lo, 0) - st.start:]]
        if p.spec is not None and p.spec.shape[-1]:
            parts.append(p.spec)
        window = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        window = window[:, :, :hi - max(lo, 0)]
        n = want - st.out_final                              # the outputs wanted: [out_final, want)
        # zeros before the utterance and past the cut; then, past 4 * BUCKET outputs, to a multiple
        # of BUCKET, whose extra ones are dropped: fewer shapes, fewer cached kernels and buffers
        extra = -n % BUCKET if n > 4 * BUCKET else 0
        self.computed[i] += n + extra                       # what it computed, the extra ones too
        return F.pad(window, (max(0, -lo), want + r - hi + extra)), n

    def _keep(self, p: "_Pass", i: int, out: torch.Tensor) -> None:
        """Layer i's outputs [out_final, want) for the chunk `p`: the final ones and the speculative
        ones after them are the next layer's input."""
        st, r = p.u.layers[i], self.layers[p.hidden][i].reach
        p.final, p.spec = out[:, :, :p.done - st.out_final], out[:, :, p.done - st.out_final:]
        st.out_final = p.frontier = p.done
        keep = max(0, p.done - r - st.start)                 # the next window starts at done - r
        st.kept, st.start = st.kept[:, :, keep:], st.start + keep

    def _finish(self, p: "_Pass") -> torch.Tensor:
        """The chunk's audio, after its last layer."""
        audio = self._istft(p.u, p.final, p.spec, p.frontier, p.cut, 2 * p.start, 2 * p.end, p.last)
        length = p.end - p.start
        p.u.emitted = p.end
        self.final_positions += 2 * length
        self.position += length
        if p.last:
            self.utt = None
        return audio

    def _istft(self, u: Utterance, final, spec, frontier: int, cut: int, s0: int, s1: int, last: bool) -> torch.Tensor:
        """The samples of mel positions [s0, s1) (half a frame fewer at the utterance's end) from
        the spectrum frames around them: overlap-add of the windowed inverse FFTs, over the window's
        squared sum, as torch.istft(center=True)."""
        x = final if u.spec is None else torch.cat([u.spec, final], dim=-1)
        frames = torch.cat([x, spec], dim=-1) if spec is not None and spec.shape[-1] else x
        first = u.spec_start                                 # frames[..., 0] is this spectrum frame
        hop, n_fft, pad = self.hop, self.n_fft, self.n_fft // 2
        fa, fb = max(0, s0 - 1), min(cut, s1 + 2)            # the frames the samples [s0, s1) * hop need
        mag, phase = frames[:, :, fa - first:fb - first].float().chunk(2, dim=1)
        spec_c = torch.polar(torch.exp(mag).clamp(max=1e2), phase)            # [1, bins, n]
        win = self.window
        y = torch.fft.irfft(spec_c, n=n_fft, dim=1) * win[None, :, None]      # [1, n_fft, n]
        n = fb - fa
        size = (n - 1) * hop + n_fft
        ola = F.fold(y, (1, size), (1, n_fft), stride=(1, hop))[:, 0, 0]      # [1, size]
        env = F.fold(win.pow(2)[None, :, None].expand(1, n_fft, n), (1, size), (1, n_fft), stride=(1, hop))[:, 0, 0]
        origin = fa * hop - pad                              # the sample ola[0] is
        a = s0 * hop - origin
        b = s1 * hop - origin - (hop if last else 0)
        audio = ola[:, a:b] / env[:, a:b]
        keep = min(max(0, s1 - 1 - first), x.shape[-1])     # from the next chunk's first needed frame
        u.spec, u.spec_start = x[:, :, keep:], first + keep
        return audio


@dataclass(slots=True)
class _Pass:
    """One chunk's decode under way: its stream's decoder and utterance, and the layer input
    (its final and speculative parts) that the next layer takes."""
    dec: StatefulDecoder
    u: Utterance
    hidden: bool
    start: int                   # the chunk's first and end frame in its utterance
    end: int
    cut: int                     # mel positions known (the input ends here)
    last: bool
    final: torch.Tensor | None
    spec: torch.Tensor | None
    frontier: int
    done: int = 0                # the layer under way's final outputs end here


@torch.inference_mode()
def decode_together(chunks: list[tuple]) -> list[torch.Tensor]:
    """Several streams' next chunks, each (decoder, x, context, length, last, at) as
    StatefulDecoder.decode takes them, through each layer at once: the windows, right-padded
    with zeros to the longest (past each one's own padding, which its outputs do not read),
    stacked into one batch -> each chunk's audio [1, samples]. The decoders are distinct (a
    stream's chunks go in order, one a call) and share their layers, and the chunks are all codes
    or all hidden states."""
    passes = [dec._begin(*args) for dec, *args in chunks]
    first = passes[0]
    assert len({id(p.dec) for p in passes}) == len(passes) and all(
        p.dec.layers is first.dec.layers and p.hidden == first.hidden for p in passes)
    for i, layer in enumerate(first.dec.layers[first.hidden]):
        windows = [p.dec._window(p, i) for p in passes]
        width = max(w.shape[-1] for w, _ in windows)
        outs = [layer.run(windows[0][0])] if len(windows) == 1 else \
            layer.run(torch.cat([F.pad(w, (0, width - w.shape[-1])) for w, _ in windows])).split(1)
        for p, (_, n), out in zip(passes, windows, outs):
            p.dec._keep(p, i, out[:, :, :n])
    return [p.dec._finish(p) for p in passes]
