"""Telling the server how far the caller took a stream (the `pace` model), from a thread of its own.

A caller can be held on one chunk for seconds: a player behind a full pipe, a slow writer.
Told only when it comes back for the next chunk, the server would learn of the lag that late,
and until then only the vocoder's decode would bound what it generates. So the stream's reader
(the gRPC callback, the HTTP reader thread) reports each chunk as it arrives, the caller's loop
each chunk it took, and this thread tells the server whenever ReadPosition says so: as soon as
the caller is BEHIND, whether or not it has come back. The gateway does the same (velocity.gateway.pace).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from velocity.serving.wire.tts_responses import ReadPosition

log = logging.getLogger("velocity.client")


class PaceTeller:
    """One stream's ReadPosition, told to the server by tell(ref, taken) -> bool (False: the server
    has no `pace` model, and the stream goes unpaced). Use as a context manager."""

    def __init__(self, tell: Callable[[int, int], bool]) -> None:
        self.tell = tell
        self.pos = ReadPosition()
        self._ref = 0                      # the stream's reference (its chunks carry it); 0 until known
        self._on, self._closed = True, False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="pace-teller", daemon=True)
        self._thread.start()

    def arrive(self, end: int, ref: int = 0) -> None:
        """The server sent the stream's audio up to frame `end` (from the stream's reader)."""
        with self._cv:
            self.pos.arrive(end)
            self._ref = ref or self._ref
            self._cv.notify()

    def take(self, end: int) -> None:
        """The caller took the stream's audio up to frame `end`."""
        with self._cv:
            self.pos.take(end)
            self._cv.notify()

    def _due(self) -> bool:
        return self._closed or (self._on and self._ref != 0 and self.pos.want() != self.pos.told)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(self._due)
                if self._closed:
                    return
                ref, w = self._ref, self.pos.due()
            try:
                on = self.tell(ref, w)
            except Exception as e:             # the stream's client closed under the call: pacing is best effort
                log.debug("pace: not told (%s)", e)
                on = False
            with self._cv:
                self._on = self._on and on

    def close(self) -> None:
        """Stop telling; a telling under way ends on its own (the thread is a daemon)."""
        with self._cv:
            self._closed = True
            self._cv.notify()

    def __enter__(self) -> "PaceTeller":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
