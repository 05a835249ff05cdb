"""Text -> audio in one process on the tiny demo checkpoint with small audio models (the
release-size decoders: tests/unit/tts/test_streaming_decode.py)."""
import numpy as np
import pytest

from velocity.sampling_params import SamplingParams
from checkpoints import tiny_checkpoint
from triton_server import ROOT
from velocity.tts import pipeline
from velocity.tts.pipeline import TTSPipeline, chattts_params
from velocity.tts.chunking import ChunkSchedule


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    ckpt = tiny_checkpoint(tmp_path_factory.mktemp("pipe") / "tiny", seed=4, small_audio=True)
    return TTSPipeline(ckpt, device="cpu", schedule=ChunkSchedule(4, 8), num_kv_blocks=256, block_size=8)


def test_stream_is_in_order_and_equals_whole_seeded_synthesis(pipe):
    params = chattts_params(seed=11, max_new_tokens=20)
    text = "Hello world. It costs $5!"
    chunks = list(pipe.stream(text, speaker=3, params=params))
    assert [c.index for c in chunks] == list(range(len(chunks)))
    audio = np.concatenate([c.audio for c in chunks])
    assert audio.dtype == np.float32 and len(audio) % 512 == 0 and len(audio) > 0
    assert len(audio) <= 2 * 20 * 512                                  # two sentences, at most 20 frames each
    again = pipe.synthesize(text, speaker=3, params=chattts_params(seed=11, max_new_tokens=20))
    np.testing.assert_array_equal(again, audio)                          # same seed, same audio
    other = pipe.synthesize(text, speaker=4, params=chattts_params(seed=11, max_new_tokens=20))
    assert not np.array_equal(other, audio)
    assert pipe.engine.block_manager.num_used_blocks == 0


def test_closing_a_stream_early_frees_its_sequence(pipe):
    """A caller that stops reading after the first chunk leaves nothing in the engine."""
    params = SamplingParams(temperature=0.3, max_new_tokens=60, min_new_tokens=40, seed=2)
    it = pipe.stream("One sentence here. And another one.", params=params)
    next(it)
    assert pipe.engine.has_unfinished()
    it.close()
    assert not pipe.engine.has_unfinished() and pipe.engine.block_manager.num_used_blocks == 0
    assert len(pipe.synthesize("Next text.", params=params)) > 0        # the next request runs as usual


def test_a_steps_chunks_decoded_in_one_call_give_the_same_audio(pipe):
    """decode_batch > 1 (the GPU default) against one chunk per call: same chunks, same order per
    text, audio within float32 rounding of batched convolutions (1e-4 of the peak)."""
    texts = ["One sentence here.", "Another one, a bit longer than that.", "Third."]
    params = lambda i: chattts_params(seed=i, max_new_tokens=24)  # noqa: E731

    calls = []
    decode = pipe.decoder._audio

    def run(batch):
        pipe.decode_batch = batch
        calls.clear()
        got: dict = {}
        for ev in pipe.stream_many(texts, params=params, concurrency=3):
            if ev.kind == "chunk":
                got.setdefault(ev.text, []).append(ev.chunk)
        return got, len(calls)

    pipe.decoder._audio = lambda x: calls.append(x.shape[0]) or decode(x)
    pipe.stateful, stateful = None, pipe.stateful                        # the chunked decode, as on a GPU
    try:
        (one, calls_one), (many, calls_many) = run(1), run(8)
    finally:
        pipe.decode_batch, pipe.stateful = 1, stateful
        del pipe.decoder._audio
    assert calls_many < calls_one == sum(map(len, one.values()))         # some chunks shared a call
    assert sorted(one) == sorted(many) == [0, 1, 2]
    for t in one:
        assert [c.index for c in many[t]] == [c.index for c in one[t]] == list(range(len(one[t])))
        a, b = np.concatenate([c.audio for c in one[t]]), np.concatenate([c.audio for c in many[t]])
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4 * np.abs(a).max())


def test_each_text_through_a_stateful_decoder_gives_the_chunked_decodes_audio(pipe, monkeypatch):
    """On CPU each text's chunks go through a stateful decoder of its own (velocity.tts.
    stateful_decoder, the default): three texts of two sentences interleaved, at the pipeline's
    exact lookahead, give the chunked decode's chunks and audio up to float rounding (100 dB
    SER, as tests/unit/tts/test_streaming_decode.py), and each text's decoder ends with it."""
    texts = ["One sentence here. And a second one.", "Another one, a bit longer. Then more.", "Third. Fourth."]
    params = lambda i: chattts_params(seed=i, max_new_tokens=24)  # noqa: E731

    def run() -> dict:
        got: dict = {}
        for ev in pipe.stream_many(texts, params=params, concurrency=3):
            if ev.kind == "chunk":
                got.setdefault(ev.text, []).append(ev.chunk)
        return got

    assert pipe.stateful is not None
    decoders, calls = [], []
    together = pipeline.decode_together
    with monkeypatch.context() as m:                  # which decoder decodes each chunk
        m.setattr(pipeline, "decode_together", lambda chunks: calls.append(len(chunks)) or
                  decoders.extend(c[0] for c in chunks) or together(chunks))
        mine = run()
    with monkeypatch.context() as m:
        m.setattr(pipe, "stateful", None)
        want = run()
    assert len(set(map(id, decoders))) == 3 and all(d.utt is None for d in decoders)
    assert max(calls) > 1                             # texts' chunks through the layers together
    assert sorted(mine) == sorted(want) == [0, 1, 2]
    for t in want:
        assert [c.index for c in mine[t]] == [c.index for c in want[t]]
        a, b = np.concatenate([c.audio for c in want[t]]), np.concatenate([c.audio for c in mine[t]])
        assert a.shape == b.shape
        assert 10 * np.log10(np.sum(a ** 2) / max(np.sum((a - b) ** 2), 1e-30)) > 100


def test_sentences_ahead_give_the_same_audio_in_fewer_steps(pipe, monkeypatch):
    """Sentences generated while the one before them is spoken (sentences_ahead) against one at
    a time: the same chunks in the same order (the model's floats in another batch: audio
    within 1e-4 of the peak, triton_server.assert_same_audio), in fewer engine steps."""
    from triton_server import assert_same_audio

    text = "First one here. The second sentence. A third. And the fourth one ends it."
    step = pipe.engine.step

    def run(ahead: int) -> tuple[list, int]:
        monkeypatch.setattr(pipe, "sentences_ahead", ahead)
        steps = 0

        def counted():
            nonlocal steps
            steps += 1
            return step()
        monkeypatch.setattr(pipe.engine, "step", counted)
        chunks = list(pipe.stream(text, speaker=3, params=SamplingParams(temperature=0.3, max_new_tokens=24,
                                                                          min_new_tokens=24, seed=5)))
        assert pipe.engine.block_manager.num_used_blocks == 0
        return chunks, steps

    (one, one_steps), (two, two_steps) = run(0), run(2)
    assert [c.index for c in two] == [c.index for c in one] == list(range(len(one)))
    assert_same_audio(np.concatenate([c.audio for c in two]), np.concatenate([c.audio for c in one]))
    assert two_steps < 0.7 * one_steps, (two_steps, one_steps)


SERVER_PATH_WITHOUT_TRANSFORMERS = r"""
import ast, importlib, pathlib, pkgutil, sys
sys.modules["transformers"] = None            # every import of it now raises ImportError
import velocity
for m in pkgutil.walk_packages(velocity.__path__, "velocity."):
    if not m.name.startswith("velocity.demo"):    # the demo writers use transformers to write
        importlib.import_module(m.name)
for model in pathlib.Path("model_repository").glob("*/1/model.py"):
    tree = ast.parse(model.read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "transformers" not in roots, model
from velocity.tts import pipeline
from velocity.tts.pipeline import TTSPipeline, chattts_params
pipe = TTSPipeline(sys.argv[1], device="cpu", num_kv_blocks=64, block_size=8)
audio = pipe.synthesize("Hello world.", params=chattts_params(seed=1, max_new_tokens=12))
print("samples", len(audio))
"""


def test_the_server_path_runs_without_transformers(tmp_path):
    """The llm, the front end and the vocoder load a release folder and speak with transformers
    unimportable: the device image's transformers needs numpy 2, Triton 2.51's stub numpy 1."""
    import subprocess
    import sys
    from pathlib import Path

    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=4, small_audio=True)
    run = subprocess.run([sys.executable, "-c", SERVER_PATH_WITHOUT_TRANSFORMERS, str(ckpt)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.split("samples")[-1]) > 0
