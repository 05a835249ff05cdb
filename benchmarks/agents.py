"""Voice-agent frameworks as an agent drives them, pointed at the gateway by their base URL:
Pipecat's OpenAITTSService or ElevenLabsTTSService (its WebSocket, velocity/gateway/elevenlabs.py)
in a Pipecat pipeline, LiveKit Agents' openai.TTS. Each returns
(the audio bytes, their sample rates, seconds to the first audio, when it left early or None).
Used by tests/server/test_agents.py and benchmarks/bench_agents.py; the frameworks come from
tests/agents-requirements.txt."""
from __future__ import annotations

import asyncio
import time


def pipecat_pipeline(base_url: str, text: str, rate: int = 24000, leave_at_first_audio: bool = False,
                     service: str = "openai", interrupt_at_first_audio: bool = False):
    """Pipecat's OpenAITTSService (service "openai") or ElevenLabsTTSService ("elevenlabs") in a
    pipeline at `rate`, as an agent has it: (its audio frames' bytes, their sample rates, seconds
    from queueing the text to the first audio frame, when the pipeline was cancelled or
    interrupted, or None). interrupt_at_first_audio: the user talks over it, an InterruptionFrame
    (Pipecat's barge-in), and the pipeline goes on to its end."""
    from pipecat.frames.frames import EndFrame, InterruptionFrame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.frame_processor import FrameProcessor

    class Sink(FrameProcessor):
        def __init__(self) -> None:
            super().__init__()
            self.audio, self.rates, self.heard, self.first = b"", set(), asyncio.Event(), None

        async def process_frame(self, frame, direction) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                self.first = self.first or time.perf_counter()
                self.audio += frame.audio
                self.rates.add(frame.sample_rate)
                self.heard.set()
            await self.push_frame(frame, direction)

    async def run():
        tts = pipecat_tts(base_url, service)
        sink = Sink()
        task = PipelineTask(Pipeline([tts, sink]), params=PipelineParams(audio_out_sample_rate=rate))
        t0 = time.perf_counter()
        early = leave_at_first_audio or interrupt_at_first_audio
        await task.queue_frames([TTSSpeakFrame(text)] + ([] if early else [EndFrame()]))
        runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        left = None
        if early:
            await asyncio.wait_for(sink.heard.wait(), 120)
            if leave_at_first_audio:             # the agent cancels
                await task.cancel()
            else:                                # the user talks over it, then the pipeline ends
                await task.queue_frames([InterruptionFrame(), EndFrame()])
            left = time.monotonic()
        await asyncio.wait_for(runner, 120)
        return sink.audio, sink.rates, (sink.first or t0) - t0, left

    return asyncio.run(run())


def pipecat_tts(base_url: str, service: str = "openai"):
    """Pipecat's OpenAITTSService ("openai") or ElevenLabsTTSService ("elevenlabs") on the gateway."""
    if service == "elevenlabs":
        from pipecat.services.elevenlabs.tts import ElevenLabsTTSService
        return ElevenLabsTTSService(api_key="unused", url=base_url.replace("http", "ws", 1),
                                    settings=ElevenLabsTTSService.Settings(voice="alloy"))
    from pipecat.services.openai.tts import OpenAITTSService
    return OpenAITTSService(api_key="unused", base_url=base_url + "/v1",
                            settings=OpenAITTSService.Settings(voice="alloy", model="tts-1"))


def pipecat_heard_words(base_url: str, text: str, barge_in_after: float | None = None, rate: int = 16000):
    """Pipecat's ElevenLabsTTSService in a pipeline whose output plays its audio in real time.

    The transport takes each frame for as long as it lasts, as an agent's does. Returns the
    TTSTextFrames that came out of it, each (text, seconds after the first word's presentation
    time), the seconds of audio played, and how far that audio fell behind the clock by the
    barge-in (0 without one). The frames are the words the agent's context records: the transport
    holds each until its presentation time by its clock from the first audio, and drops what is
    left at a barge-in; where the audio came slower than real time, the words ran ahead of it by
    as much. barge_in_after: the user talks over the bot this many seconds into its audio."""
    from pipecat.frames.frames import EndFrame, InterruptionFrame, TTSSpeakFrame, TTSTextFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.transports.base_output import BaseOutputTransport
    from pipecat.transports.base_transport import TransportParams

    class Speaker(BaseOutputTransport):
        def __init__(self) -> None:
            super().__init__(TransportParams(audio_out_enabled=True, audio_out_sample_rate=rate))
            self.played, self.started, self.since = 0.0, asyncio.Event(), 0.0

        async def start(self, frame) -> None:
            await super().start(frame)
            await self.set_transport_ready(frame)

        async def write_audio_frame(self, frame) -> bool:
            seconds = len(frame.audio) / 2 / frame.sample_rate
            sound = bool(frame.audio.strip(b"\0"))  # not the transport's own silence
            if sound and not self.started.is_set():
                self.since = time.monotonic()       # the first audio begins to play
            await asyncio.sleep(seconds)
            if sound:
                self.played += seconds
                self.started.set()
            return True

    class Words(FrameProcessor):
        def __init__(self) -> None:
            super().__init__()
            self.words: list[tuple[str, int]] = []

        async def process_frame(self, frame, direction) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSTextFrame):
                self.words.append((frame.text, frame.pts))
            await self.push_frame(frame, direction)

    async def run():
        speaker, words, behind = Speaker(), Words(), 0.0
        task = PipelineTask(Pipeline([pipecat_tts(base_url, "elevenlabs"), speaker, words]),
                            params=PipelineParams(audio_out_sample_rate=rate))
        await task.queue_frames([TTSSpeakFrame(text)] + ([] if barge_in_after is not None else [EndFrame()]))
        runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        if barge_in_after is not None:
            await asyncio.wait_for(speaker.started.wait(), 120)
            await asyncio.sleep(barge_in_after)
            behind = time.monotonic() - speaker.since - speaker.played
            await task.queue_frames([InterruptionFrame(), EndFrame()])
        await asyncio.wait_for(runner, 300)
        first = words.words[0][1] if words.words else 0
        return [(w, (pts - first) / 1e9) for w, pts in words.words], speaker.played, max(behind, 0.0)

    return asyncio.run(run())


def livekit_synthesize(base_url: str, text: str, model: str = "tts-1", leave_at_first_audio: bool = False):
    """LiveKit Agents' OpenAI TTS (livekit-plugins-openai) as an agent uses it: (the bytes of its
    audio frames, their sample rates, seconds to the first frame, when the stream was closed early
    or None)."""
    from livekit.plugins import openai as lk_openai

    async def run():
        tts = lk_openai.TTS(base_url=base_url + "/v1", api_key="unused", model=model, voice="alloy",
                            response_format="pcm")
        audio, rates, left, first = b"", set(), None, None
        t0 = time.perf_counter()
        try:
            async with tts.synthesize(text) as stream:
                async for ev in stream:
                    first = first or time.perf_counter()
                    audio += bytes(ev.frame.data)
                    rates.add(ev.frame.sample_rate)
                    if leave_at_first_audio:          # the user talks over it: the agent closes the stream
                        await stream.aclose()
                        left = time.monotonic()
                        break
        finally:
            await tts.aclose()
        return audio, rates, (first or t0) - t0, left

    return asyncio.run(run())


def livekit_elevenlabs_words(base_url: str, text: str):
    """LiveKit's ElevenLabs plugin (livekit-plugins-elevenlabs) streaming `text` through the
    gateway's ElevenLabs socket as an agent's TTS node does: (the audio bytes, their sample rates,
    the aligned transcript's words as (text, start, end) seconds, in the order they came)."""
    import aiohttp
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
    from livekit.plugins import elevenlabs

    async def run():
        async with aiohttp.ClientSession() as session:
            tts = elevenlabs.TTS(base_url=base_url + "/v1", api_key="unused", voice_id="alloy",
                                 encoding="pcm_24000", http_session=session)
            audio, rates, words = b"", set(), []
            try:
                async with tts.stream() as stream:
                    stream.push_text(text)
                    stream.end_input()
                    async for ev in stream:
                        audio += bytes(ev.frame.data)
                        rates.add(ev.frame.sample_rate)
                        for w in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []):
                            words.append((str(w), w.start_time, w.end_time))
            finally:
                await tts.aclose()
            return audio, rates, words

    return asyncio.run(run())
