"""Voice-agent frameworks, unchanged apart from their base URL, against the real server: Pipecat's
own OpenAI TTS service and its ElevenLabs WebSocket service (pipecat-ai, installed with the test
tools) in a Pipecat pipeline, and LiveKit Agents' OpenAI TTS.

The gateway here has VELOCITY_GATEWAY_DEFAULT_SEED set: a framework's OpenAI client sends no
seed, and with one the same text gives the same audio, which the official `openai` client's
request for the same text must then equal.
"""
from __future__ import annotations

import pytest

from benchmarks.agents import livekit_elevenlabs_words, livekit_synthesize, pipecat_heard_words, pipecat_pipeline
from triton_server import LONG_TEXT, assert_same_pcm, assert_work_stops, side_gateway
from velocity.tts.word_timing import client_words

pytestmark = pytest.mark.server
TEXT = "Hello there, how are you today?"          # one sentence: one request, however it is cut
TURN = "Hello there, how are you today? I hope the weather is kind to you."     # two sentences


@pytest.fixture(scope="module")
def agent_gateway(tts_server, tmp_path_factory):
    with side_gateway(tts_server, tmp_path_factory.mktemp("agents") / "gateway.log",
                      VELOCITY_GATEWAY_DEFAULT_SEED="7") as url:
        yield url


def test_pipecats_openai_tts_speaks_our_api_audio_at_24_khz(agent_gateway):
    import openai

    audio, rates, _, _ = pipecat_pipeline(agent_gateway, TEXT)
    assert rates == {24000} and len(audio) > 0 and len(audio) % 2 == 0
    api = openai.OpenAI(base_url=agent_gateway + "/v1", api_key="unused", max_retries=0)
    ours = api.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm").read()
    assert_same_pcm(audio, ours)


def test_a_pipecat_agent_that_cancels_stops_the_servers_work(agent_gateway, tts_server):
    *_, left = pipecat_pipeline(agent_gateway, LONG_TEXT, leave_at_first_audio=True)
    assert_work_stops(tts_server, left)


@pytest.mark.parametrize("model", ["tts-1", "gpt-4o-mini-tts"])     # a raw audio stream, and SSE
def test_livekits_openai_tts_speaks_our_api_audio_at_24_khz(agent_gateway, model):
    """LiveKit's audio emitter cuts the stream into 10 ms frames and pads the last one with silence:
    the audio is ours to the sample, then at most 20 ms of zeros."""
    import numpy as np
    import openai

    audio, rates, _, _ = livekit_synthesize(agent_gateway, TEXT, model)
    assert rates == {24000}
    api = openai.OpenAI(base_url=agent_gateway + "/v1", api_key="unused", max_retries=0)
    ours = api.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm").read()
    got, want = np.frombuffer(audio, "<i2"), np.frombuffer(ours, "<i2")
    assert len(want) <= len(got) <= len(want) + 480 and not got[len(want):].any()
    assert_same_pcm(audio[:len(ours)], ours)


def test_a_livekit_agent_that_closes_the_stream_stops_the_servers_work(agent_gateway, tts_server):
    *_, left = livekit_synthesize(agent_gateway, LONG_TEXT, leave_at_first_audio=True)
    assert_work_stops(tts_server, left)


def resampled_pcm(pcm: bytes, rate: int) -> bytes:
    """16-bit pcm at 24 kHz -> at `rate`, by the gateway's resampler in one piece."""
    import numpy as np

    from velocity.gateway.encode import Encoder
    enc = Encoder("pcm", 24000, rate)
    return enc.push(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768) + enc.finish()


def test_pipecats_elevenlabs_service_speaks_our_api_audio_resampled(agent_gateway):
    """Pipecat's ElevenLabsTTSService with its `url` on the gateway (its multi-context WebSocket,
    velocity/gateway/elevenlabs.py), in a 16 kHz pipeline: frames at 16 kHz (output_format
    pcm_16000), our API's audio for the same seeded text, resampled. Against our API's 24 kHz
    audio resampled by the same FFmpeg resampler in one piece: the gateway resamples the float
    audio chunk by chunk, this the 16-bit audio, so one more 16-bit step either side (3 / 32768)."""
    import numpy as np
    import openai

    audio, rates, _, _ = pipecat_pipeline(agent_gateway, TEXT, rate=16000, service="elevenlabs")
    assert rates == {16000} and len(audio) > 0
    api = openai.OpenAI(base_url=agent_gateway + "/v1", api_key="unused", max_retries=0)
    ours = api.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm").read()
    got, want = (np.frombuffer(b, "<i2").astype(np.float32) / 32768 for b in (audio, resampled_pcm(ours, 16000)))
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(np.abs(want).max()) + 3 / 32768)


def test_a_pipecat_elevenlabs_barge_in_stops_the_servers_work(agent_gateway, tts_server):
    """The user talks over it (Pipecat's InterruptionFrame): Pipecat closes the context, a second
    time (its turn's end already closed it after a flush), and the server's work on it stops."""
    *_, left = pipecat_pipeline(agent_gateway, LONG_TEXT, service="elevenlabs", interrupt_at_first_audio=True)
    assert_work_stops(tts_server, left)


def test_pipecats_elevenlabs_service_tells_the_agent_each_word_as_it_is_played(agent_gateway):
    """A two-sentence turn played in real time (velocity.gateway.word_times' alignment): the words
    that come out of the output transport, which the agent's context records, are the turn's,
    with rising presentation times inside the audio played."""
    words, played, _ = pipecat_heard_words(agent_gateway, TURN)
    assert [w for w, _ in words] == client_words(TURN)
    times = [t for _, t in words]
    assert times == sorted(times) and times[-1] > times[0] and times[-1] < played, (times, played)


def test_a_pipecat_barge_in_leaves_the_words_heard_in_the_context(agent_gateway):
    """The user talks over the bot a second into its audio: the words the context keeps are those
    played before it, a non-empty proper prefix of the turn (before word timing: none of them).
    Pipecat releases words by its clock from the first audio: where the audio played fell behind
    that clock (a server slower than real time, or sleeps that overran on a loaded machine), a word
    may be heard up to that far past the audio played, and no further."""
    words, played, behind = pipecat_heard_words(agent_gateway, TURN, barge_in_after=1.0)
    turn = client_words(TURN)
    assert 0 < len(words) < len(turn) and [w for w, _ in words] == turn[:len(words)], (words, played)
    assert all(t <= played + behind for _, t in words), (words, played, behind)


def test_livekits_elevenlabs_plugin_reports_an_aligned_transcript(agent_gateway):
    """LiveKit's ElevenLabs plugin through the gateway (it asks for sync_alignment: times from the
    context's start): it speaks, and its aligned transcript has the turn's words (as read: it
    prefers ElevenLabs' normalised alignment) at rising times inside the audio."""
    import re

    audio, rates, words = livekit_elevenlabs_words(agent_gateway, TURN)
    seconds = len(audio) / 2 / 24000
    assert rates == {24000} and seconds > 1
    letters = re.sub(r"[^a-z]", "", "".join(w for w, _, _ in words).lower())
    assert letters == re.sub(r"[^a-z]", "", TURN.lower())
    starts = [s for _, s, _ in words]
    assert starts == sorted(starts) and all(0 <= s <= e <= seconds + 0.02 for _, s, e in words), (words, seconds)
