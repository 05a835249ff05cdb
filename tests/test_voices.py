"""Named voices: the built-in set, voices files, and what a bad file says."""
import json

import numpy as np
import pytest

from velocity.tts.speaker import encode_sample, encode_speaker, random_speaker
from velocity.tts.voices import BUILTIN, DEFAULT_VOICE, Voices, add_voice


def test_builtin_voices_are_seeded_draws_from_the_statistics():
    stats = np.stack([np.full(64, 0.5), np.full(64, 2.0)]).astype(np.float16)
    v = Voices("/nonexistent", 64, stats)
    assert set(v.voices) == set(BUILTIN) and v.default == DEFAULT_VOICE
    for name, seed in BUILTIN.items():
        np.testing.assert_array_equal(v.get(name).speaker, random_speaker(seed, 64, stats))


def test_a_voices_file_beside_the_weights_and_a_folder_of_them(tmp_path):
    spk = random_speaker(3, 64)
    (tmp_path / "voices.json").write_text(json.dumps({"narrator": encode_speaker(spk),
                                                      "me": {"sample": "x", "sample_text": "hi"}}))
    v = Voices(tmp_path, 64, None)
    np.testing.assert_array_equal(v.get("narrator").speaker, spk.astype(np.float16).astype(np.float32))
    assert v.get("me").kind == "sample" and v.get("me").sample_text == "hi"
    folder = tmp_path / "many"
    folder.mkdir()
    add_voice(folder / "a.json", "one", sample=encode_sample(np.zeros((4, 3), int)), sample_text="t")
    add_voice(folder / "b.json", "two", speaker=spk)
    assert {"one", "two"} <= set(Voices(tmp_path, 64, None, path=str(folder)).voices)


@pytest.mark.parametrize("content,match", [
    ("not json", "not a readable JSON voices file"),
    ("[1, 2]", "must hold a JSON object of name -> voice"),
    ('{"x": 5}', "voice 'x': give a speaker string, or an object"),
    ('{"x": "garbage"}', "voice 'x': speaker string is not base16384|voice 'x': speaker string does not hold"),
])
def test_a_bad_voices_file_names_the_file_and_the_entry(tmp_path, content, match):
    (tmp_path / "voices.json").write_text(content)
    with pytest.raises(ValueError, match=match):
        Voices(tmp_path, 64, None)


def test_unknown_names_list_the_voices_and_a_bad_default_is_refused(tmp_path):
    v = Voices(tmp_path, 64, None)
    with pytest.raises(ValueError, match="VOICE 'zed' is not a voice here; voices: amber, basil"):
        v.get("zed")
    with pytest.raises(ValueError, match="default voice 'zed' is not one of"):
        Voices(tmp_path, 64, None, default="zed")
    with pytest.raises(ValueError, match="VELOCITY_VOICES=/nope: no such file or folder"):
        Voices(tmp_path, 64, None, path="/nope")
    assert Voices(tmp_path, 64, None, default="").default == ""
