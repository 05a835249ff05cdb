"""One request's sentences as one stream of chunks (`SentenceStream`), with text refine first
where asked (`Refine`), or the first sentence's voice carried over to all (`Carry`): the order
of engine requests and of their frames, shared by the llm model and the in-process pipeline."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from velocity.tts.chunking import SAMPLES_PER_FRAME, CodeChunk, FrameChunker
from velocity.tts.word_timing import SentenceWords, WordClock


HELD = 1 << 30        # SentenceStream.quiet: no output needed before the request ends


@dataclass
class Refine:
    """Text refine before each sentence's audio, as the reference's first pass: the text head
    continues `prompts[i]` with `params`; `audio_prompt(generated ids)` -> (the refined text, the
    sentence's audio prompt)."""
    prompts: list[list[int]]
    params: object                              # SamplingParams
    audio_prompt: Callable[[list[int]], tuple[str, list]]


@dataclass
class Carry:
    """Voice carry-over (velocity.tts.carry_over): the first sentence is generated on its own first;
    `sample(its frames, its hidden rows or None)` -> the voice sample's frames, which follow each of
    `prompts` (every sentence's audio prompt with the first one's text as the sample's transcript)."""
    prompts: list[list[int]]
    sample: Callable[[list, list | None], list]


class SentenceStream:
    """One request's sentences, spoken in order as one stream of chunks: each sentence is one
    engine request (`prompt`, on `head`), its end frame is dropped, and it is its own utterance
    (its last chunk marked). With `refine`, a text-head request comes first and its refined text
    becomes the sentence's audio prompt. With `carry` (and no refine), the first sentence is
    generated once without chunks; its frames wait in `voicing()` for the caller to make their
    voice sample (carry.sample, off the engine's thread if it likes), which `voiced()` puts into
    every sentence's prompt.
    Serves the llm model and the in-process pipeline alike.

    Once the stream's first chunk is out (so the first audio is not slowed by a larger batch),
    up to `ahead` sentences after the one being spoken generate at the same time, batched with
    it; their frames are held until it ends, so the chunks still go out in order and the next
    sentence's first chunk is ready the moment the current one's last is.

        for i, prompt, sampling, kwargs in stream.requests(params, speaker, hidden): start them
        chunks = stream.feed(i, output)   # each engine output of sentence i's request
        after chunks or a finished request, until stream.done: start stream.requests(...) again
    """

    def __init__(self, sentences: list[list], chunker: FrameChunker, end_code: int,
                 refine: Refine | None = None, ahead: int = 0, texts: list[str] | None = None,
                 carry: Carry | None = None, words: list[SentenceWords] | None = None,
                 pauses: list[int] | None = None, speakers: list | None = None) -> None:
        assert carry is None or refine is None, "carry-over with text refine"
        self.sentences, self.chunker, self.end_code, self.refine = list(sentences), chunker, end_code, refine
        self.carry, self.carried = carry, ([], [])   # the first sentence's frames and hidden rows
        self.ahead = ahead
        self.sentence = 0                           # the one being spoken: its chunks go out now
        n = len(self.sentences)
        self.phase = ["refine" if refine is not None else "audio"] * n    # then "done"
        if carry is not None and n:
            self.phase[0] = "carry"                                       # then "audio"
        self.started = [False] * n                  # the current phase's request has started
        self.generated: list[list[int]] = [[] for _ in range(n)]        # a refine's text ids so far
        self.texts = [""] * n                       # refined texts, until the sentence's first chunk takes it
        self.spoken = list(texts or [""] * n)       # each sentence's text (refined: the refined one), for marks
        self.held: list[list[tuple]] = [[] for _ in range(n)]          # (frames, hidden, ended) of one ahead
        self.held_frames = 0                        # frames in `held`, all sentences
        self.words = words                          # each sentence's words, to time in its audio (None: none)
        self.clock: WordClock | None = None         # the current sentence's, from its first chunk
        self.pauses = pauses                        # samples of silence before each sentence, then after the last
        self.speakers = speakers                    # each sentence's speaker (SSML's <voice>), or None: one for all
        self.begun = -1                             # the last sentence whose first chunk went out (_marked)
        self.silence = 0                            # samples of silence in the chunks so far

    def requests(self, params, speaker, hidden: bool) -> list[tuple[int, list, object, dict]]:
        """The engine requests to start now, given the audio's sampling, speaker and whether it
        wants hidden states: [(sentence, prompt, sampling, add_request's head, speaker and
        return_hidden)]. A refine runs on the text head, without the speaker or hidden states."""
        out = []
        ahead = self.ahead if self.chunker.index > 0 else 0
        for i in range(self.sentence, min(len(self.sentences), self.sentence + 1 + ahead)):
            if self.started[i] or self.phase[i] == "done":
                continue
            self.started[i] = True
            if self.phase[i] == "refine":
                out.append((i, self.refine.prompts[i], self.refine.params,
                            {"head": "text", "speaker": None, "return_hidden": False}))
            else:
                spk = speaker if self.speakers is None else self.speakers[i]
                out.append((i, self.sentences[i], params, {"head": "audio", "speaker": spk, "return_hidden": hidden}))
        return out

    @property
    def done(self) -> bool:
        return self.sentence >= len(self.sentences)

    def quiet(self, i: int) -> int:
        """Frames sentence i's request may generate before its output is needed: the sentence
        spoken, those its next chunk waits for; a refine, a carry-over's first pass or a sentence
        ahead, all until its end (HELD; the caller flushes a sentence ahead once it is spoken)."""
        if i == self.sentence and self.phase[i] == "audio":
            return self.chunker.wanted()
        return HELD

    def unsent_frames(self) -> int:
        """Frames generated but not yet in a chunk: the current sentence's not yet cut, and those
        held for the sentences ahead."""
        return len(self.chunker.frames) - self.chunker.emitted + self.held_frames

    def feed(self, i: int, out) -> list[CodeChunk]:
        """Sentence i's engine output (velocity.engine.llm_engine.RequestOutput) -> the chunks now
        ready. A sentence that ends ("stop" or "length") lets the next one speak; a refine that
        ends readies the sentence's audio request."""
        if not out.finished and i == self.sentence and self.phase[i] == "audio":
            new = out.new_token_ids
            if len(new) == 1 and self.end_code not in new[0]:     # a frame of the sentence spoken (most)
                mine = self.chunker.push(new, out.new_hidden)
                return self._marked(mine, len(self.chunker.frames)) if mine else mine
        ended = out.finished and out.finish_reason in ("stop", "length")
        if self.phase[i] == "refine":
            self.generated[i] += out.new_token_ids
            if ended:
                self.texts[i], self.sentences[i] = self.refine.audio_prompt(self.generated[i])
                self.spoken[i] = self.texts[i]              # what the audio speaks is the refined text
                self.phase[i], self.started[i], self.generated[i] = "audio", False, []
            return []
        new = out.new_token_ids
        if len(new) == 1 and self.end_code not in new[0]:      # a step's one frame (the usual case)
            frames, hidden = new, out.new_hidden
        else:                                                  # the end frame is dropped, its hidden row too
            keep = [k for k, f in enumerate(new) if self.end_code not in f]
            frames = [new[k] for k in keep]
            hidden = None if out.new_hidden is None else out.new_hidden[keep]
        if self.phase[i] == "carry":
            self.carried[0].extend(frames)
            if hidden is not None:
                self.carried[1].extend(hidden)
            if ended:
                self.phase[i] = "voicing"                 # until voiced(): its request stays started
            return []
        if ended:
            self.phase[i] = "done"
        if i != self.sentence:
            self.held[i].append((frames, hidden, ended))
            self.held_frames += len(frames)
            return []
        return self._speak([(frames, hidden, ended)])

    def voicing(self) -> tuple[list, list | None] | None:
        """Once the carry-over's first pass has ended: its frames and hidden rows (None: none), for
        carry.sample; then None."""
        if not self.phase or self.phase[0] != "voicing" or self.carried is None:
            return None
        frames, hidden = self.carried
        self.carried = None
        return frames, hidden or None

    def voiced(self, sample: list) -> None:
        """The carried voice sample's frames: they follow every sentence's prompt, and the first
        sentence's audio request may start."""
        self.sentences = [p + sample for p in self.carry.prompts]
        self.phase[0], self.started[0] = "audio", False

    def _marked(self, mine: list[CodeChunk], known: int) -> list[CodeChunk]:
        """The current sentence's new chunks, its first one carrying the refined text (text refine)
        and the text it speaks (for marks), each the words estimated to start in it (with `words`;
        known: the sentence's frames generated so far)."""
        i = self.sentence
        first, self.begun = self.begun != i, i      # mine[0] is the sentence's first chunk
        if self.pauses is not None:
            self._silence(mine, first)
        if self.words is not None and i < len(self.words):
            self._time(mine, known, first)
        if self.texts[i]:
            mine[0].text, self.texts[i] = self.texts[i], ""
        if self.spoken[i]:
            mine[0].sentence_text, self.spoken[i] = self.spoken[i], ""
        return mine

    def _silence(self, mine: list[CodeChunk], first: bool) -> None:
        """Each chunk's silence (SSML's breaks): before the sentence's first, after the stream's last."""
        if first:
            mine[0].pause = self.pauses[self.sentence]
        for c in mine:
            c.paused = self.silence
            if c.last and self.sentence == len(self.sentences) - 1:
                c.tail = self.pauses[-1]
            self.silence += c.pause + c.tail

    def _time(self, mine: list[CodeChunk], known: int, first: bool) -> None:
        """Each chunk's words (velocity.tts.word_timing), in samples of the stream's audio."""
        n = SAMPLES_PER_FRAME
        if first:                                    # where the sentence's speech begins
            plan = self.words[self.sentence]
            spoken = self.spoken[self.sentence] or " ".join(r for _, r in plan.words)
            self.clock = WordClock(plan, spoken, mine[0].sample_offset(n) + mine[0].paused + mine[0].pause)
        for c in mine:
            start = c.sample_offset(n) + c.paused + c.pause - self.clock.offset
            upto = start + c.length * n - (n // 2 if c.last else 0)
            c.words = self.clock.place(start, upto, known * n - n // 2, c.last)

    def _speak(self, outputs: list[tuple]) -> list[CodeChunk]:
        """The current sentence's outputs into the chunker; at its end, the next one's held ones."""
        chunks: list[CodeChunk] = []
        while outputs:
            frames, hidden, ended = outputs.pop(0)
            mine = self.chunker.push(frames, hidden)
            known = len(self.chunker.frames)
            mine += self.chunker.finish() if ended else []
            chunks += self._marked(mine, known) if mine else mine
            if ended:
                self.sentence += 1
                if not self.done:
                    outputs, self.held[self.sentence] = self.held[self.sentence], []
                    self.held_frames -= sum(len(f) for f, _, _ in outputs)
        return chunks
