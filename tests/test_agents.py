"""Voice-agent frameworks, unchanged apart from their base URL, against the real server: Pipecat's
own OpenAI TTS service (pipecat-ai, installed with the test tools) in a Pipecat pipeline.

The gateway here has VELOCITY_GATEWAY_DEFAULT_SEED set: a framework's OpenAI client sends no
seed, and with one the same text gives the same audio, which the official `openai` client's
request for the same text must then equal.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from triton_server import LONG_TEXT, assert_same_pcm, assert_work_stops, side_gateway

pytestmark = pytest.mark.server
TEXT = "Hello there, how are you today?"          # one sentence: one request, however it is cut


@pytest.fixture(scope="module")
def agent_gateway(tts_server, tmp_path_factory):
    with side_gateway(tts_server, tmp_path_factory.mktemp("agents") / "gateway.log",
                      VELOCITY_GATEWAY_DEFAULT_SEED="7") as url:
        yield url


def pipecat_pipeline(base_url: str, text: str, rate: int = 24000, leave_at_first_audio: bool = False):
    """Pipecat's OpenAITTSService in a pipeline, as an agent has it: (its audio frames' bytes, their
    sample rates, when the pipeline was cancelled or None)."""
    from pipecat.frames.frames import EndFrame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.services.openai.tts import OpenAITTSService

    class Sink(FrameProcessor):
        def __init__(self) -> None:
            super().__init__()
            self.audio, self.rates, self.heard = b"", set(), asyncio.Event()

        async def process_frame(self, frame, direction) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                self.audio += frame.audio
                self.rates.add(frame.sample_rate)
                self.heard.set()
            await self.push_frame(frame, direction)

    async def run():
        tts = OpenAITTSService(api_key="unused", base_url=base_url + "/v1",
                               settings=OpenAITTSService.Settings(voice="alloy", model="tts-1"))
        sink = Sink()
        task = PipelineTask(Pipeline([tts, sink]), params=PipelineParams(audio_out_sample_rate=rate))
        await task.queue_frames([TTSSpeakFrame(text)] + ([] if leave_at_first_audio else [EndFrame()]))
        runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        left = None
        if leave_at_first_audio:                 # the user talks over it: the agent cancels
            await asyncio.wait_for(sink.heard.wait(), 120)
            await task.cancel()
            left = time.monotonic()
        await asyncio.wait_for(runner, 120)
        return sink.audio, sink.rates, left

    return asyncio.run(run())


def test_pipecats_openai_tts_speaks_our_api_audio_at_24_khz(agent_gateway):
    import openai

    audio, rates, _ = pipecat_pipeline(agent_gateway, TEXT)
    assert rates == {24000} and len(audio) > 0 and len(audio) % 2 == 0
    api = openai.OpenAI(base_url=agent_gateway + "/v1", api_key="unused", max_retries=0)
    ours = api.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm").read()
    assert_same_pcm(audio, ours)


def test_a_pipecat_agent_that_cancels_stops_the_servers_work(agent_gateway, tts_server):
    _, _, left = pipecat_pipeline(agent_gateway, LONG_TEXT, leave_at_first_audio=True)
    assert_work_stops(tts_server, left)


def livekit_synthesize(base_url: str, text: str, model: str = "tts-1", leave_at_first_audio: bool = False):
    """LiveKit Agents' OpenAI TTS (livekit-plugins-openai) as an agent uses it: (the bytes of its
    audio frames, their sample rates, when the stream was closed early or None)."""
    from livekit.plugins import openai as lk_openai

    async def run():
        tts = lk_openai.TTS(base_url=base_url + "/v1", api_key="unused", model=model, voice="alloy",
                            response_format="pcm")
        audio, rates, left = b"", set(), None
        try:
            async with tts.synthesize(text) as stream:
                async for ev in stream:
                    audio += bytes(ev.frame.data)
                    rates.add(ev.frame.sample_rate)
                    if leave_at_first_audio:          # the user talks over it: the agent closes the stream
                        await stream.aclose()
                        left = time.monotonic()
                        break
        finally:
            await tts.aclose()
        return audio, rates, left

    return asyncio.run(run())


@pytest.mark.parametrize("model", ["tts-1", "gpt-4o-mini-tts"])     # a raw audio stream, and SSE
def test_livekits_openai_tts_speaks_our_api_audio_at_24_khz(agent_gateway, model):
    """LiveKit's audio emitter cuts the stream into 10 ms frames and pads the last one with silence:
    the audio is ours to the sample, then at most 20 ms of zeros."""
    import numpy as np
    import openai

    audio, rates, _ = livekit_synthesize(agent_gateway, TEXT, model)
    assert rates == {24000}
    api = openai.OpenAI(base_url=agent_gateway + "/v1", api_key="unused", max_retries=0)
    ours = api.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm").read()
    got, want = np.frombuffer(audio, "<i2"), np.frombuffer(ours, "<i2")
    assert len(want) <= len(got) <= len(want) + 480 and not got[len(want):].any()
    assert_same_pcm(audio[:len(ours)], ours)


def test_a_livekit_agent_that_closes_the_stream_stops_the_servers_work(agent_gateway, tts_server):
    _, _, left = livekit_synthesize(agent_gateway, LONG_TEXT, leave_at_first_audio=True)
    assert_work_stops(tts_server, left)
