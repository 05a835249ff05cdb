"""Text front end: normalise, split into sentences, build the prompt, tokenize with the release's tokenizer."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from velocity.tts.homophones import Homophones
from velocity.tts.lexicon import Lexicon
from velocity.tts.normalizer import CJK, CONTROL, Normalized, Normalizer, detect_language, split_sentences, split_text
from velocity.tts.tokenizer import BertTokenizer
from velocity.tts.speaker import STATS_FILE, load_speaker_stats, speaker_dim
from velocity.tts.sentence_stream import Refine
from velocity.tts.ssml import Block
from velocity.tts.ssml import parse as ssml_parse
from velocity.tts.word_timing import SentenceWords, client_words, sentence_words, speaking_rate

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "[speed_5]"
LETTERS = re.compile(r"[A-Za-z\u4e00-\u9fff]")


def with_speed(prompt: str, speed: int | None) -> str:
    """The prompt with [speed_N] for SSML's <prosody rate> (None: as it is)."""
    return prompt if speed is None else re.sub(r"\[speed_\d\]", "", prompt) + f"[speed_{speed}]"


@dataclass
class Sentence:
    text: str                 # normalised
    token_ids: list[int]      # the whole prompt: [Stts][spk_emb|empty_spk]{sample text}{prompt}{text}[Ptts]
    words: SentenceWords | None = None    # the client's words it speaks, each with its reading
    voice: str | None = None  # SSML's <voice>: another named voice for it
    speed: int | None = None  # SSML's <prosody rate>: its [speed_N]
    pause: int = 0            # SSML: ms of silence before it (`after`: after it, on the last)
    after: int = 0


class TextFrontend:
    """Loads asset/tokenizer of a ChatTTS release folder (a BERT tokenizer, no automatic specials)
    and the server's pronunciation lexicon (`lexicon`: a file; default <folder>/lexicon.json if there)."""

    def __init__(self, folder: str | Path, lexicon: str = "") -> None:
        self.tokenizer = BertTokenizer(Path(folder) / "asset" / "tokenizer")
        self.speaker_dim = speaker_dim(folder)
        self.speaker_stats = load_speaker_stats(folder, self.speaker_dim)   # for random speakers
        if self.speaker_stats is None:
            logger.warning("%s has no %s: random speakers (SPEAKER_SEED) come from a plain normal, not the "
                           "release's speaker statistics (scripts/download_weights.py fetches it)", folder, STATS_FILE)
        vocab = self.tokenizer.get_vocab()
        self.normalizer = Normalizer(replace=Homophones(vocab))
        self.break_0, self.ptts = vocab.get("[break_0]"), vocab.get("[Ptts]")
        self.lexicon = Lexicon.for_weights(folder, lexicon)
        if self.lexicon:
            logger.info("pronunciation lexicon: %d entries", len(self.lexicon))

    def normalize(self, text: str, lang: str | None = None) -> Normalized:
        return self.normalizer.normalize(text, lang)

    def check_prompt(self, prompt: str) -> None:
        if CONTROL.sub("", prompt).strip():
            raise ValueError(f"PROMPT must hold only control tokens such as [speed_5] or [oral_2], got {prompt!r}")

    # -- text refine (the reference's first pass: the GPT's text head adds [uv_break], [laugh], ...)
    def refine_prompt(self, text: str, prompt: str = "") -> list[int]:
        """A normalised piece -> the text head's prompt, [Sbreak]{text}[Pbreak]{prompt}."""
        self.check_prompt(prompt)
        return self.tokenizer.encode(f"[Sbreak]{text}[Pbreak]{prompt}")

    def refined_text(self, ids: list[int]) -> str:
        """The text head's ids -> the refined text: those below [break_0], decoded as the reference does."""
        return self.tokenizer.decode([i for i in ids if self.break_0 is None or i < self.break_0])

    @staticmethod
    def prefix_text(speaker: bool, prompt: str, sample_text: str) -> str:
        """The audio prompt's template before the text: [Stts][spk_emb|empty_spk]{sample text}{prompt}."""
        return f"[Stts]{'[spk_emb]' if speaker else '[empty_spk]'}{sample_text}{prompt}"

    def code_prefix(self, speaker: bool, prompt: str = DEFAULT_PROMPT, sample_text: str = "") -> list[int]:
        """The audio prompt's ids before the text (prefix_text)."""
        self.check_prompt(prompt)
        return self.tokenizer.encode(self.prefix_text(speaker, prompt, sample_text))

    def refined_prompt(self, prefix: list[int], refined: str) -> list[int]:
        """The audio prompt of a refined text: the prefix (code_prefix), the text as the reference
        takes it (template tokens removed, stripped, not normalised again), [Ptts]."""
        for t in ("[Stts]", "[spk_emb]", "[empty_spk]"):
            refined = refined.replace(t, "")
        return prefix + self.tokenizer.encode(refined.strip()) + [self.ptts]

    def refine_plan(self, prompts: list[list[int]], params, prefix: list[int], frames: list | None = None) -> Refine:
        """Text refine with these text-head prompts (refine_prompt), and how the generated ids become
        (the refined text, the audio prompt: prefix (code_prefix), refined text, [Ptts], a sample's frames)."""
        def audio_prompt(ids: list[int]) -> tuple[str, list]:
            text = self.refined_text(ids)
            return text, self.refined_prompt(prefix, text) + (frames or [])

        return Refine(prompts, params, audio_prompt)

    def code_prompt(self, text: str, speaker: bool, prompt: str = DEFAULT_PROMPT, sample_text: str = "") -> list[int]:
        """A normalised sentence's audio prompt: [Stts][spk_emb|empty_spk]{sample text}{prompt}{text}[Ptts]."""
        return self.tokenizer.encode(f"{self.prefix_text(speaker, prompt, sample_text)}{text}[Ptts]")

    def carried_prompts(self, sentences: list[Sentence], speaker: bool, prompt: str = DEFAULT_PROMPT) -> list[list[int]]:
        """Voice carry-over's prompts (velocity.tts.carry_over): every sentence's, with the first
        sentence's text as the voice sample's transcript (the reference's txt_smp)."""
        return [self.code_prompt(s.text, speaker, prompt, sentences[0].text) for s in sentences]

    def encode(self, text: str, speaker: bool, prompt: str = DEFAULT_PROMPT, sample_text: str = "",
               lexicon: Lexicon | None = None, max_chars: int | None = None,
               ssml: bool = False) -> tuple[list[Sentence], Normalized]:
        """Text -> one prompt per piece, in order, and the normalisation report. Pieces as the
        reference splits a text (split_text), each normalised on its own (its own language), and
        cut again if longer than 120 characters. sample_text: a voice sample's transcript, which
        goes into every prompt as the reference puts its txt_smp (as given, not normalised).
        lexicon: the request's pronunciations, merged over the server's; both apply before all else.
        max_chars: the text's limit, which it must keep with the lexicon applied (ValueError).
        ssml: the text is SSML (velocity.tts.ssml): its blocks in turn, each at its own speed and
        in its own voice (Sentence.voice), after its silence (Sentence.pause; the last's `after`)."""
        self.check_prompt(prompt)
        lexicon = self.lexicon.merged(lexicon)
        if ssml:
            doc = ssml_parse(text, detect_language(re.sub(r"<[^>]*>", " ", text)))
            blocks, tail = doc.blocks, doc.tail
        else:
            blocks, tail = [Block(text, [(w, None) for w in client_words(text)])], 0
        out, norms, used = [], [], 0
        for b in blocks:
            said = lexicon.apply(b.said, None if max_chars is None else max_chars - used)
            used += len(said)
            said_prompt, mine = with_speed(prompt, b.speed), []
            for piece in split_text(said):
                norms.append(norm := self.normalize(piece))
                for s in split_sentences(norm.text):
                    if not re.sub(CONTROL.pattern, "", s).strip(" ，。、,."):
                        continue                  # nothing left to speak
                    mine.append(Sentence(s, self.code_prompt(s, speaker or b.voice is not None, said_prompt, sample_text),
                                         voice=b.voice, speed=b.speed))
            if mine:
                mine[0].pause = b.pause
                lang = norms[-1].lang
                self.time_words(b.words, mine, lexicon, speaking_rate(said_prompt, lang), lang)
            out += mine
        if out:
            out[-1].after = tail
        report = Normalized(" ".join(n.text for n in norms), norms[0].lang if norms else "en",
                            sum(n.removed for n in norms), [t for n in norms for t in n.unknown_tokens])
        return out, report

    def time_words(self, words: list[tuple[str, str | None]], sentences: list[Sentence], lexicon: Lexicon,
                   rate: float, lang: str) -> None:
        """Each sentence's words as the client wrote them (velocity.tts.word_timing), each with its
        reading: the markup's (SSML), else the lexicon, then the normaliser, on the word alone (in
        the text's language when the word has no letters of its own)."""
        written = [w for w, _ in words]
        readings = [self.reading(w, lexicon, lang) if r is None else self.normalize(r, lang).text for w, r in words]
        for s, mine in zip(sentences, sentence_words(written, readings, [s.text for s in sentences])):
            s.words = SentenceWords([(written[i], readings[i]) for i in mine], rate)

    def reading(self, word: str, lexicon: Lexicon, lang: str) -> str:
        said = lexicon.apply(word)
        if len(said) <= 2 and CJK.match(said) and not said[1:].isalnum():
            return self.normalizer.replace(said[0]) + said[1:]       # a Chinese character (most of a Chinese text)
        return self.normalize(said, None if LETTERS.search(said) else lang).text
