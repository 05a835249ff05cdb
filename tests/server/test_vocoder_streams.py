"""The vocoder's stateful decoders, one per stream (velocity.serving.vocoder.stream_decoders): each
stream's chunks, interleaved with other streams', as the stream alone gives them (its audio
against the chunked decode's: tests/unit/tts/test_streaming_decode.py); a decoder
freed at its utterance's last chunk, when its stream is over (the board's sweep), on a failed
chunk, and past the limit; and, through the server, none held once the work is done. Freed on
a client's cancel: tests/triton_server.assert_work_stops, which every hang-up test runs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from checkpoints import tiny_checkpoint
from velocity.model.loading.audio_models import load_decoder, load_dvae, load_vocos
from velocity.serving.wire.protocol import CodeChunkIn
from velocity.serving.vocoder.stream_decoders import StreamDecoders
from velocity.tts.audio_decoder import AudioDecoder, StreamingDecoder
from velocity.tts.chunking import ChunkSchedule


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    ckpt = tiny_checkpoint(tmp_path_factory.mktemp("vs") / "tiny", seed=2)
    return AudioDecoder(load_dvae(ckpt), load_vocos(ckpt), load_decoder(ckpt))


def stream_chunks(decoder, seed: int, n: int = 90, ref: int = 1) -> list[CodeChunkIn]:
    """One stream's chunks (two sentences of n / 2 frames, the server's kind of schedule) as the
    vocoder reads them."""
    g = torch.Generator().manual_seed(seed)
    frames = [tuple(torch.randint(0, 625, (4,), generator=g).tolist()) for _ in range(n)]
    sd = StreamingDecoder(decoder, ChunkSchedule(4, 8, 32), lookahead=4)
    cut = [c for h in (frames[:n // 2], frames[n // 2:]) for c in sd.cut(h, final=True)]
    return [CodeChunkIn(np.array([[c.index]]), np.array(c.codes, np.int64).T[None], None, c.context, c.length, c.last,
                        c.start, stream=ref) for c in cut]


def chunked(decoder, chunks) -> list[np.ndarray]:
    return [a.numpy() for a in StreamDecoders(decoder, 4, on=False).decode_chunks(chunks, torch.device("cpu"))[0]]


def test_streams_interleaved_decode_as_each_alone(decoder):
    held = []
    sd = StreamDecoders(decoder, 4, held=held.append)
    a, b = stream_chunks(decoder, 0, ref=11), stream_chunks(decoder, 1, ref=22)
    got: dict[int, list] = {11: [], 22: []}
    frames = audio = 0
    for pair in zip(a, b):                                   # one chunk of each in turn
        out, cost = sd.decode_chunks(list(pair), torch.device("cpu"))
        for c, x in zip(pair, out):
            got[c.stream].append(x.numpy())
        frames, audio = frames + cost, audio + sum(c.length for c in pair)
    assert max(held) == 2 and held[-1] == 0 and not sd.held          # each freed at its last chunk
    for ref, chunks in ((11, a), (22, b)):                           # each as its stream alone gives it
        alone = StreamDecoders(decoder, 4)
        want = np.concatenate([alone.decode_chunks([c], torch.device("cpu"))[0][0].numpy() for c in chunks], axis=-1)
        mine = np.concatenate(got[ref], axis=-1)
        assert mine.shape == want.shape == np.concatenate(chunked(decoder, chunks), axis=-1).shape
        # both streams' chunks went through each layer at once: the convolutions sum in another
        # order for a batch of two, so within float32's rounding of the stream alone (measured 5e-6
        # of its peak), not bit for bit
        np.testing.assert_allclose(mine, want, rtol=0, atol=1e-5 * np.abs(want).max())
        one_by_one = StreamDecoders(decoder, 4)                      # the default: one chunk a call
        interleaved = {11: [], 22: []}
        for pair in zip(a, b):
            for c in pair:
                interleaved[c.stream].append(one_by_one.decode_chunks([c], torch.device("cpu"))[0][0].numpy())
        assert np.array_equal(np.concatenate(interleaved[ref], axis=-1), want)   # interleaved, bit for bit
    fed = sum(c.x.shape[-1] for c in a + b)                          # what the chunked decode computes
    assert audio <= frames < fed


def test_a_decoder_is_dropped_when_its_stream_is_over_fails_or_is_the_oldest(decoder):
    sd = StreamDecoders(decoder, 2)
    a, b, c = (stream_chunks(decoder, i, ref=i + 1) for i in range(3))
    sd.decode_chunks([a[0], b[0]], torch.device("cpu"))
    assert set(sd.held) == {1, 2}
    assert sd.sweep(lambda ref: ref == 1) == 1 and set(sd.held) == {2}         # stream 1 is over
    out, _ = sd.decode_chunks([b[2]], torch.device("cpu"))                     # a chunk skipped: the chunked
    np.testing.assert_array_equal(out[0].numpy(), chunked(decoder, [b[2]])[0])  # decode, and its decoder goes
    assert not sd.held
    sd.decode_chunks([a[0], b[0]], torch.device("cpu"))
    sd.decode_chunks([c[0]], torch.device("cpu"))                               # past the limit of 2
    assert set(sd.held) == {2, 3}                                               # the oldest dropped
    sd.drop(2)
    assert set(sd.held) == {3}


def test_a_chunk_without_a_stream_takes_the_chunked_decode(decoder):
    sd = StreamDecoders(decoder, 2)
    chunks = stream_chunks(decoder, 0, ref=0)[:3]
    out, frames = sd.decode_chunks(chunks, torch.device("cpu"))
    assert not sd.held and frames == sum(c.x.shape[-1] for c in chunks)
    for x, want in zip(out, chunked(decoder, chunks)):
        np.testing.assert_array_equal(x.numpy(), want)


@pytest.mark.server
def test_the_server_holds_no_decoder_once_its_streams_are_done(tts_server):
    """Through Triton: a request of three sentences; afterwards no decoder is held, and the
    frame counters hold its audio (each sentence half a frame short) and what decoding it cost."""
    import time

    from client.triton import stream_grpc
    from triton_server import settle, wait_for

    settle(tts_server)                    # the metrics are published four times a second: all before now
    f0, a0 = (tts_server.metric(f"velocity_vocoder_{m}_total") for m in ("frames", "audio_frames"))
    audio = [a for _, a in stream_grpc(tts_server.grpc_url, {"TEXT": "One sentence. Another one here. And a third.",
                                                             "SEED": 5})]
    assert audio and wait_for(lambda: tts_server.metric("velocity_vocoder_stream_decoders") == 0, 2)
    time.sleep(0.3)
    frames, made = (tts_server.metric(f"velocity_vocoder_{m}_total") - v for m, v in (("frames", f0), ("audio_frames", a0)))
    assert made * 512 - 3 * 256 == sum(a.shape[-1] for a in audio)
    assert frames >= made, (frames, made)


def test_a_chunk_whose_decoder_was_dropped_fails_no_stream_beside_it(decoder):
    """A client's cancel drops its stream's decoder while a later chunk of it is already taken to
    decode: that chunk takes the chunked decode, and the other stream decoded beside it gives the
    audio it gives alone (before: the call failed, every decoder in it was dropped, and the other
    streams' next chunks failed in turn)."""
    a, b = stream_chunks(decoder, 0, ref=11), stream_chunks(decoder, 1, ref=22)
    sd, alone = StreamDecoders(decoder, 4), StreamDecoders(decoder, 4)
    sd.decode_chunks([a[0], b[0]], torch.device("cpu"))
    want = [alone.decode_chunks([c], torch.device("cpu"))[0][0].numpy() for c in b[:3]]
    sd.drop(11)                                                                  # the cancel
    out, _ = sd.decode_chunks([a[1], b[1]], torch.device("cpu"))
    np.testing.assert_array_equal(out[0].numpy(), chunked(decoder, [a[1]])[0])
    np.testing.assert_allclose(out[1].numpy(), want[1], rtol=0, atol=1e-5 * np.abs(want[1]).max())
    out, _ = sd.decode_chunks([b[2]], torch.device("cpu"))                      # stream 22 goes on as alone
    np.testing.assert_allclose(out[0].numpy(), want[2], rtol=0, atol=1e-5 * np.abs(want[2]).max())   # (b[0] in a batch of 2)
    assert set(sd.held) == {22}
