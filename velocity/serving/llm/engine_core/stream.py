"""One request of the llm in the engine core (CoreStream): its sentences spoken in order with one
speaker as engine requests, their frames cut into chunks that go to the stub as they are ready,
paused while too much of its audio waits for the vocoder. The stub's side of the same request
(its sender, client, deadline, board slot) is velocity.serving.llm.stream.Stream.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from velocity.serving.wire.client_tag import verify
from velocity.serving.llm.llm_inputs import LLMInputs
from velocity.serving.wire.protocol import STREAM_FAILED, packed
from velocity.tts.chunking import FrameChunker
from velocity.tts.sentence_stream import Carry, Refine, SentenceStream

if TYPE_CHECKING:
    from velocity.serving.llm.engine_core.core import EngineCore

log = logging.getLogger("velocity.llm")


class CoreStream:
    """One request in the core: started by the stub's `start`, over once ended or stopped."""

    def __init__(self, core: "EngineCore", key: int, ref: int, inputs: LLMInputs, speaker,
                 refine: Refine | None, carry: Carry | None, speakers: list | None = None) -> None:
        s = core.settings
        self.core, self.key, self.ref = core, key, ref
        self.speaker, self.params, self.hidden = speaker, inputs.params, inputs.hidden
        self.client = verify(inputs.client, core.client_key)   # the fair share's client ("": unsigned, direct)
        self.sentences = SentenceStream(inputs.sentences, FrameChunker(core.schedule, s.left_context, s.lookahead),
                                        core.end_code, refine, ahead=s.sentences_ahead, texts=inputs.texts,
                                        carry=carry, words=inputs.words, pauses=inputs.pauses, speakers=speakers)
        self.running: dict[int, str] = {}        # sentence -> its engine request in flight
        self.paused: set[str] = set()            # engine requests paused for the vocoder
        self.sent_frames = 0                     # frames of audio in the chunks sent
        self.done_frames = 0                     # of those, decoded (and read by a client that fell behind)
        self.over = False                        # ended or stopped: nothing more goes out

    def start_requests(self) -> None:
        """Start the sentences' engine requests that may run now (the current one and those ahead)."""
        for i, prompt, params, kwargs in self.sentences.requests(self.params, self.speaker, self.hidden):
            rid = self.running[i] = f"{self.key}-{i}{'r' if kwargs['head'] == 'text' else ''}"
            self.core.add(rid, self, i, prompt, params, kwargs)

    def abort_all(self) -> None:
        for rid in self.running.values():
            self.core.abort(rid)
        self.running.clear()
        self.paused.clear()

    def finish(self, event: tuple) -> None:
        """Over: its requests aborted, `event` to the stub."""
        self.over = True
        self.abort_all()
        self.core.finished(self, event)

    def pace(self, bound: int) -> None:
        """Pause or resume its audio requests by the frames waiting for the vocoder: the sentence
        being spoken by those it sent and the vocoder has not decoded yet, a sentence ahead by
        those and every frame generated but not yet sent."""
        behind = self.sent_frames - self.done_frames
        unsent = None
        for i, rid in self.running.items():
            if rid[-1] == "r":                   # text refine: no audio
                continue
            if i == self.sentences.sentence:
                want = behind >= bound
            else:
                if unsent is None:               # with the frames its engine requests hold (_hold)
                    unsent = self.sentences.unsent_frames() + sum(
                        self.core.engine.unreported(r) for j, r in self.running.items()
                        if j != self.sentences.sentence and r[-1] != "r")
                want = behind + unsent >= bound
            if want != (rid in self.paused):
                self.core.engine.pause(rid, want)
                (self.paused.add if want else self.paused.discard)(rid)

    def _hold(self, i: int) -> None:
        """Sentence i's next output once it matters (SentenceStream.quiet): this stream's Python
        runs on the steps that cut a chunk or end a request, not on every step."""
        if (rid := self.running.get(i)) is not None:
            self.core.engine.hold(rid, self.sentences.quiet(i))

    def voiced(self, sample: list) -> None:
        """Voice carry-over's sample of the first sentence is made (on the core's voicing thread)."""
        if not self.over:
            self.sentences.voiced(sample)
            self.start_requests()

    def on_output(self, i: int, out) -> None:
        """Sentence i's engine output (velocity.engine.llm_engine.RequestOutput)."""
        try:
            if out.finished:
                self.paused.discard(self.running.pop(i, None))
            sentences = self.sentences
            spoken = sentences.sentence
            chunks = sentences.feed(i, out)
            if (j := sentences.sentence) != spoken and (rid := self.running.get(j)) is not None \
                    and (held := self.core.engine.flush(rid)) is not None:
                chunks += sentences.feed(j, held)     # the sentence now spoken: its frames held so far
                self._hold(j)
            if sentences.carry is not None and (first := sentences.voicing()) is not None:
                self.core.voice(self, first)     # its audio decoded off the loop
            for c in chunks:
                self.core.emit(("chunk", self.key, packed(c)))     # the stub builds its tensors
                self.sent_frames += c.length
            if not out.finished:
                self._hold(i)
                if chunks:
                    self.start_requests()        # the sentences ahead start after the first chunk
                    if self.ref and self.core.backlog:
                        self.pace(self.core.backlog)
                return
            if out.error:
                log.error("request %s failed: %s", out.request_id, out.error)
                self.finish(("end", self.key, STREAM_FAILED))
            elif out.finish_reason == "abort" or self.sentences.done:
                # the stub ends a stream of the ensemble once the vocoder has decoded all of it
                self.finish(("generated", self.key) if self.ref and out.finish_reason != "abort"
                            else ("end", self.key, None))
            else:
                self.start_requests()
        except Exception:                        # never leave a client hanging
            log.exception("stream %s failed", self.key)
            self.finish(("end", self.key, STREAM_FAILED))
