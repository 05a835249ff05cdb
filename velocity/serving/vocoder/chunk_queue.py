"""The vocoder's queue: a stream's first chunk first, then the others earliest deadline first.

A chunk is due when the listener has played the audio before it: a stream's first chunk at
once, a later one `seconds_before(position)` after it arrives, its position being what comes
before it in its stream (the vocoder passes the frames before it: with chunks of 12, 36, 72,
144 frames, 0, 0.26, 1.0, 2.6 s). First chunks (position 0) go before every later chunk, in
arrival order: under overload every later chunk is overdue, and by deadline alone a new
stream's first audio would wait behind all of them (docs/benchmarks.md, "Fair
share", measures it with benchmarks/bench_fair.py). A playing stream waits for at
most the first chunks of the streams that start meanwhile, which the request limits bound; a
stream's chunks keep their order (chunk i + 1 arrives later and has more audio before it).
Free of torch and Triton, so it is tested on its own.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any


class ChunkQueue:
    """Thread-safe: first chunks, then earliest deadline first; get_due() blocks, [] once closed and empty."""

    def __init__(self, seconds_before: Callable[[int], float], clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds_before = seconds_before
        self.clock = clock
        self._heap: list[tuple[int, float, int, Any]] = []     # (0: a first chunk, else 1; deadline; order; item)
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
                deadline = max([now] + [d for _, d, _, _ in self._heap])
            else:
                deadline = now + self.seconds_before(index)
            heapq.heappush(self._heap, (0 if index == 0 else 1, deadline, next(self._order), item))
            self._cv.notify()
        return deadline

    def get_due(self, n: int = 1, key: Callable[[Any], Hashable] | None = None,
                one_of: Callable[[Any], Hashable] | None = None) -> list[tuple[float, Any]]:
        """The next (deadline, item), and up to n - 1 more queued items with the same key (not
        None), earliest deadline first: chunks to decode in one call; one_of(item): at most one item
        of each value of it in the call, None free (a stream's chunks go one a call, in order).
        Blocks; [] once closed and empty."""
        with self._cv:
            while not self._heap and not self._closed:
                self._cv.wait()
            if not self._heap:
                return []
            first = heapq.heappop(self._heap)
            k = key(first[3]) if key is not None and n > 1 else None
            if k is None:
                more = []
            elif one_of is None:
                more = heapq.nsmallest(n - 1, (e for e in self._heap if key(e[3]) == k))
            else:
                seen, more = {one_of(first[3])} - {None}, []
                for e in sorted(e for e in self._heap if key(e[3]) == k):
                    if len(more) == n - 1:
                        break
                    if (v := one_of(e[3])) is None or v not in seen:
                        seen.add(v)
                        more.append(e)
            if more:
                taken = {order for _, _, order, _ in more}
                self._heap = [e for e in self._heap if e[2] not in taken]
                heapq.heapify(self._heap)
            return [(deadline, item) for _, deadline, _, item in [first, *more]]

    def close(self) -> None:
        """No more puts; get_due() drains what is queued, then returns []."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def __len__(self) -> int:
        with self._cv:
            return len(self._heap)
