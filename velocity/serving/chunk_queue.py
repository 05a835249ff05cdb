"""The vocoder's queue: chunks decoded earliest deadline first, not in arrival order.

A chunk is due when the listener has played the audio before it: a stream's first chunk at
once, a later one `seconds_before(position)` after it arrives, its position being what comes
before it in its stream (the vocoder passes the frames before it: with chunks of 12, 36, 72,
144 frames, 0, 0.26, 1.0, 2.6 s). So under load the first chunk of a new stream is decoded ahead of later
chunks of streams that already play, and a later chunk still goes first once it has waited
out its slack (no stream starves). A stream's chunks keep their order: chunk i + 1 arrives
later and has more audio before it, so its deadline is later. Free of torch and Triton, so it is tested on its own.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any


class ChunkQueue:
    """Thread-safe earliest-deadline-first queue; get() blocks, returns None once closed and empty."""

    def __init__(self, seconds_before: Callable[[int], float], clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds_before = seconds_before
        self.clock = clock
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._closed = False

    def put(self, index: int, item: Any) -> float:
        """Queue a chunk at position `index` of some stream; returns its deadline (clock seconds).

        A negative index ends a stream with an error. Its stream's earlier chunks may still be
        queued (the queue does not know streams), and Triton's ensemble must get them before
        the error, so it goes after everything queued now."""
        now = self.clock()
        with self._cv:
            if self._closed:
                raise RuntimeError("vocoder queue is closed")
            if index < 0:
                deadline = max([now] + [d for d, _, _ in self._heap])
            else:
                deadline = now + self.seconds_before(index)
            heapq.heappush(self._heap, (deadline, next(self._order), item))
            self._cv.notify()
        return deadline

    def get_due(self, n: int = 1, key: Callable[[Any], Hashable] | None = None) -> list[tuple[float, Any]]:
        """The next (deadline, item), and up to n - 1 more queued items with the same key (not
        None), earliest deadline first: chunks to decode in one call. Blocks; [] once closed and empty."""
        with self._cv:
            while not self._heap and not self._closed:
                self._cv.wait()
            if not self._heap:
                return []
            first = heapq.heappop(self._heap)
            k = key(first[2]) if key is not None and n > 1 else None
            more = [] if k is None else heapq.nsmallest(n - 1, (e for e in self._heap if key(e[2]) == k))
            if more:
                taken = {order for _, order, _ in more}
                self._heap = [e for e in self._heap if e[1] not in taken]
                heapq.heapify(self._heap)
            return [(deadline, item) for deadline, _, item in [first, *more]]

    def close(self) -> None:
        """No more puts; get_due() drains what is queued, then returns []."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def __len__(self) -> int:
        with self._cv:
            return len(self._heap)
