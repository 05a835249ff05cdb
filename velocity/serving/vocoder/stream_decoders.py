"""The vocoder's stateful decoders, one per stream (velocity.tts.stateful_decoder): a stream's
chunk goes through its own, which keeps each layer's input tail between the stream's chunks, so
that no chunk decodes its left context again (only the positions within reach past the last
chunk's end). Several streams' chunks, one each, go through their decoders' layers at once
(decode_together).

A stream's decoder lives for one utterance (sentence): made at its first chunk, freed at its
last (`last`), and dropped when the stream is over otherwise: its client left, a chunk failed,
the llm ended or closed it (`sweep`, on the stream board). At most `limit` are held: past it the
oldest is dropped (its stream's next chunk is then refused as out of order, and the stream ends
with that error). Chunks without a stream (a direct caller of the vocoder) and the GPU, which
batches chunks across streams instead, take the chunked decode. Free of Triton.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

import torch

from velocity.serving.vocoder.jobs import Job, same_shape
from velocity.tts.audio_decoder import AudioDecoder
from velocity.tts.stateful_decoder import StatefulDecoder, decode_together

log = logging.getLogger("velocity.vocoder")


class StreamDecoders:
    """stream reference -> its utterance's StatefulDecoder (`on`: else every chunk takes the
    chunked decode). decode runs on the vocoder's decode thread; drop and sweep may run beside it."""

    def __init__(self, decoder: AudioDecoder, limit: int, on: bool = True,
                 held: Callable[[int], None] = lambda n: None) -> None:
        """held(n): told how many decoders are held whenever that changes (a gauge's set)."""
        self.decoder, self.on, self.tell = decoder, on, held
        self.shared = StatefulDecoder(decoder) if on else None   # the layers every stream's decoder shares
        self.limit = max(1, limit)
        self.held: OrderedDict[int, StatefulDecoder] = OrderedDict()
        self.lock = threading.Lock()

    def claim(self, stream: int, x: torch.Tensor, context: int, start: int) -> StatefulDecoder | None:
        """The decoder a stream's chunk goes through: a new one at an utterance's first chunk
        (context 0; `start` its first frame in the stream), else the one its stream holds if the
        chunk follows on from it. None: the chunked decode instead, for a later chunk of a stream
        whose decoder was dropped (its client's cancel raced the decode) or one that does not follow
        on, so that it cannot fail the other streams decoded beside it."""
        with self.lock:
            dec = self.held.get(stream)
            if dec is not None and not dec.fits(x, context, start):
                log.warning("vocoder: stream %d's chunk at frame %d does not follow its decoder's: chunked decode",
                            stream, start)
                del self.held[stream]
                self.tell(len(self.held))
                return None
            if dec is None and context > 0:
                return None
            if dec is None:
                while len(self.held) >= self.limit:
                    old, _ = self.held.popitem(last=False)
                    log.warning("vocoder: over %d stream decoders held: stream %d's dropped", self.limit, old)
                dec = self.held[stream] = StatefulDecoder(self.shared, position=start)
                self.tell(len(self.held))
            return dec

    def decode(self, chunks: list[tuple]) -> tuple[list[torch.Tensor], float]:
        """Streams' chunks, each (its decoder (claim), stream, x [1, ...] as decode_chunks takes it,
        context, length, last, start: its first frame in the stream), a stream at most once, through
        their decoders together (decode_together) -> (each one's audio [1, samples], the GPT frames
        the decode cost: positions computed, each layer weighted by its cost, over two)."""
        decs = [d for d, *_ in chunks]
        before = sum(d.weighted() for d in decs)
        try:
            audio = decode_together([(d, x, context, length, last, start)
                                     for d, _, x, context, length, last, start in chunks])
        except Exception:
            for _, stream, *_ in chunks:
                self.drop(stream)
            raise
        for _, stream, *_, last, _ in chunks:
            if last:
                self.drop(stream)
        return audio, (sum(d.weighted() for d in decs) - before) / 2

    def batch_key(self, job: Job) -> tuple | None:
        """What queued jobs decoded in one call share: on, streams' chunks of one path (codes or
        hidden states) through their stateful decoders at once (decode_together), a first chunk
        only beside other first chunks (it is not held up by later ones); else protocol.same_shape."""
        c = job.chunk
        if self.on and c.stream and job.error is None and c.x.shape[0] == 1:
            return "stream", c.hidden is None, c.number == 0
        return same_shape(job)

    @staticmethod
    def one_of(job: Job) -> int | None:
        """A stream's chunks go one a call (in order): the queue takes at most one job of each
        stream; chunks of no stream (a direct caller's, None) any number."""
        return job.chunk.stream or None

    def drop(self, stream: int) -> None:
        with self.lock:
            if self.held.pop(stream, None) is not None:
                self.tell(len(self.held))

    def sweep(self, gone: Callable[[int], bool]) -> int:
        """Drop the decoders of streams that are over (gone(stream): the stream board's); returns
        how many are held."""
        with self.lock:
            if over := [s for s in self.held if gone(s)]:
                for stream in over:
                    del self.held[stream]
                self.tell(len(self.held))
            return len(self.held)

    def decode_chunks(self, chunks: list, device: torch.device) -> tuple[list[torch.Tensor], float]:
        """Each chunk's audio [b, samples] (chunks: velocity.serving.wire.protocol.CodeChunkIn) and the
        GPT frames the decode cost: a stream's chunk through its own stateful decoder (when on),
        the others together through the chunked decode, which costs each one its frames."""
        xs = [torch.from_numpy(c.x).to(device) for c in chunks]
        out: list[torch.Tensor | None] = [None] * len(chunks)
        frames = 0.0
        if self.on:
            claimed = {i: self.claim(c.stream, x, c.context, c.start) for i, (c, x) in enumerate(zip(chunks, xs))
                       if c.stream and x.shape[0] == 1}
            mine = [i for i, d in claimed.items() if d is not None]
            if mine:
                audio, frames = self.decode([(claimed[i], chunks[i].stream, xs[i], chunks[i].context,
                                              chunks[i].length, chunks[i].last, chunks[i].start) for i in mine])
                for i, a in zip(mine, audio):
                    out[i] = a
        rest = [i for i, a in enumerate(out) if a is None]
        if rest:
            audio = self.decoder.decode_chunks([(xs[i], chunks[i].context, chunks[i].length, chunks[i].last)
                                                for i in rest], len(rest))
            for i, a in zip(rest, audio):
                out[i] = a
                frames += xs[i].shape[0] * xs[i].shape[2 if chunks[i].hidden is None else 1]
        return out, frames
