"""velocity-tts-client against the real server: the same WAV over gRPC, HTTP and tts_offline, its
word timing, and its errors in one line."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from client.triton import stream_grpc
from client.tts_client import main as client_main
from triton_server import ROOT, free_port
from tts_calls import one_line, run_cli
from velocity.tts.word_timing import client_words


pytestmark = pytest.mark.server


def test_client_cli_grpc_http_offline_write_the_same_wav(server, tmp_path, caplog):
    import logging
    import wave

    import soundfile as sf

    from velocity.tts.speaker import encode_speaker, load_speaker_stats, random_speaker
    caplog.set_level(logging.INFO)
    common = ["--seed", "11", "--max-new-tokens", "20"]
    text = tmp_path / "in.txt"
    text.write_text("Hello there. 你好。", encoding="utf-8")
    wavs = {}
    for mode, url, flags in [("grpc", server.grpc_url, []), ("http", server.http_url, ["--http"]),
                             ("offline", server.grpc_url, ["--offline"]),
                             ("float", server.grpc_url, ["--format", "float"])]:
        out = tmp_path / f"{mode}.wav"
        # the server makes the speaker from the seed, at the weights' size (64 in the tiny demo)
        assert client_main(["--file", str(text), "-o", str(out), "--url", url, "--speaker-seed", "3",
                            *flags, *common]) == 0
        wavs[mode], sr = sf.read(out, dtype="float32")
        assert sr == 24000 and len(wavs[mode]) > 0 and len(wavs[mode]) % 512 == 0
        assert sf.info(out).subtype == ("FLOAT" if mode == "float" else "PCM_16")
    with wave.open(str(tmp_path / "grpc.wav")) as w:          # 16-bit PCM: the standard library reads it
        assert (w.getsampwidth(), w.getframerate(), w.getnframes()) == (2, 24000, len(wavs["grpc"]))
    np.testing.assert_array_equal(wavs["grpc"], wavs["offline"])
    # 16-bit PCM holds the float audio to 1.5 steps (a step is 1/32768): half a step of rounding, and
    # libsndfile scales by 32767 on writing and 1/32768 on reading (up to one step at full scale)
    np.testing.assert_allclose(wavs["grpc"], np.clip(wavs["float"], -1, 1), rtol=0, atol=1.5 / 32768)
    # JSON floats round trip to ~1e-7, which may cross one rounding boundary of the 16-bit grid
    np.testing.assert_allclose(wavs["http"], wavs["grpc"], rtol=0, atol=1 / 32768 + 1e-7)
    assert "first audio after" in caplog.text and "RTF" in caplog.text
    # SPEAKER_SEED is the speaker string of the same seed's speaker, from the weights' statistics
    spk = encode_speaker(random_speaker(3, 64, load_speaker_stats(server.env["VELOCITY_WEIGHTS"], 64)))
    assert client_main(["--file", str(text), "-o", str(tmp_path / "spk.wav"), "--url", server.grpc_url,
                        "--speaker", spk, "--format", "float", *common]) == 0
    np.testing.assert_array_equal(sf.read(tmp_path / "spk.wav", dtype="float32")[0], wavs["float"])


@pytest.mark.parametrize("http", [False, True], ids=["grpc", "http"])
def test_the_client_prints_the_words_as_they_come(server, tmp_path, http):
    """velocity-tts-client --words: each word the text has, in order, with rising times within the
    audio written; --offline has none, said in one line."""
    import soundfile as sf

    text, out = "Good morning, it is 7 am. See you soon.", tmp_path / "w.wav"
    url = server.http_url if http else server.grpc_url
    p = run_cli(text, "-o", str(out), "--url", url, "--words", "--seed", "4", "--max-new-tokens", "40",
                *(["--http"] if http else []), "--api-key", server.triton_key or "")
    assert p.returncode == 0, p.stderr
    rows = [line.split(None, 2) for line in p.stderr.splitlines() if line.startswith(" ")]
    assert [r[2] for r in rows] == client_words(text)
    times = [(float(a), float(b)) for a, b, _ in rows]
    seconds = sf.info(str(out)).duration
    assert all(0 <= a <= b <= seconds + 1e-3 for a, b in times) and [a for a, _ in times] == sorted(a for a, _ in times)
    p = run_cli(text, "-o", str(out), "--url", server.grpc_url, "--words", "--offline")
    assert p.returncode == 2 and "--words needs a stream" in one_line(p)


def test_client_cli_errors_exit_with_one_line_and_never_hang(server, tmp_path):
    """Each used to hang (a gRPC stream left open) or print a traceback."""
    p = run_cli("Hi.", "-o", str(tmp_path / "nodir" / "x.wav"), "--url", server.grpc_url)
    assert p.returncode == 2 and "does not exist" in one_line(p)
    p = run_cli("Hi.", "-o", "/dev/full", "--url", server.grpc_url, "--max-new-tokens", "20")
    assert p.returncode == 1 and one_line(p).startswith("error:")          # fails after the stream began
    p = run_cli("Hi.", "-o", str(tmp_path / "x.wav"), "--http", "--url", server.grpc_url)
    assert p.returncode == 1 and "is that the gRPC port?" in one_line(p)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Caf\xe9 cr\xe8me.".encode("latin-1"))
    p = run_cli("--file", str(latin1), "-o", str(tmp_path / "x.wav"), "--url", server.grpc_url)
    assert p.returncode == 2 and "is not UTF-8 text" in one_line(p)
    p = run_cli("Hi.", "-o", str(tmp_path / "x.wav"), "--url", server.grpc_url, "--temperature", "-1")
    assert p.returncode == 1 and "TEMPERATURE must be >= 0" in one_line(p)
    assert not (tmp_path / "x.wav").exists()


def test_a_server_that_is_not_serving_is_a_retryable_refusal():
    """No server: the readiness check's refusal is NotServing, which stream_grpc's retries try
    again (behind a balancer, a replica shutting down answers its readiness calls so), and after
    the last try it is raised with the address."""
    from client.triton import NotServing, stream_grpc
    url = f"localhost:{free_port()}"
    with pytest.raises(NotServing, match=f"no Triton server at {url}"):
        list(stream_grpc(url, {"TEXT": "Hi."}, retries=1))


def test_client_cli_says_when_the_server_is_down(tmp_path, caplog):
    out = tmp_path / "x.wav"
    assert client_main(["hi", "-o", str(out), "--url", f"localhost:{free_port()}"]) == 1
    assert "no Triton server at" in caplog.text and "make serve" in caplog.text
    assert not out.exists()
