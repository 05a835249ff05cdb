"""Named voices: the built-in set, voices files, and what a bad file says."""
import json

import numpy as np
import pytest

from velocity.tts.speaker import encode_sample, encode_speaker, random_speaker
from velocity.tts.voices import BUILTIN, DEFAULT_VOICE, OPENAI_ALIASES, Voices, add_voice


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
    ('{"x": 5}', "voice 'x': give a speaker string, an object"),
    ('{"alloy": {"alias": "nobody"}}', "voice 'alloy' is an alias of 'nobody', which is not a voice here"),
    ('{"a": {"alias": "b"}, "b": {"alias": "a"}}', "voice aliases go in a circle: a -> b -> a"),
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


def test_openais_voice_names_are_aliases_that_a_voices_file_repoints(tmp_path):
    """alloy ... verse stand for built-in voices (spread over all six) unless voices.json points
    one elsewhere or defines a voice of that name; the listing shows them as aliases."""
    v = Voices(tmp_path, 64, None)
    assert {v.resolve(a) for a in OPENAI_ALIASES} == set(BUILTIN)
    for alias, voice in OPENAI_ALIASES.items():
        assert v.get(alias) is v.get(voice)
    spk = random_speaker(3, 64)
    (tmp_path / "voices.json").write_text(json.dumps({"narrator": encode_speaker(spk), "alloy": {"alias": "narrator"},
                                                      "nova": encode_speaker(spk), "mine": {"alias": "alloy"}}))
    v = Voices(tmp_path, 64, None, default="alloy")
    assert v.get("alloy") is v.get("narrator") and v.get("mine") is v.get("narrator")
    assert v.get("nova").name == "nova" and "nova" not in v.aliases         # a voice of its own now
    assert v.get("ash") is v.get(OPENAI_ALIASES["ash"])
    kinds = {e["name"]: (e["kind"], e["source"]) for e in v.listing()["voices"]}
    assert kinds["alloy"] == ("alias", "narrator") and kinds["mine"] == ("alias", "narrator")
    assert kinds["narrator"][0] == "speaker" and kinds["nova"][0] == "speaker"
