"""Voices on the real server: voice samples as audio or strings, the voices file, named voices and
their listing, and velocity-tts-voice."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from client.triton import make_inputs
from triton_server import ROOT, assert_same_audio
from velocity.tts.voices import BUILTIN, DEFAULT_VOICE

from tts_calls import SERVED, one_line, run_cli, stream_tts, wav_bytes

pytestmark = pytest.mark.server


def test_a_voice_sample_as_audio_or_as_its_string_gives_the_pipelines_audio(server, tmp_path):
    """SPEAKER_SAMPLE as a 16 kHz FLAC recording (the server resamples and encodes it) and as the
    string velocity-tts-voice makes of the same file: the same audio, through tts and tts_offline,
    equal to the in-process pipeline with that string; and not the audio without a sample."""
    from velocity.tts.pipeline import TTSPipeline, chattts_params

    flac = tmp_path / "me.flac"
    flac.write_bytes(wav_bytes(1.5, fmt="FLAC"))
    env = {**os.environ, **server.env, "PYTHONPATH": str(ROOT)}
    made = subprocess.run([sys.executable, "-m", "client.voice", str(flac), "the sample", "-o", str(tmp_path / "v.txt")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert made.returncode == 0, made.stderr
    string = (tmp_path / "v.txt").read_text().strip()
    values = {"TEXT": "Say it like me.", "SEED": 5, "MAX_NEW_TOKENS": 16, "SAMPLE_TEXT": "the sample"}
    by_audio, err = stream_tts(server.grpc_url, {**values, "SPEAKER_SAMPLE": flac.read_bytes()})
    assert err is None, err
    by_string, err = stream_tts(server.grpc_url, {**values, "SPEAKER_SAMPLE": string})
    assert err is None, err
    audio = np.concatenate([a for _, a in by_audio])
    np.testing.assert_array_equal(np.concatenate([a for _, a in by_string]), audio)
    whole = grpcclient.InferenceServerClient(server.grpc_url).infer(
        "tts_offline", make_inputs(grpcclient, {**values, "SPEAKER_SAMPLE": string})).as_numpy("WAVEFORM").reshape(-1)
    np.testing.assert_array_equal(whole, audio)
    plain, _ = stream_tts(server.grpc_url, {k: v for k, v in values.items() if k != "SAMPLE_TEXT"})
    assert not np.array_equal(np.concatenate([a for _, a in plain]), audio)
    pipe = TTSPipeline(server.env["VELOCITY_WEIGHTS"], device="cpu", schedule=SERVED, lookahead=4,
                       num_kv_blocks=64)
    local = pipe.synthesize(values["TEXT"], sample=string, sample_text="the sample",
                            params=chattts_params(seed=5, max_new_tokens=16))
    assert_same_audio(audio, local)


def test_voice_cli_errors_say_what_is_wrong(server, tmp_path):
    (tmp_path / "quiet.wav").write_bytes(wav_bytes(1.0, amp=0.0))
    p = subprocess.run([sys.executable, "-m", "client.voice", str(tmp_path / "quiet.wav"), "-o", str(tmp_path / "v.txt"),
                        "--weights", server.env["VELOCITY_WEIGHTS"]], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 1 and "quiet.wav audio is silent" in p.stderr and not (tmp_path / "v.txt").exists(), p.stderr


def test_named_voices_the_default_voice_and_the_voices_list(server, tmp_path):
    """VOICE picks a built-in voice (a seeded draw: SPEAKER_SEED of its seed gives the same audio);
    no voice at all is the default voice; the voices model lists them; bad VOICE is INVALID_ARG
    naming the voices; the client prints the list."""
    from client.triton import list_voices

    base = {"TEXT": "One voice for all. Every sentence.", "SEED": 2, "MAX_NEW_TOKENS": 12}
    named, err = stream_tts(server.grpc_url, {**base, "VOICE": "basil"})
    assert err is None, err
    seeded, _ = stream_tts(server.grpc_url, {**base, "SPEAKER_SEED": BUILTIN["basil"]})
    assert_same_audio(np.concatenate([a for _, a in named]), np.concatenate([a for _, a in seeded]))
    default, _ = stream_tts(server.grpc_url, base)
    amber, _ = stream_tts(server.grpc_url, {**base, "VOICE": DEFAULT_VOICE})
    assert_same_audio(np.concatenate([a for _, a in default]), np.concatenate([a for _, a in amber]))
    assert not np.array_equal(np.concatenate([a for _, a in default]), np.concatenate([a for _, a in named]))
    listing = list_voices(server.grpc_url)
    assert listing["default"] == DEFAULT_VOICE and {v["name"] for v in listing["voices"]} >= set(BUILTIN)
    _, err = stream_tts(server.grpc_url, {**base, "VOICE": "nobody"})
    assert err and "VOICE 'nobody' is not a voice here; voices: amber, basil" in err, err
    _, err = stream_tts(server.grpc_url, {**base, "VOICE": "basil", "SPEAKER_SEED": 3})
    assert err and "VOICE names a whole voice: send it without SPEAKER_SEED" in err, err
    p = run_cli("--list-voices", "--url", server.grpc_url)
    assert p.returncode == 0 and "amber (default)\tspeaker\tbuilt-in" in p.stdout, p.stdout + p.stderr


def test_the_voices_model_lists_without_torch(server):
    """The `voices` stub only lists names: it loads no torch (CPU and memory at every server
    start), which only a built-in voice's vector (torch's seeded draw) would need. Nor does the
    llm's stub: its torch is in its engine core, a process of its own."""
    def maps(model: str) -> str:
        return Path(f"/proc/{server.part_pid(model)}/maps").read_text()
    assert "libtorch" in maps("vocoder")                   # the check can see torch where it is
    assert "libtorch" not in maps("voices") and "libtorch" not in maps("llm")


def test_a_voice_from_the_voices_file_is_its_sample_and_transcript(server):
    """voices.json beside the weights (conftest: "clone", a sample string and its transcript):
    VOICE "clone" speaks as SPEAKER_SAMPLE + SAMPLE_TEXT of that entry."""
    import json

    entry = json.loads((Path(server.env["VELOCITY_WEIGHTS"]) / "voices.json").read_text())["clone"]
    base = {"TEXT": "Cloned by name.", "SEED": 4, "MAX_NEW_TOKENS": 12}
    by_name, err = stream_tts(server.grpc_url, {**base, "VOICE": "clone"})
    assert err is None, err
    by_sample, _ = stream_tts(server.grpc_url, {**base, "SPEAKER_SAMPLE": entry["sample"],
                                                "SAMPLE_TEXT": entry["sample_text"]})
    assert_same_audio(np.concatenate([a for _, a in by_name]), np.concatenate([a for _, a in by_sample]))
    from client.triton import list_voices
    clone = [v for v in list_voices(server.grpc_url)["voices"] if v["name"] == "clone"]
    assert clone and clone[0]["kind"] == "sample" and clone[0]["sample_text"] == "the sample text"


def test_voice_cli_adds_a_named_voice_to_a_voices_file(server, tmp_path):
    """velocity-tts-voice --add NAME --voices FILE: the entry the server would load (its sample
    string equals the one -o writes for the same recording)."""
    import json

    (tmp_path / "me.wav").write_bytes(wav_bytes(1.0))
    book = tmp_path / "book.json"
    p = subprocess.run([sys.executable, "-m", "client.voice", str(tmp_path / "me.wav"), "hello there", "--add", "me",
                        "--voices", str(book), "-o", str(tmp_path / "me.txt"), "--weights", server.env["VELOCITY_WEIGHTS"]],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and "added voice 'me'" in p.stderr, p.stderr
    entry = json.loads(book.read_text())["me"]
    assert entry == {"sample": (tmp_path / "me.txt").read_text().strip(), "sample_text": "hello there"}
