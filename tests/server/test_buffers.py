"""What a client's text can make the gateway hold is bounded. Text with no
sentence end is spoken once it passes MAX_PENDING_CHARS, cut at a word; a stream holds at most
MAX_QUEUED sentences waiting (past them: an error naming the text, and the socket goes on); a
WebSocket message is held to the body limit once decompressed. Wyoming's streamed text has the
same bounds (tests/server/test_wyoming.py). Through the gateway of the shared server."""
from __future__ import annotations

import json
import time
import zlib

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from velocity.gateway.sentences import MAX_PENDING_CHARS, MAX_QUEUED, SentenceBuffer

pytestmark = pytest.mark.server
SETUP = {"type": "setup", "model": "tts-1", "voice": "amber", "max_new_tokens": 2}


def speech_socket(gateway: str, **kw):
    return connect(gateway.replace("http://", "ws://") + "/v1/audio/speech/stream", **kw)


def messages(ws, until, timeout: float = 60) -> list[dict]:
    """JSON messages (audio skipped) up to the first for which until(msg) holds."""
    got, end = [], time.monotonic() + timeout
    while True:
        m = ws.recv(timeout=max(0.1, end - time.monotonic()))
        if isinstance(m, bytes):
            continue
        got.append(json.loads(m))
        if until(got[-1]):
            return got


def test_the_pending_text_is_bounded_and_cut_at_a_word():
    buf, said = SentenceBuffer(), []
    for _ in range(100):                                  # 100 KB of words and no sentence end
        said += buf.write("word " * 200)
        assert len(buf.pending) <= MAX_PENDING_CHARS
    assert said and all(0 < len(s) <= MAX_PENDING_CHARS and set(s.split()) == {"word"} for s in said)
    assert len(" ".join(said).split()) + len(buf.pending.split()) == 100 * 200      # no word lost or cut


def test_text_with_no_sentence_end_is_spoken_before_it_ends(gateway):
    with speech_socket(gateway) as ws:
        ws.send(json.dumps(SETUP))
        assert json.loads(ws.recv(timeout=30)) == {"type": "ready"}
        for _ in range(4):                                # 4 KB of words, no sentence end, no flush
            ws.send(json.dumps({"type": "text", "text": "word " * 200}))
        first = messages(ws, lambda m: m["type"] == "sentence")[-1]
        assert 0 < len(first["text"]) <= MAX_PENDING_CHARS and set(first["text"].split()) == {"word"}, first
        ws.send(json.dumps({"type": "cancel"}))


def test_a_flood_of_sentences_is_refused_past_the_queue_and_the_socket_goes_on(gateway):
    with speech_socket(gateway) as ws:
        ws.send(json.dumps(SETUP))
        assert json.loads(ws.recv(timeout=30)) == {"type": "ready"}
        ws.send(json.dumps({"type": "text", "text": "Hi. " * 30_000}))       # 120 KB, 30,000 sentences
        err = messages(ws, lambda m: m["type"] == "error")[-1]
        assert err["param"] == "text" and f"{MAX_QUEUED} sentences wait to be spoken" in err["message"], err
        ws.send(json.dumps({"type": "cancel"}))
        done = messages(ws, lambda m: m["type"] == "cancelled")[-1]
        assert done["dropped"] <= MAX_QUEUED, done
        ws.send(json.dumps({"type": "text", "text": "Still here. "}))
        assert messages(ws, lambda m: m["type"] == "sentence")[-1]["text"] == "Still here."


def test_an_elevenlabs_context_holds_at_most_the_queue(gateway):
    url = gateway.replace("http://", "ws://") + "/v1/text-to-speech/amber/multi-stream-input?output_format=pcm_24000"
    with connect(url) as ws:
        ws.send(json.dumps({"text": " ", "context_id": "a"}))
        ws.send(json.dumps({"text": "Hi. " * 30_000, "context_id": "a"}))
        while "error" not in (m := json.loads(ws.recv(timeout=60))):
            assert "audio" in m, m                                           # the first sentences' audio
        assert m["error"] == "invalid_message" and f"{MAX_QUEUED} sentences wait to be spoken" in m["message"], m
        ws.send(json.dumps({"context_id": "a", "close_context": True}))       # barge-in: it ends at once
        while not (m := json.loads(ws.recv(timeout=60))).get("isFinal"):
            pass
        assert m == {"isFinal": True, "contextId": "a"}


def test_a_message_is_held_to_the_body_limit_once_decompressed(gateway):
    """4 MiB (VELOCITY_GATEWAY_MAX_BODY_BYTES) after permessage-deflate: 5 MiB of one letter, a
    few KB on the wire, closes the socket with 1009 (message too big)."""
    text = json.dumps({"type": "text", "text": "a" * (5 << 20)})
    assert len(zlib.compress(text.encode())) < 64 << 10
    with speech_socket(gateway, max_size=None) as ws:
        ws.send(json.dumps(SETUP))
        assert json.loads(ws.recv(timeout=30)) == {"type": "ready"}
        ws.send(text)
        with pytest.raises(ConnectionClosed):
            while True:
                ws.recv(timeout=30)
    assert ws.close_code == 1009, ws.close_code
