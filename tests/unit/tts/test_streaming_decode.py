"""Chunked streaming decode against a whole-utterance decode."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from velocity.model.loading.audio_models import load_decoder, load_dvae, load_vocos
from checkpoints import tiny_checkpoint
from velocity.tts.audio_decoder import AudioDecoder, StreamingDecoder
from velocity.tts.chunking import ChunkSchedule

T = 150   # frames: 3.2 s of audio


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    ckpt = tiny_checkpoint(tmp_path_factory.mktemp("stream") / "tiny", seed=2)
    return AudioDecoder(load_dvae(ckpt), load_vocos(ckpt), load_decoder(ckpt))


@pytest.fixture(scope="module")
def frames():
    g = torch.Generator().manual_seed(0)
    return [tuple(torch.randint(0, 625, (4,), generator=g).tolist()) for _ in range(T)]


@pytest.fixture(scope="module")
def hidden(decoder):
    """GPT hidden states, one row per frame (the demo GPT's width)."""
    return torch.randn(T, decoder.hidden_size, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def whole(decoder, frames):
    return decoder.decode(torch.tensor(frames).T[None])[0]


@pytest.fixture(scope="module")
def whole_hidden(decoder, hidden):
    return decoder.decode(hidden[None])[0]


def ser_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    """Signal-to-error ratio over the whole signal."""
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum().clamp_min(1e-30)))


def stream(decoder, frames, schedule, step, hidden=None, **kw):
    sd = StreamingDecoder(decoder, schedule, **kw)
    chunks = []
    for i in range(0, len(frames), step):                # frames arrive a few at a time
        chunks += sd.push(frames[i:i + step], hidden=None if hidden is None else hidden[i:i + step].numpy())
    chunks += sd.push([], final=True)
    assert [c[0] for c in chunks] == list(range(len(chunks)))
    return chunks


def test_context_is_the_receptive_field(decoder):
    # DVAE: conv_in 2 + 12 blocks x 6 + out_conv 1 = 75 mel; Vocos: 3 + 8 x 3 = 27; ISTFT 2 -> 104 mel
    assert decoder.exact_context == 52


@pytest.mark.parametrize("schedule,step", [(ChunkSchedule(1, 1), 1), (ChunkSchedule(12, 36), 5),
                                           (ChunkSchedule(4, 24), 7), (ChunkSchedule(200, 200), 3),
                                           (ChunkSchedule(12, 24, 96), 5)])
def test_exact_context_chunks_equal_the_whole_decode(decoder, frames, whole, schedule, step):
    n = T
    if schedule.first == schedule.rest == 1:       # a decode per frame: the first 60 frames say it
        n, frames = 60, frames[:60]
        whole = decoder.decode(torch.tensor(frames).T[None])[0]
    chunks = stream(decoder, frames, schedule, step)
    audio = torch.cat([c[1] for c in chunks])
    assert audio.shape == whole.shape == (n * 512 - 256,)         # the reference's whole-decode length
    # float32 rounding only: 100 dB SER is about 1e-5 relative error
    assert ser_db(whole, audio) > 100, ser_db(whole, audio)
    sizes = [-(-len(c[1]) // 512) for c in chunks]
    assert sizes[0] == min(schedule.first, n) and sum(sizes) == n
    assert all(len(c[1]) % 512 == 0 for c in chunks[:-1]) and len(chunks[-1][1]) % 512 == 256


# one-frame chunks (a decode per frame, 16 s) are the codes path's above: the seams are the same code
@pytest.mark.parametrize("schedule,step", [(ChunkSchedule(4, 8), 1), (ChunkSchedule(12, 36), 5),
                                           (ChunkSchedule(12, 24, 96), 7)])
def test_the_decoder_path_streams_exactly_too(decoder, frames, hidden, whole_hidden, whole, schedule, step):
    """Hidden states -> Decoder -> Vocos, chunked with the exact context: the whole decode's
    samples (the Decoder's receptive field equals the DVAE's here, exact_context covers both)."""
    chunks = stream(decoder, frames, schedule, step, hidden=hidden)
    audio = torch.cat([c[1] for c in chunks])
    assert audio.shape == whole_hidden.shape == (T * 512 - 256,)
    assert ser_db(whole_hidden, audio) > 100, ser_db(whole_hidden, audio)
    assert ser_db(whole, audio) < 10                      # another path: unrelated audio


def test_each_utterance_ends_on_its_own(decoder, frames, hidden):
    """finish() ends an utterance (a sentence): its audio is its own whole decode, and the next
    utterance's chunks go on in index."""
    sd = StreamingDecoder(decoder, ChunkSchedule(12, 36))
    a, b = frames[:70], frames[70:]
    got = sd.push(a, final=True) + sd.push(b, final=True)
    assert [i for i, _ in got] == list(range(len(got)))
    audio = torch.cat([x for _, x in got])
    want = torch.cat([decoder.decode(torch.tensor(f).T[None])[0] for f in (a, b)])
    assert audio.shape == want.shape and ser_db(want, audio) > 100


def test_each_chunk_knows_its_sentence_and_where_its_audio_starts(decoder, frames):
    """CodeChunk.sentence and .sample_offset: the samples of the stream's audio before the chunk's,
    as decoded, across utterances that each end half a frame shorter and one with no frames."""
    from velocity.tts.chunking import FrameChunker

    ch = FrameChunker(ChunkSchedule(12, 36), 8, 4)
    chunks = ch.push(frames[:70]) + ch.finish() + ch.finish() + ch.push(frames[70:]) + ch.finish()
    audio = decoder.decode_chunks([(torch.tensor(c.codes).T[None], c.context, c.length, c.last) for c in chunks], 1)
    offsets = [c.sample_offset(decoder.samples_per_frame) for c in chunks]
    assert offsets == [sum(a.shape[-1] for a in audio[:k]) for k in range(len(chunks))]
    assert sorted({c.sentence for c in chunks}) == [0, 2] and [c.lasts for c in chunks][-1] == 1


def test_seams_have_no_jumps_larger_than_inside_chunks(decoder, frames, whole):
    chunks = stream(decoder, frames, ChunkSchedule(8, 24), 4)
    audio = torch.cat([c[1] for c in chunks])
    diffs = (audio[1:] - audio[:-1]).abs()
    seams = torch.tensor([sum(len(c[1]) for c in chunks[:i]) - 1 for i in range(1, len(chunks))])
    assert diffs[seams].max() <= diffs.max()
    torch.testing.assert_close(diffs[seams], (whole[1:] - whole[:-1]).abs()[seams], rtol=1e-3, atol=1e-6)


def test_a_chunk_waits_for_its_lookahead(decoder, frames):
    sd = StreamingDecoder(decoder, ChunkSchedule(10, 20), lookahead=6)
    assert sd.push(frames[:15]) == []                    # needs 10 + 6 frames
    got = sd.push(frames[15:16])
    assert [i for i, _ in got] == [0] and got[0][1].shape == (10 * 512,)


def test_short_lookahead_stays_above_40_db(decoder, frames, whole):
    """The latency trade: 16 frames (0.34 s) of lookahead instead of the exact 52."""
    chunks = stream(decoder, frames, ChunkSchedule(12, 36), 4, lookahead=16)
    assert ser_db(whole, torch.cat([c[1] for c in chunks])) > 40


def test_later_chunks_grow_to_the_largest():
    ends = ChunkSchedule(12, 24, 96).bounds()
    assert [next(ends) for _ in range(6)] == [12, 36, 84, 180, 276, 372]      # 12, 24, 48, 96, 96, 96
    ends = ChunkSchedule(12, 36).bounds()
    assert [next(ends) for _ in range(3)] == [12, 48, 84]                     # no growth by default
    with pytest.raises(ValueError, match="largest"):
        ChunkSchedule(12, 36, 20)


def test_serving_chunk_rest_above_the_largest_chunk_means_chunks_of_rest():
    from velocity.serving.settings import Settings
    s = Settings(chunk_first=12, chunk_rest=200)          # default largest 144 < 200
    for gpu in (False, True):
        ends = [b for b, _ in zip(s.schedule(gpu).bounds(), range(3))]
        assert ends == [12, 212, 412]


def test_chunks_on_cpu_start_small_and_int8s_grow_as_fast_as_a_stream_at_1_4_times_real_time_keeps_ahead():
    """The server's chunk sizes: on a GPU 12, 36, then doubling. On CPU a first chunk of 4 (first
    audio 8 steps earlier); with int8 then 5, each later one 1.4 times the one before, so that a
    stream whose frames generate at 1.4x real time (a CPU int8 step of 15.2 ms a frame of 21.3
    ms) has each chunk's frames, lookahead included, before the audio cut before it has played:
    chunk k is ready (E_k - E_0) steps after the first, when E_(k-1) frames of audio were out (E:
    the chunks' ends). float32 on CPU, slower than its audio whatever the chunks, takes 36 and
    doubling: the fewest cuts. The GPU's schedule does not keep ahead at that pace."""
    from velocity.serving.settings import Settings

    s, q = Settings(), Settings(quantize="int8")
    assert s.schedule(gpu=True) == q.schedule(gpu=True) == ChunkSchedule(12, 36, 144, 2.0)
    assert q.schedule(gpu=False) == ChunkSchedule(4, 5, 144, 1.4)
    assert s.schedule(gpu=False) == ChunkSchedule(4, 36, 144, 2.0)
    assert Settings(chunk_rest=24, chunk_growth=1.25).schedule(gpu=True) == ChunkSchedule(12, 24, 144, 1.25)
    assert Settings(chunk_first=8, quantize="int8").schedule(gpu=False) == ChunkSchedule(8, 5, 144, 1.4)
    ends = list(itertools.islice(q.schedule(gpu=False).bounds(), 12))
    assert ends[:7] == [4, 9, 16, 26, 40, 59, 86] and ends[-1] - ends[-2] == 144        # 4, 5, 7, 10, 14, 19, 27 ...
    assert all(ends[k] - ends[0] <= 1.4 * ends[k - 1] for k in range(1, len(ends)))
    for slower in (s.schedule(gpu=True), s.schedule(gpu=False)):
        e = list(itertools.islice(slower.bounds(), 12))
        assert not all(e[k] - e[0] <= 1.4 * e[k - 1] for k in range(1, len(e)))
    with pytest.raises(ValueError, match="growth"):
        ChunkSchedule(12, 18, 144, 0.5)


def test_chunks_decoded_together_equal_chunks_decoded_alone(decoder, frames):
    """decode_chunks with a batch: each chunk's audio as decoded alone, in the order given, for
    mixed lengths and a multi-row chunk. Tolerance: batched and single convolutions may sum in
    another order (float32 rounding, about 1e-6 of the signal's peak); 1e-4 of the peak."""
    sd = StreamingDecoder(decoder, ChunkSchedule(12, 36))
    cut = sd.cut(frames[:40]) + sd.cut(frames[40:100]) + sd.cut(frames[100:], final=True)
    chunks = [(torch.tensor(c.codes).T[None], c.context, c.length, c.last) for c in cut]
    chunks += [(torch.cat([chunks[1][0], chunks[1][0]]), *chunks[1][1:])]   # b = 2
    alone = [decoder.decode_chunks([c])[0] for c in chunks]
    together = decoder.decode_chunks(chunks, max_batch=8)
    assert len({c[0].shape[-1] for c in chunks}) < len(chunks)          # some lengths repeat: real batches
    assert [a.shape for a in together] == [a.shape for a in alone] and together[-1].shape[0] == 2
    peak = max(float(a.abs().max()) for a in alone)
    for a, b in zip(alone, together):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4 * peak)


def _outputs(sentence_frames: dict[int, int], per_output: int, seed: int = 0):
    """Engine outputs of sentences running side by side, in an interleaved order: sentence i's
    frames are (i, k, k, k), each sentence's last output finished ("stop") with the end frame."""
    import random
    from types import SimpleNamespace

    end = 99
    queues = {}
    for i, n in sentence_frames.items():
        frames = [(i, k, k, k) for k in range(n)] + [(end,) * 4]
        queues[i] = [frames[s:s + per_output] for s in range(0, len(frames), per_output)]
    rng, order = random.Random(seed), []
    while queues:
        i = rng.choice(sorted(queues))
        part = queues[i].pop(0)
        order.append((i, SimpleNamespace(new_token_ids=part, new_hidden=None, finished=not queues[i],
                                         finish_reason="stop" if not queues[i] else None)))
        if not queues[i]:
            del queues[i]
    return order


@pytest.mark.parametrize("ahead", [1, 2, 4])
def test_sentences_generated_ahead_give_the_chunks_of_one_by_one(ahead):
    """SentenceStream with sentences generating at once: the chunks (indices, frames, marks) are
    those of the sentences one after another, and the requests it asks for stay within `ahead`
    (none before the first chunk)."""
    from velocity.tts.chunking import FrameChunker
    from velocity.tts.sentence_stream import SentenceStream

    lengths = {0: 30, 1: 7, 2: 55, 3: 1, 4: 20}

    def run(ahead: int, order_seed: int) -> list:
        s = SentenceStream([[0]] * 5, FrameChunker(ChunkSchedule(4, 8, 16), 3, 2), end_code=99, ahead=ahead,
                           texts=[f"sentence {i}" for i in range(5)])
        running = {i for i, *_ in s.requests(None, None, False)}
        assert running == {0}                    # the others wait for the first chunk
        got, started = [], set(running)
        outs = _outputs(lengths, 3, order_seed) if ahead else [o for i in range(5) for o in _outputs({i: lengths[i]}, 3)]
        # feed only outputs of started requests, in the interleaved order, as an engine would
        pending = list(outs)
        while pending:
            k = next(n for n, (i, _) in enumerate(pending) if i in started)
            i, out = pending.pop(k)
            chunks = s.feed(i, out)
            got += [(c.index, c.codes, c.context, c.length, c.last, c.start, c.sentence, c.lasts, c.sentence_text)
                    for c in chunks]
            if out.finished or chunks:
                new = {j for j, *_ in s.requests(None, None, False)}
                assert not new & started and all(j <= s.sentence + ahead for j in new)
                started |= new
        assert len(started) == 5
        assert s.done
        return got

    one_by_one = run(0, 0)
    assert run(ahead, 1) == one_by_one and run(ahead, 2) == one_by_one
    assert [c[4] for c in one_by_one].count(True) == 5          # each sentence its own utterance
    firsts = [c for k, c in enumerate(one_by_one) if k == 0 or one_by_one[k - 1][6] != c[6]]
    assert [c[6] for c in firsts] == [0, 1, 2, 3, 4]            # every sentence's chunks, in order
    assert [c[8] for c in firsts] == [f"sentence {i}" for i in range(5)]   # its text on its first chunk
    assert all(not c[8] for c in one_by_one if c not in firsts)


def test_stall_is_the_wait_a_listener_hears():
    from client.tts_client import stall
    assert stall([]) == 0 and stall([(3.0, 1.0)]) == 0
    # plays 0-1, then 1-2 (arrived early), then the third arrives at 2.5: half a second of silence
    assert stall([(0.0, 1.0), (0.5, 1.0), (2.5, 1.0)]) == pytest.approx(0.5)
    assert stall([(0.0, 0.2), (1.0, 0.2), (1.5, 0.2)]) == pytest.approx(0.8 + 0.3)


@pytest.mark.parametrize("cpu_kernel", [True, False])
def test_int8_decoders_stay_near_the_float32_decode(tmp_path, frames, hidden, cpu_kernel):
    """VELOCITY_VOCODER_QUANTIZE=int8: the ConvNeXt linears on int8 weights, on the C++ int8_gemm
    where the kernels build it for this CPU's row width (VELOCITY_CPU_KERNEL), else fbgemm's op.
    Both paths stay above 25 dB SER against float32 (measured on these random weights with 8-bit
    rows: 40.2 and 42.2 dB) and are not equal to it (they are quantized)."""
    from velocity.model.kernels.cpu_kernels import kernels
    from velocity.model.layers.int8_linear import Int8Linear, activation_bits
    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=2)
    ref = AudioDecoder(load_dvae(ckpt), load_vocos(ckpt), load_decoder(ckpt))
    q = AudioDecoder(load_dvae(ckpt), load_vocos(ckpt), load_decoder(ckpt))
    assert ref.quantize("none", pack=False) == 0
    with pytest.raises(ValueError, match="VELOCITY_VOCODER_QUANTIZE.*none or int8.*'int4'"):
        ref.quantize("int4")
    n = q.quantize("int8", cpu_kernel=cpu_kernel)
    linears = [m for d in (q.dvae, q.decoder, q.vocos) for m in d.modules() if isinstance(m, Int8Linear)]
    assert n == len(linears) > 0
    built = cpu_kernel and kernels() is not None and kernels().int8_gemm_bits() == activation_bits()
    assert any(m.gemm is not None for m in linears) == built
    for x in (torch.tensor(frames).T[None], hidden[None]):
        db = ser_db(ref.decode(x)[0], q.decode(x)[0])
        assert 25 < db < 80, db


@pytest.mark.parametrize("cpu_kernel", [True, False])
def test_prepacked_decoders_are_the_float32_decode_to_its_rounding(tmp_path, frames, hidden, cpu_kernel):
    """VELOCITY_PACK_CPU_WEIGHTS (default on): the ConvNeXt linears of float32 decoders on packed
    weights (the C++ f32_gemm, or oneDNN's without the C++ kernels), the same arithmetic summed in
    another order: both paths at least 100 dB SER from the plain decode (measured about 120 dB),
    and not bit-equal (the pack is in use)."""
    from velocity.model.kernels.cpu_kernels import kernels
    from velocity.model.layers.packed_linear import F32Linear, PackedLinear
    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=2)
    ref = AudioDecoder(load_dvae(ckpt), load_vocos(ckpt), load_decoder(ckpt))
    p = AudioDecoder(load_dvae(ckpt), load_vocos(ckpt), load_decoder(ckpt))
    n = p.quantize("none", cpu_kernel=cpu_kernel)
    kind = F32Linear if cpu_kernel and kernels() is not None and kernels().f32_gemm_lanes() else PackedLinear
    assert n == sum(isinstance(m, kind) for d in (p.dvae, p.decoder, p.vocos) for m in d.modules()) > 0
    for x in (torch.tensor(frames).T[None], hidden[None]):
        a, b = ref.decode(x)[0], p.decode(x)[0]
        assert a.shape == b.shape and not torch.equal(a, b)
        assert ser_db(a, b) > 100, ser_db(a, b)


def chunked_and_stateful(decoder, frames, schedule, lookahead, step, hidden=None, utterances=1):
    """The same chunks (a FrameChunker's, frames a few at a time, `utterances` sentences of the
    frames in turn) through the chunked decode and the stateful one: (chunked audio, stateful
    audio, the chunked decode's frames per audio frame, the stateful decoder)."""
    from velocity.tts.stateful_decoder import StatefulDecoder

    sd, st = StreamingDecoder(decoder, schedule, lookahead=lookahead), StatefulDecoder(decoder)
    a, b, fed = [], [], 0
    per = len(frames) // utterances
    for u in range(utterances):
        part = range(u * per, (u + 1) * per)
        for i in range(part.start, part.stop, step):
            j = min(i + step, part.stop)
            chunks = sd.cut(frames[i:j], final=j == part.stop, hidden=None if hidden is None else hidden[i:j].numpy())
            a += [x[0] for x in decoder.decode_cut(chunks)]
            b += [st.decode_cut(c)[0] for c in chunks]
            fed += sum(len(c.codes) for c in chunks)
            if chunks and chunks[-1].last:
                assert st.utt is None                      # an utterance's state ends with its last chunk
    return torch.cat(a), torch.cat(b), fed / (per * utterances), st


@pytest.mark.parametrize("path", ["codes", "hidden"])
@pytest.mark.parametrize("schedule,lookahead,step,n", [(ChunkSchedule(12, 36, 144), 16, 5, T),   # the server's: GPU
                                                       (ChunkSchedule(4, 5, 144, 1.4), 16, 5, T),    # CPU int8
                                                       (ChunkSchedule(4, 36, 144), 16, 5, T),         # CPU float32
                                                       (ChunkSchedule(4, 8), 6, 3, T),
                                                       (ChunkSchedule(12, 36), 52, 7, T),         # exact
                                                       (ChunkSchedule(1, 1), 2, 1, 24)])
def test_the_stateful_decode_is_the_chunked_decode_with_each_frame_once(decoder, frames, hidden, path, schedule,
                                                                       lookahead, step, n):
    """Each layer keeps its input's tail per stream and computes a position
    once its input reaches past it, again only where it lies past a chunk's end. Its audio:
    - with an exact lookahead, the chunked decode's: float rounding only, 100 dB SER as above;
    - with a shorter one, whose positions before a chunk's end it keeps where the chunked decode
      computes them again with later frames: as near a whole decode as the chunked decode's, its
      SER to it within 3 dB of the chunked decode's (measured: within 0.4-2.9 dB at lookaheads of
      6-24) or past 110 dB, and nearer the chunked decode than either is to a whole decode;
    - at the server's schedules, within the issue's 100 dB of the chunked decode's, computing at
      most 1.25 positions per audio position (each layer weighted by its cost) on the GPU's and
      CPU float32's, where the chunked decode feeds 2 frames per audio frame (measured: 1.21 and
      1.20 against 2.07 and 1.96). CPU int8's cuts more chunks, small ones first, so that its
      first audio comes 8 steps earlier and a stream at 1.4 times real time hears no gap
      between them: 1.53 on these 150 frames (1.29 by the server's counters on its 240-frame
      requests: docs/benchmarks.md, "Chunks on CPU"), bounded at 1.6."""
    x = torch.tensor(frames[:n]).T[None] if path == "codes" else hidden[:n][None]
    a, b, fed, st = chunked_and_stateful(decoder, frames[:n], schedule, lookahead, step,
                                         hidden[:n] if path == "hidden" else None)
    assert a.shape == b.shape == (n * 512 - 256,)
    whole = decoder.decode(x)[0]
    if lookahead >= decoder.exact_context:
        assert ser_db(a, b) > 100, ser_db(a, b)
        # nothing speculative: each position once, but for the utterance's tail, which a chunk cut
        # before the chunker knew its end (lookahead short of 52) computed, and the last again
        assert max(st.computed) <= 2 * n + 2 * decoder.exact_context, st.computed
    else:
        assert ser_db(whole, b) > min(ser_db(whole, a) - 3, 110), (ser_db(whole, b), ser_db(whole, a))
        assert ser_db(a, b) > min(ser_db(whole, a), 110), (ser_db(a, b), ser_db(whole, a))
    if lookahead == 16:
        assert ser_db(a, b) > 100, ser_db(a, b)
        assert st.cost_ratio() <= (1.25 if schedule.growth == 2 else 1.6) < 1.9 <= fed, (st.cost_ratio(), fed)
    assert 1 <= st.cost_ratio() < fed, (st.cost_ratio(), fed)


def test_the_stateful_decode_starts_each_utterance_afresh(decoder, frames, hidden):
    """A stream of three sentences: each its own utterance (its last chunk half a frame shorter),
    as the chunked decode decodes them."""
    a, b, _, _ = chunked_and_stateful(decoder, frames, ChunkSchedule(12, 36, 144), 16, 5, hidden, utterances=3)
    assert a.shape == b.shape == (T * 512 - 3 * 256,)
    assert ser_db(a, b) > 100, ser_db(a, b)


def test_a_chunk_out_of_order_is_refused(decoder, frames):
    from velocity.tts.stateful_decoder import StatefulDecoder

    sd, st = StreamingDecoder(decoder, ChunkSchedule(12, 36), lookahead=16), StatefulDecoder(decoder)
    first, second = sd.cut(frames[:70])
    st.decode_cut(first)
    with pytest.raises(ValueError, match="out of order"):
        st.decode_cut(first)
    assert st.decode_cut(second).shape == (1, 36 * 512)


@pytest.mark.parametrize("path", ["codes", "hidden"])
def test_streams_decoded_together_are_each_decoded_alone(decoder, frames, hidden, path):
    """decode_together: three streams' chunks through each layer as one batch (TTSPipeline's
    texts), their windows of other widths right-padded, against each stream's chunks alone: the
    same audio, up to the float rounding of a batched convolution and GEMM (100 dB SER, as the
    stateful decode against the chunked one above)."""
    from velocity.tts.chunking import FrameChunker
    from velocity.tts.stateful_decoder import StatefulDecoder, decode_together

    def chunks(schedule, n, offset):
        ch = FrameChunker(schedule, decoder.exact_context, 16)
        rows = [(frames[(i + offset) % T], hidden[(i + offset) % T].numpy()) for i in range(n)]
        out = []
        for i in range(0, n, 5):
            part = rows[i:i + 5]
            out += ch.push([f for f, _ in part], None if path == "codes" else np.stack([h for _, h in part]))
        return out + ch.finish()

    streams = [chunks(ChunkSchedule(4, 36, 144), 120, 0), chunks(ChunkSchedule(12, 36), 90, 7),
               chunks(ChunkSchedule(4, 5, 144, 1.4), 60, 30)]
    alone = []
    for s in streams:
        d = StatefulDecoder(decoder)
        alone.append(torch.cat([decode_together([d.cut(c)])[0][0] for c in s]))
    shared = StatefulDecoder(decoder)                 # the layers the streams' decoders share
    decs, together = [StatefulDecoder(shared) for _ in streams], [[] for _ in streams]
    for k in range(max(map(len, streams))):
        live = [i for i, s in enumerate(streams) if k < len(s)]
        for i, a in zip(live, decode_together([decs[i].cut(streams[i][k]) for i in live])):
            together[i].append(a[0])
    assert sum(len(s) > 1 for s in streams) == 3 and len({len(s) for s in streams}) > 1
    for a, b in zip(alone, together):
        b = torch.cat(b)
        assert a.shape == b.shape
        assert ser_db(a, b) > 100, ser_db(a, b)
