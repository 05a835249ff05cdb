"""An SSML subset: a text that starts with `<speak>` read into blocks of text, each spoken at one
speed in one voice after a silence. Parsed by defusedxml's SAX parser (no DTD, no entities, no
external references), at most MAX_DEPTH elements deep; an element or attribute outside the subset
and malformed XML are ValueErrors naming it and its line and column. Nothing is read aloud as
markup.

    <speak>                       the root (xml:lang, version, xmlns taken and ignored)
    <p>, <s>                      a paragraph, a sentence: each its own sentence(s)
    <break time="500ms"/>         silence: up to SHORT_BREAK_MS a [uv_break] token in the text, longer
    <break strength="strong"/>    exact silence between sentences (the text is cut there); at most 10 s
    <prosody rate="slow|80%">     [speed_N] for its sentences (x-slow 1 ... x-fast 9; p% as the
                                  OpenAI speed p/100: N = round(5 + 2 log2(p/100)))
    <sub alias="...">             the alias is spoken; its text is what the word timing names
    <say-as interpret-as="characters|cardinal|ordinal|date|telephone">  read as such
    <voice name="basil">          another named voice for its sentences
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAX_DEPTH = 32
MAX_BREAK_MS = 10_000
SHORT_BREAK_MS = 250                 # a break this short or shorter is ChatTTS's [uv_break]
STRENGTHS = {"none": 0, "x-weak": 100, "weak": 200, "medium": 400, "strong": 700, "x-strong": 1200}
RATES = {"x-slow": 1, "slow": 3, "medium": 5, "default": 5, "fast": 7, "x-fast": 9}
SAY_AS = ("characters", "spell-out", "cardinal", "number", "ordinal", "date", "telephone")
ALLOWED = {"speak": {"xml:lang", "version", "xmlns", "xmlns:xsi", "xsi:schemaLocation"}, "p": set(), "s": set(),
           "break": {"time", "strength"}, "prosody": {"rate"}, "sub": {"alias"},
           "say-as": {"interpret-as", "format"}, "voice": {"name"}}


def is_ssml(text: str) -> bool:
    """Whether a text is SSML: it starts with <speak (after blanks)."""
    return text.lstrip().startswith("<speak")


@dataclass
class Block:
    """Text spoken at one speed in one voice: what is said (aliases and readings in place), the
    words as written (each with the reading the markup gave it, or None), after `pause` ms."""
    said: str = ""
    words: list[tuple[str, str | None]] = field(default_factory=list)
    speed: int | None = None
    voice: str | None = None
    pause: int = 0


@dataclass
class Document:
    """An SSML text's blocks, in order, and the silence after the last (ms)."""
    blocks: list[Block]
    tail: int = 0

    @property
    def text(self) -> str:
        """The written text (the words of its text nodes)."""
        return " ".join(w for b in self.blocks for w, _ in b.words)


def parse(text: str, lang: str = "en") -> Document:
    """An SSML text -> its Document; ValueError naming what is wrong and where. lang: the
    language numbers are read in by <say-as>."""
    import xml.sax

    from defusedxml import DefusedXmlException
    from defusedxml.sax import parseString

    reader = _Reader(lang)
    try:
        parseString(text.encode("utf-8"), reader, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except xml.sax.SAXParseException as e:
        raise ValueError(f"SSML is not well-formed XML at line {e.getLineNumber()}, column {e.getColumnNumber() + 1}: "
                         f"{e.getMessage()}") from None
    except DefusedXmlException as e:
        raise ValueError(f"SSML may not declare a DTD, entities or external references ({type(e).__name__})") from None
    return reader.document()


class _Reader:
    """The SAX handler: a stack of the open elements' speed and voice, the block being written."""

    def __init__(self, lang: str) -> None:
        self.lang, self.locator = lang, None
        self.stack: list[tuple[str, int | None, str | None]] = []     # (element, speed, voice)
        self.blocks: list[Block] = [Block()]
        self.pause = 0                         # ms of silence before the next block
        self.inner: list[str] | None = None    # the text of a <sub> or <say-as> being read
        self.markup: tuple[str, dict] | None = None
        self.joined = False                    # the last text written ends inside a word

    # -- SAX's ContentHandler (the methods it calls)
    def setDocumentLocator(self, locator) -> None:
        self.locator = locator

    def startDocument(self) -> None:
        pass

    def endDocument(self) -> None:
        pass

    def startPrefixMapping(self, prefix, uri) -> None:
        pass

    def endPrefixMapping(self, prefix) -> None:
        pass

    def processingInstruction(self, target, data) -> None:
        pass

    def ignorableWhitespace(self, whitespace) -> None:
        pass

    def skippedEntity(self, name) -> None:
        raise self.error(f"the entity &{name}; is not allowed")

    def startElement(self, name: str, attrs) -> None:
        a = dict(attrs.items())
        if name not in ALLOWED:
            raise self.error(f"<{name}> is not supported (SSML here: {', '.join(f'<{n}>' for n in ALLOWED)})")
        if not self.stack and name != "speak":
            raise self.error(f"SSML must start with <speak>, not <{name}>")
        if self.stack and name == "speak":
            raise self.error("<speak> inside <speak>")
        if bad := sorted(set(a) - ALLOWED[name]):
            raise self.error(f"<{name}> has no attribute {bad[0]!r} here (it takes: {', '.join(sorted(ALLOWED[name])) or 'none'})")
        if len(self.stack) >= MAX_DEPTH:
            raise self.error(f"elements nest deeper than {MAX_DEPTH}")
        if self.inner is not None:
            raise self.error(f"<{name}> inside <{self.markup[0]}>: it holds text only")
        speed, voice = (self.stack[-1][1], self.stack[-1][2]) if self.stack else (None, None)
        if name == "break":
            self.add_break(a)
        elif name == "prosody":
            speed = self.rate(a.get("rate", "medium"))
        elif name == "voice":
            voice = a.get("name", "").strip() or None
            if voice is None:
                raise self.error('<voice> needs a name, such as <voice name="basil">')
        elif name in ("sub", "say-as"):
            self.check_markup(name, a)
            self.inner, self.markup = [], (name, a)
        self.stack.append((name, speed, voice))
        if name in ("p", "s", "voice", "prosody"):
            self.cut()

    def endElement(self, name: str) -> None:
        self.stack.pop()
        if name in ("sub", "say-as"):
            written, (kind, a) = " ".join("".join(self.inner).split()), self.markup
            self.inner = self.markup = None
            said = a["alias"] if kind == "sub" else read_as(a["interpret-as"], written, self.lang)
            self.write(written, said)
        elif name in ("p", "s", "voice", "prosody"):
            self.cut()

    def characters(self, content: str) -> None:
        if self.inner is not None:
            self.inner.append(content)
        elif self.stack:
            self.write(content, None)

    # -- the blocks
    def write(self, written: str, said: str | None) -> None:
        """Text into the current block (with `said`: one reading for all of it)."""
        if not written.strip() and said is None:
            self.current().said += written
            return
        self.open_block()
        b = self.current()
        b.said += said if said is not None else written
        words = written.split()
        if words and b.words and self.joined and not written[0].isspace() and said is None:
            w, r = b.words.pop()                             # "<sub ...>WWW</sub>," is one word, "WWW,"
            first = words.pop(0)
            b.words.append((w + first, None if r is None else r + first))
        b.words += [(w, said if k == 0 else "") if said is not None else (w, None) for k, w in enumerate(words)]
        if said is not None and not words:                   # <sub alias="x"></sub>: said, no word written
            b.words.append(("", said))
        self.joined = not written[-1].isspace()

    def current(self) -> Block:
        return self.blocks[-1]

    def open_block(self) -> None:
        """The current block takes the stack's speed and voice; a block with other ones starts."""
        _, speed, voice = self.stack[-1]
        b = self.current()
        if b.words and (b.speed, b.voice) != (speed, voice):
            self.cut()
            b = self.current()
        if not b.words:
            b.speed, b.voice = speed, voice
            b.pause, self.pause = b.pause + self.pause, 0

    def cut(self) -> None:
        """End the current block (a sentence boundary); the next text starts another."""
        if self.current().words:
            self.blocks.append(Block())

    def add_break(self, a: dict) -> None:
        ms, self.joined = self.duration(a), False          # a break parts words
        if ms == 0:
            return
        if ms <= SHORT_BREAK_MS and self.current().words:
            self.current().said += " [uv_break] "
            return
        self.cut()
        self.pause += ms

    def duration(self, a: dict) -> int:
        if "time" in a:
            m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*", a["time"])
            if m is None:
                raise self.error(f'<break time="{a["time"]}"> must be a duration such as 500ms or 1.5s')
            ms = round(float(m[1]) * (1000 if m[2] == "s" else 1))
            if ms > MAX_BREAK_MS:
                raise self.error(f'<break time="{a["time"]}"> is over {MAX_BREAK_MS // 1000} s')
            return ms
        strength = a.get("strength", "medium")
        if strength not in STRENGTHS:
            raise self.error(f'<break strength="{strength}"> must be one of {", ".join(STRENGTHS)}')
        return STRENGTHS[strength]

    def rate(self, rate: str) -> int:
        if rate in RATES:
            return RATES[rate]
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)%\s*", rate)
        if m is None or float(m[1]) <= 0:
            raise self.error(f'<prosody rate="{rate}"> must be one of {", ".join(RATES)} or a percentage such as 80%')
        return min(9, max(0, round(5 + 2 * math.log2(float(m[1]) / 100))))

    def check_markup(self, name: str, a: dict) -> None:
        if name == "sub" and not a.get("alias", "").strip():
            raise self.error('<sub> needs an alias, such as <sub alias="World Wide Web">WWW</sub>')
        if name == "say-as" and a.get("interpret-as") not in SAY_AS:
            raise self.error(f'<say-as interpret-as="{a.get("interpret-as", "")}"> must be one of {", ".join(SAY_AS)}')

    def error(self, message: str) -> ValueError:
        where = "" if self.locator is None else \
            f" at line {self.locator.getLineNumber()}, column {self.locator.getColumnNumber() + 1}"
        return ValueError(f"SSML{where}: {message}")

    def document(self) -> Document:
        blocks = [b for b in self.blocks if b.words]
        if not blocks:
            raise ValueError("SSML has no text to speak")
        return Document(blocks, self.pause)


def read_as(kind: str, text: str, lang: str) -> str:
    """<say-as>'s reading of its text, for the normaliser to read on."""
    if kind in ("characters", "spell-out"):
        return " ".join(c for c in text if not c.isspace())
    if kind == "telephone":
        groups = re.findall(r"\d+", text)
        return "; ".join(" ".join(g) for g in groups) if groups else text
    if kind in ("cardinal", "number", "ordinal"):
        digits = re.sub(r"[,\s]", "", text)
        if not re.fullmatch(r"-?\d+", digits):
            raise ValueError(f'SSML: <say-as interpret-as="{kind}"> must hold a whole number, got {text!r}')
        n = int(digits)
        if lang == "zh":
            import cn2an
            said = cn2an.an2cn(str(n))
            return "第" + said if kind == "ordinal" else said
        from num2words import num2words
        return num2words(n, to="ordinal" if kind == "ordinal" else "cardinal").replace("-", " ").replace(",", "")
    return text                                   # a date: the normaliser reads year-month-day dates and the like
