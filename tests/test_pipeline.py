"""Text -> audio in one process on the tiny demo checkpoint."""
import numpy as np
import pytest

from velocity.sampling.params import SamplingParams
from velocity.tts.checkpoint import write_checkpoint
from velocity.tts.pipeline import TTSPipeline, chattts_params
from velocity.tts.streaming import ChunkSchedule


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    ckpt = write_checkpoint(tmp_path_factory.mktemp("pipe") / "tiny", "tiny", seed=4)
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
