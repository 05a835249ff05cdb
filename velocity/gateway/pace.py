"""A `tts` stream paced by its client's reading.

Triton's gRPC frontend queues a decoupled model's responses without a bound, so a gateway that
stops reading a stream does not slow the server: a client that reads slower than the server
generates would have its audio made far ahead, for nobody if it leaves. So the gateway reads each
stream at once and tells the server how far its client has read (AudioChunk.read, from each
protocol's writer once a chunk is handed to the client) through the `pace` model, which writes it
to the stream board; the llm pauses a stream with VELOCITY_BACKLOG_SECONDS of audio not yet read,
as it does for audio the vocoder has not decoded.

The gateway reads each stream ahead of its writer (read_ahead), or it could not see the client
lag; what it holds is bounded by the pacing, and by READ_AHEAD_S should the server not pace.

When the server is told is velocity.serving.wire.tts_responses.ReadPosition's (the client's too);
one telling at a time per stream, the newest value.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from velocity.serving.wire.tts_responses import READ_AHEAD_S, ReadPosition

log = logging.getLogger("velocity.gateway")
_END = object()


class Pacer:
    """One stream's audio as it arrived from the server and as its client read it; tell(taken)
    says the client's position (or KEEPS_UP) to the server."""

    def __init__(self, tell: Callable[[int], Awaitable[None]]) -> None:
        self.tell, self.pos = tell, ReadPosition()
        self._task: asyncio.Task | None = None
        self._closed = False

    def received(self, end: int) -> None:
        self.pos.arrive(end)
        self._update()

    def read(self, end: int) -> None:
        self.pos.take(end)
        self._update()

    def _update(self) -> None:
        if not self._closed and self._task is None and self.pos.want() != self.pos.told:
            self._task = asyncio.get_running_loop().create_task(self._tell_all())

    async def _tell_all(self) -> None:
        try:
            while not self._closed and (w := self.pos.due()) is not None:
                await self.tell(w)
        except Exception as e:                       # a server without `pace`, or gone: pacing is best effort
            log.info("pace: could not tell the server how far its client read (%s): this stream is not paced", e)
            self._closed = True
        finally:
            self._task = None

    def close(self) -> None:
        """The stream ended: nothing more is told."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()


async def read_ahead(source: AsyncIterator, sample_rate: int = 24000, held_max_s: float = READ_AHEAD_S) -> AsyncIterator:
    """The chunks (AudioChunk) of `source`, read by a task of their own as they come, while at most
    `held_max_s` seconds of audio wait for the caller; the source's errors in turn. Closing this
    generator closes the source (its Triton stream is cancelled)."""
    queue: asyncio.Queue = asyncio.Queue()
    held, held_max, room = 0, held_max_s * sample_rate, asyncio.Event()

    async def pump() -> None:
        nonlocal held
        try:
            async for chunk in source:
                queue.put_nowait(chunk)
                held += len(chunk.audio)
                while held > held_max:
                    room.clear()
                    await room.wait()
            queue.put_nowait(_END)
        except Exception as e:                      # ApiError and the like: raised to the caller in turn
            queue.put_nowait(e)

    task = asyncio.get_running_loop().create_task(pump())
    try:
        while (item := await queue.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            held -= len(item.audio)
            room.set()
            yield item
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await source.aclose()
