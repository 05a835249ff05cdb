"""A text over the server's limit through velocity-tts-client (client/long_text.py): cut at
paragraphs and sentences, spoken as a pipeline of requests in order, resumed after a failure;
and the cutting on its own."""
from __future__ import annotations

import json

import numpy as np
import pytest

from client.long_text import Progress, speak_long
from client.triton import ServerError, stream_grpc
from client.tts_client import main as client_main
from triton_server import assert_same_audio
from velocity.tts.text_pieces import split_long
from velocity.tts.word_timing import client_words

BOOK = "\n\n".join(f"Paragraph {p} begins here. It has a second sentence, and that is all." for p in range(5))


@pytest.mark.parametrize("limit", [30, 60, 80, 200, 10_000])
def test_pieces_keep_the_order_and_the_limit_and_cut_at_paragraphs_then_sentences(limit):
    pieces = split_long(BOOK, limit)
    assert all(0 < len(p) <= limit for p in pieces)
    assert " ".join(pieces).split() == BOOK.split()                  # every word, in order
    paragraphs = [p.strip() for p in BOOK.split("\n\n")]
    if limit >= max(map(len, paragraphs)):
        assert pieces == paragraphs if limit < len(BOOK) else len(pieces) == 5
    elif limit >= 40:                                                  # sentences fit: cut only between them
        assert all(p.endswith(".") for p in pieces)


def test_a_progress_file_belongs_to_one_text_and_its_settings(tmp_path):
    out = str(tmp_path / "b.wav")
    Progress(out, ["a", "b"], {"SEED": 1}).save(1, 100)
    assert Progress(out, ["a", "b"], {"SEED": 1, "TEXT": "ignored"}).load() == (1, 100)
    with pytest.raises(ValueError, match="belongs to another text or other settings"):
        Progress(out, ["a", "b"], {"SEED": 2}).load()


def read(path) -> np.ndarray:
    import soundfile as sf
    return sf.read(str(path), dtype="float32")[0]


@pytest.mark.server
def test_a_long_text_is_spoken_in_pieces_in_order_and_resumes_after_a_failure(tts_server, tmp_path):
    """The client's WAV is the pieces' audio one after another, each as its own request gives it
    (greedy: pieces batched two at a time round floats otherwise, which a seeded sample can feel);
    a run that fails at the fourth piece leaves three in the WAV and the progress file, and
    --resume ends with the same WAV."""
    url = tts_server.grpc_url
    book = tmp_path / "book.txt"
    book.write_text(BOOK, encoding="utf-8")
    values = {"SEED": 3, "TEMPERATURE": 0.0, "MAX_NEW_TOKENS": 16}
    args = ["--file", str(book), "--url", url, "--max-chars", "80", "--format", "float", "--seed", "3",
            "--temperature", "0", "--max-new-tokens", "16"]
    assert client_main(args + ["-o", str(tmp_path / "all.wav")]) == 0
    pieces = split_long(BOOK, 80)
    assert len(pieces) == 5
    alone = [np.concatenate([a for _, a in stream_grpc(url, values | {"TEXT": p})]) for p in pieces]
    got = read(tmp_path / "all.wav")
    assert_same_audio(got, np.concatenate(alone))
    assert not (tmp_path / "all.wav.progress.json").exists()

    def failing(v: dict):
        if v["TEXT"] == pieces[3]:
            raise ServerError("the fourth piece failed")
        return stream_grpc(url, v)

    part = tmp_path / "part.wav"
    sent = {"TEXT": BOOK} | values | {"SPEAKER_SAMPLE": None}
    with pytest.raises(ServerError, match="fourth piece"):
        speak_long(failing, sent, pieces, str(part), "FLOAT", 2)
    assert json.loads((tmp_path / "part.wav.progress.json").read_text())["pieces"] == 3
    assert_same_audio(read(part), np.concatenate(alone[:3]))
    speak_long(lambda v: stream_grpc(url, v), sent, pieces, str(part), "FLOAT", 2, resume=True)
    assert_same_audio(read(part), got)


@pytest.mark.server
def test_the_gateway_speaks_a_long_input_in_pieces_when_asked(tts_server, side_gw):
    """VELOCITY_GATEWAY_LONG_TEXT=1 (the side gateway's, with VELOCITY_MAX_TEXT_CHARS=80):
    /v1/audio/speech takes an input over the limit and streams its pieces' audio in order, one response, with sentence
    marks counted on across pieces; each piece's audio is what the piece alone gives."""
    import base64
    import urllib.request

    from triton_server import assert_same_pcm

    long_gateway, _ = side_gw
    def speak(url: str, text: str, **extra) -> list[dict]:
        body = {"model": "tts-1", "voice": "amber", "input": text, "response_format": "pcm", "seed": 3,
                "temperature": 0, "max_new_tokens": 16, "stream_format": "sse"} | extra
        req = urllib.request.Request(url + "/v1/audio/speech", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return [json.loads(x[6:]) for x in r.read().decode().splitlines() if x.startswith("data: ")]

    def pcm(events: list[dict]) -> bytes:
        return b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")

    events = speak(long_gateway, BOOK, marks=True, words=True)
    pieces = split_long(BOOK, 80)
    alone = [pcm(speak(tts_server.gateway_url, p)) for p in pieces]
    assert_same_pcm(pcm(events), b"".join(alone))
    marks = [e for e in events if e["type"] == "speech.sentence"]
    assert [m["index"] for m in marks] == list(range(10)) and marks[-1]["end"] == len(pcm(events)) // 2
    assert all(a["end"] == b["start"] for a, b in zip(marks, marks[1:]))
    assert marks[2]["start"] == len(alone[0]) // 2              # the second piece starts after the first
    words = [w for e in events if e["type"] == "speech.words" for w in e["words"]]   # their times too
    assert [w["word"] for w in words] == client_words(BOOK)
    assert all(any(m["start"] <= w["start"] <= w["end"] <= m["end"] for m in marks) for w in words)
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and starts[-1] < marks[-1]["end"]
    assert any(marks[2]["start"] <= w["start"] < marks[3]["start"] for w in words)
