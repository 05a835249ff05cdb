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


STATS = np.stack([np.linspace(0.5, 2.0, 64), np.linspace(-1.0, 1.0, 64)]).astype(np.float16)


def test_a_blend_of_a_voice_with_itself_is_that_voice(tmp_path):
    v = Voices(tmp_path, 64, STATS)
    amber = v.get("amber").speaker
    for spec in ("amber(2)+amber(1)", "amber", "alloy(3) + nova", "amber(0.5)"):
        np.testing.assert_array_equal(v.get(spec).speaker, amber, err_msg=spec)


def test_a_blend_honours_its_weights_and_keeps_a_speakers_norm(tmp_path):
    """Standardised by the statistics: more weight is nearer, and the mix is as long as its parts
    on average (a plain average of two voices is shorter than either)."""
    v = Voices(tmp_path, 64, STATS)
    z = {n: (v.get(n).speaker - STATS[1].astype(np.float32)) / STATS[0].astype(np.float32)
         for n in ("amber", "basil", "amber(3)+basil(1)", "amber(1)+basil(3)")}
    near = lambda a, b: np.linalg.norm(z[a] - z[b])  # noqa: E731
    assert near("amber(3)+basil(1)", "amber") < near("amber(3)+basil(1)", "basil")
    assert near("amber(1)+basil(3)", "basil") < near("amber(1)+basil(3)", "amber")
    mixed, parts = np.linalg.norm(z["amber(3)+basil(1)"]), (np.linalg.norm(z["amber"]), np.linalg.norm(z["basil"]))
    assert abs(mixed - (3 * parts[0] + parts[1]) / 4) < 0.01 * mixed
    assert np.linalg.norm((z["amber"] + z["basil"]) / 2) < min(parts)


@pytest.mark.parametrize("spec,match", [
    ("amber(0)+basil", r"the weight of 'amber' must be a number in \(0, 100\], got '0'"),
    ("amber(x)", "the weight of 'amber' must be a number"),
    ("amber+", "'' is not a voice with a weight, such as amber"),
    ("amber+zed", "VOICE 'zed' is not a voice here"),
    ("amber+me", "'me' is a voice cloned from a recording, which has no speaker vector to blend"),
    ("+".join(["amber"] * 9), "blends 9 voices; at most 8"),
])
def test_a_bad_blend_names_the_part(tmp_path, spec, match):
    (tmp_path / "voices.json").write_text(json.dumps({"me": {"sample": "x", "sample_text": "hi"}}))
    with pytest.raises(ValueError, match=match):
        Voices(tmp_path, 64, STATS).get(spec)


def test_the_voice_tool_saves_a_blend_as_a_named_voice(tmp_path, capsys):
    """velocity-tts-voice --blend ... --add NAME: the voices file gains NAME, a speaker equal to
    the blend; without --add it prints the blend's speaker string; a bad blend is one line."""
    from checkpoints import tiny_checkpoint
    from client.voice import main
    from velocity.tts.speaker import decode_speaker, load_speaker_stats, speaker_dim

    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=0)
    book = tmp_path / "voices.json"
    assert main(["--blend", "amber(2)+ash(1)", "--add", "warm", "--weights", str(ckpt), "--voices", str(book)]) == 0
    dim = speaker_dim(ckpt)
    voices = Voices(ckpt, dim, load_speaker_stats(ckpt, dim), path=str(book))
    np.testing.assert_array_equal(voices.get("warm").speaker, voices.get("amber(2)+ash(1)").speaker)
    capsys.readouterr()
    assert main(["--blend", "basil+cedar", "--weights", str(ckpt), "--voices", str(book)]) == 0
    np.testing.assert_array_equal(decode_speaker(capsys.readouterr().out.strip(), dim), voices.get("basil+cedar").speaker)
    assert main(["--blend", "amber(-1)", "--weights", str(ckpt), "--voices", str(book)]) == 1
    assert "the weight of 'amber' must be" in capsys.readouterr().err
