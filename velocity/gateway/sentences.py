"""Text spoken a piece at a time: `SentenceBuffer` for text as it is written (Wyoming's streamed
synthesize and the WebSockets; the sentence rule is velocity.tts.text_pieces', which long texts
share), and the pipe that speaks pieces in order with several generating at once
(`SentencePipe`)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from velocity.gateway.upstream import ApiError
from velocity.tts.ssml import is_ssml
from velocity.tts.text_pieces import cut_at_word, split_complete

log = logging.getLogger("velocity.gateway")
_END = object()
MAX_PENDING_CHARS = 500        # streamed text with no sentence end past this is spoken, cut at a word
MAX_QUEUED = 64                # sentences one stream may hold waiting to be spoken (about a page)
MAX_SSML_CHARS = 2000          # an SSML document held whole (the server's default text limit)


class SentenceBuffer:
    """Text as it is written: write(text) -> the sentences it completes; flush() -> what is left,
    as a last sentence (none if blank), and the buffer is empty again. What is pending is bounded:
    past MAX_PENDING_CHARS with no sentence end, its head is a sentence, cut at a word, so that
    the text held (and what each write splits again) never grows with a client's text. With
    `ssml`, pending text that starts with <speak> is held whole until its </speak> (an SSML
    document is spoken as one piece), up to MAX_SSML_CHARS."""

    def __init__(self, limit: int = MAX_PENDING_CHARS, ssml: bool = True) -> None:
        self.pending, self.limit, self.ssml = "", limit, ssml

    def write(self, text: str) -> list[str]:
        if self.ssml and is_ssml(self.pending + text):
            return self._document(text)
        done, self.pending = split_complete(self.pending + text)
        while len(self.pending) > self.limit:
            head, self.pending = cut_at_word(self.pending, self.limit)
            if head:
                done.append(head)
        return done

    def _document(self, text: str) -> list[str]:
        """An SSML document once its </speak> came, then what follows it as text."""
        self.pending += text
        end = self.pending.find("</speak>")
        if end < 0:
            if len(self.pending) > MAX_SSML_CHARS:
                self.pending = ""
                raise ApiError(400, f"an SSML document must end (</speak>) within {MAX_SSML_CHARS} characters "
                                    "(the text past them was dropped)", "text")
            return []
        end += len("</speak>")
        document, rest = self.pending[:end].strip(), self.pending[end:]
        self.pending = ""
        return [document] + self.write(rest)

    def flush(self) -> list[str]:
        rest, self.pending = self.pending.strip(), ""
        return [rest] if rest else []


class QueueFull(ApiError):
    """A stream holds as many sentences waiting as it may (SentencePipe.max_queued): a 400 naming
    the text, said on a socket as an error message."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message, "text")


@dataclass
class Spoken:
    """One sentence in the pipe: its number, its text, and its chunks as they come (then _END or
    the exception that ended it)."""
    index: int
    text: str
    chunks: asyncio.Queue = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None
    placed: bool = False                 # holds one of the pipe's places (from its start to its end being read)


class SentencePipe:
    """Sentences spoken in order while up to `ahead` + 1 of them generate at once, each its own
    `tts` request (stream(text) -> its chunks). A sentence keeps its place until the reader has
    taken all of it, not just until it is generated: a reader that falls behind (a client that
    does not read) stops the generation `ahead` + 1 sentences on. add() starts a sentence (when a place is free);
    out() yields (sentence, chunk) in order, the sentence's chunks before the next one's, and
    (sentence, None) when one is complete; cancel() stops every sentence (their Triton streams
    are cancelled, so the server stops their work) and drops them."""

    def __init__(self, stream: Callable[[str], AsyncIterator], ahead: int = 2, max_queued: int = MAX_QUEUED) -> None:
        self.stream, self.places = stream, asyncio.Semaphore(ahead + 1)
        self.queue: deque[Spoken] = deque()
        self.count, self.max_queued = 0, max_queued
        self._added = asyncio.Event()

    def add(self, text: str) -> Spoken:
        """Start a sentence; QueueFull once max_queued wait unspoken (the text is not taken)."""
        if len(self.queue) >= self.max_queued:
            raise QueueFull(f"{len(self.queue)} sentences wait to be spoken, the most one stream may hold: "
                            "send more text as the audio plays (the text past them was dropped)")
        s = Spoken(self.count, text)
        self.count += 1
        s.task = asyncio.create_task(self._generate(s))
        self.queue.append(s)
        self._added.set()
        return s

    async def _generate(self, s: Spoken) -> None:
        await self.places.acquire()                 # released by the reader once it took the end (out)
        s.placed = True
        try:
            async with contextlib.aclosing(self.stream(s.text)) as chunks:
                async for chunk in chunks:
                    s.chunks.put_nowait(chunk)
            s.chunks.put_nowait(_END)
        except asyncio.CancelledError:
            raise
        except Exception as e:                      # ApiError and the like: the reader raises it in turn
            s.chunks.put_nowait(e)

    @property
    def idle(self) -> bool:
        """Nothing queued or being spoken."""
        return not self.queue

    async def out(self) -> AsyncIterator[tuple[Spoken, object]]:
        """(sentence, chunk) in order; (sentence, None) at each sentence's end, or (sentence, the
        exception) when its request failed (the sentences after it go on). Waits for more
        sentences until the caller stops reading."""
        while True:
            if not self.queue:
                self._added.clear()
                await self._added.wait()
                continue
            s = self.queue[0]
            item = await s.chunks.get()
            if item is _END or isinstance(item, Exception):
                if self.queue and self.queue[0] is s:
                    self.queue.popleft()
                    self._release(s)
                yield s, None if item is _END else item
            else:
                yield s, item

    def _release(self, s: Spoken) -> None:
        if s.placed:
            s.placed = False
            self.places.release()

    async def cancel(self) -> int:
        """Stop and drop every sentence; the number dropped."""
        dropped = list(self.queue)
        self.queue.clear()
        for s in dropped:
            s.task.cancel()
        for s in dropped:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await s.task
            self._release(s)
        return len(dropped)
