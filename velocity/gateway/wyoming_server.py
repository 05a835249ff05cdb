"""Home Assistant's Wyoming protocol in front of the Triton server, on the `wyoming` package.

    velocity-tts-wyoming --uri tcp://127.0.0.1:10200 --triton localhost:8001

`describe` is answered with the server's voices. `synthesize` streams 16-bit 24 kHz mono as
audio-start, audio-chunk per chunk from Triton, audio-stop. Streamed text (synthesize-start,
synthesize-chunk..., synthesize-stop, as Home Assistant sends an LLM's reply) is spoken a
sentence at a time as sentences complete, each as its own audio-start ... audio-stop, then
synthesize-stopped; the plain `synthesize` that such a client sends alongside is ignored.
A failed request is answered with an `error` event; the connection stays usable.

Speech runs beside the connection's reading: a new `synthesize` (or `synthesize-start`) while one
is still speaking is a barge-in, which stops the current one (its audio ends with audio-stop) and
cancels its Triton stream; a connection that closes cancels what it was speaking. Either way the
server stops that work within a second.
"""
import argparse
import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler, AsyncServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from velocity.gateway import caller
from velocity.gateway.encode import pcm16
from velocity.gateway.sentences import MAX_QUEUED, SentenceBuffer
from velocity.gateway.upstream import ApiError, Gateway
from velocity.serving.settings import Settings
from velocity.tts.ssml import is_ssml

log = logging.getLogger("velocity.wyoming")
RATE, WIDTH, CHANNELS = 24000, 2, 1              # what `tts` streams, as 16-bit pcm
ATTRIBUTION = Attribution(name="2noise (ChatTTS)", url="https://github.com/2noise/ChatTTS")


async def describe(gw: Gateway) -> Info:
    """The Wyoming `info`: one TTS program whose voices are the server's named voices."""
    listing = await gw.voices()
    voices = [TtsVoice(name=v["name"], description=f"{v['name']} ({v.get('source', 'server')} voice)", attribution=ATTRIBUTION,
                       installed=True, version=None, languages=["en", "zh"])
              for v in listing["voices"] if v["kind"] != "alias"]         # OpenAI's names: for OpenAI's API
    return Info(tts=[TtsProgram(name="velocity-tts", description="Streaming ChatTTS on Triton",
                                attribution=ATTRIBUTION, installed=True, version="0.1.0", voices=voices,
                                supports_synthesize_streaming=True)])


class SpeechHandler(AsyncEventHandler):
    """One Wyoming connection: describe, synthesize, and streamed synthesize. What it says goes
    out in order from one chain of tasks (self.speech), which a barge-in or a hang-up cancels."""

    def __init__(self, gw: Gateway, defaults: dict, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        peer = self.writer.get_extra_info("peername")
        caller.CLIENT.set(f"address:{peer[0] if peer else '?'}")    # this connection's task and its speech
        self.gw, self.defaults = gw, defaults
        self.streaming: SynthesizeStart | None = None
        self.text = SentenceBuffer()                 # a streamed synthesize's text as it comes
        self.speech: asyncio.Task | None = None      # the last of the queued speech, awaiting the ones before
        self.queued = 0                               # steps queued and not done: at most MAX_QUEUED + 2

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):                    # answered in turn, after what is queued
            self.then(self.describe)
        elif Synthesize.is_type(event.type):
            if self.streaming is None:              # sent beside a stream for old servers: ignored then
                await self.barge_in()
                s = Synthesize.from_event(event)
                self.then(partial(self.speak, s.text, s.voice))
        elif SynthesizeStart.is_type(event.type):
            await self.barge_in()
            self.streaming, self.text = SynthesizeStart.from_event(event), SentenceBuffer()
        elif SynthesizeChunk.is_type(event.type) and self.streaming is not None:
            await self.queue_sentences(self.text.write(SynthesizeChunk.from_event(event).text))
        elif SynthesizeStop.is_type(event.type) and self.streaming is not None:
            await self.queue_sentences(self.text.flush())
            self.streaming = None
            self.then(partial(self.write_event, SynthesizeStopped().event()))
        return True

    async def queue_sentences(self, sentences: list[str]) -> None:
        """A streamed synthesize's sentences, each spoken in turn; past MAX_QUEUED waiting, an
        error event says the rest were dropped (what one connection may hold is bounded)."""
        for i, sentence in enumerate(sentences):
            if self.queued >= MAX_QUEUED:
                log.warning("wyoming: %d sentences wait to be spoken: %d more dropped", self.queued, len(sentences) - i)
                await self.write_event(Error(text=f"{self.queued} sentences wait to be spoken, the most one "
                                             "connection may hold: send more text as the audio plays (the "
                                             "text past them was dropped)", code="queue_full").event())
                return
            self.then(partial(self.speak, sentence, self.streaming.voice))

    def then(self, step: Callable[[], Awaitable[None]]) -> None:
        """Queue a step of speech after the ones queued before it."""
        async def after(before: asyncio.Task | None) -> None:
            if before is not None:
                await before                         # cancelling this task cancels that one too
            await step()

        def done(_: asyncio.Task) -> None:           # run, failed or cancelled, started or not
            self.queued -= 1

        self.queued += 1
        self.speech = asyncio.create_task(after(self.speech))
        self.speech.add_done_callback(done)

    async def describe(self) -> None:
        await self.write_event((await describe(self.gw)).event())

    async def barge_in(self) -> None:
        """A new text: stop whatever is being said."""
        await self.stop_speech("barge-in")

    async def disconnect(self) -> None:
        """The client closed the connection: stop speaking to no one."""
        await self.stop_speech("the client left")

    async def stop_speech(self, why: str) -> None:
        """Cancel the speech under way (its Triton streams are cancelled; the server stops)."""
        if self.speech is not None and not self.speech.done():
            log.info("%s: the speech under way is stopped", why)
            self.speech.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.speech
        self.speech = None

    async def speak(self, text: str, voice) -> None:
        """One text -> audio-start, audio-chunk..., audio-stop; an `error` event if it fails."""
        values = {"TEXT": text, **self.defaults} | ({"SSML": True} if is_ssml(text) else {})
        name = voice.name if voice is not None and voice.name else None
        if name is not None:
            values["SPEAKER" if len(name) > 32 else "VOICE"] = name     # a speaker string, or a voice
        started = False
        try:
            async with contextlib.aclosing(self.gw.chunks(values)) as chunks:
                async for chunk in chunks:
                    if not started:
                        await self.write_event(AudioStart(rate=RATE, width=WIDTH, channels=CHANNELS).event())
                        started = True
                    await self.write_event(AudioChunk(rate=RATE, width=WIDTH, channels=CHANNELS,
                                                      audio=pcm16(chunk.audio)).event())
                    chunk.read()
        except ApiError as e:
            log.warning("synthesize failed (%s): %s", e.status, e.message)
            await self.write_event(Error(text=e.message, code=e.code or f"http_{e.status}").event())
            if started:
                await self.write_event(AudioStop().event())
            return
        except asyncio.CancelledError:               # barge-in: close the audio it began
            if started:
                with contextlib.suppress(Exception):
                    await self.write_event(AudioStop().event())
            raise
        if not started:                             # nothing to say (e.g. only punctuation)
            await self.write_event(AudioStart(rate=RATE, width=WIDTH, channels=CHANNELS).event())
        await self.write_event(AudioStop().event())


async def serve(uri: str, triton: str, defaults: dict) -> None:
    s = Settings.from_env()
    gw = Gateway(triton, health=s.gateway_health_url, run_dir=s.run_dir, key=s.triton_key)
    server = AsyncServer.from_uri(uri)
    log.info("Wyoming on %s, Triton at %s", uri, triton)
    try:
        await server.run(partial(SpeechHandler, gw, defaults))
    finally:
        await gw.close()


def main(argv: list[str] | None = None) -> None:
    """velocity-tts-wyoming: the Wyoming protocol (Home Assistant) in front of the Triton server."""
    ap = argparse.ArgumentParser(prog="velocity-tts-wyoming", description=main.__doc__)
    ap.add_argument("--uri", default="tcp://0.0.0.0:10200", help="where to listen: tcp://HOST:PORT or unix://PATH")
    ap.add_argument("--triton", default="localhost:8001", help="the Triton server's gRPC address")
    ap.add_argument("--seed", type=int, help="a fixed sampling seed: the same text gives the same audio")
    ap.add_argument("--temperature", type=float, help="sampling temperature (default: the server's)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[wyoming] %(levelname)s %(message)s")
    defaults = {k: v for k, v in (("SEED", args.seed), ("TEMPERATURE", args.temperature)) if v is not None}
    try:
        asyncio.run(serve(args.uri, args.triton, defaults))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
