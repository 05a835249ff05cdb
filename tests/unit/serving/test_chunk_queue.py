"""The vocoder's earliest-deadline-first chunk queue (velocity.serving.vocoder.chunk_queue)."""
from __future__ import annotations

import itertools
import threading

from velocity.serving.vocoder.chunk_queue import ChunkQueue
from velocity.tts.chunking import FRAMES_PER_SECOND, ChunkSchedule


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def drain(q: ChunkQueue) -> list:
    q.close()
    return [item for batch in iter(q.get_due, []) for _, item in batch]


def test_first_chunks_overtake_later_chunks_queued_before_them():
    sched = ChunkSchedule(12, 36, 144)
    clock = Clock()
    start = [0, *itertools.islice(sched.bounds(), 5)]           # chunk i's START: the frames before it
    q = ChunkQueue(lambda frames: frames / FRAMES_PER_SECOND, clock)
    q.put(start[3], "a3")       # due 120 frames = 2.56 s from now
    q.put(start[2], "b2")       # due 1.02 s from now
    clock.t += 0.1
    q.put(start[0], "c0")       # a new stream: due at once
    q.put(start[1], "c1")       # due 0.26 s from now
    assert drain(q) == ["c0", "c1", "b2", "a3"]


def test_a_first_chunk_goes_before_later_chunks_even_past_their_deadline():
    """Under overload every later chunk is overdue; a new stream's first audio still goes next,
    first chunks in arrival order, and the overdue ones by deadline after them."""
    clock = Clock()
    q = ChunkQueue(lambda i: 0.5 * i, clock)
    q.put(2, "old")             # due at 101.0
    q.put(4, "older")           # due at 102.0
    clock.t += 5.0              # both overdue
    q.put(0, "new")             # due at 105.0, but a first chunk
    q.put(0, "newer")
    q.put(1, "new1")            # due at 105.5
    assert drain(q) == ["new", "newer", "old", "older", "new1"]


def test_an_error_ending_a_stream_goes_after_everything_queued_before_it():
    clock = Clock()
    q = ChunkQueue(lambda i: 1.0 * i, clock)
    q.put(3, "a3")              # due at 103: a chunk of the stream that then fails
    q.put(1, "b1")              # due at 101
    q.put(-1, "a-error")        # must not overtake a3
    clock.t += 0.5
    q.put(0, "c0")              # arrives later, due at 100.5: may go first
    q.put(4, "d4")              # due at 104.5
    assert drain(q) == ["c0", "b1", "a3", "a-error", "d4"]


def test_get_due_hands_out_the_deadline_put_returned():
    clock = Clock()
    q = ChunkQueue(lambda i: 0.5 * i, clock)
    d2 = q.put(2, "a2")
    clock.t += 0.2
    d0 = q.put(0, "b0")
    assert (d0, d2) == (100.2, 101.0)
    assert q.get_due() == [(d0, "b0")] and q.get_due() == [(d2, "a2")]
    q.close()
    assert q.get_due() == []


def test_equal_deadlines_keep_arrival_order():
    q = ChunkQueue(lambda i: 0.0, Clock())
    for i in range(5):
        q.put(i, i)
    assert drain(q) == [0, 1, 2, 3, 4]


def test_get_blocks_until_put_and_close_ends_the_consumer():
    q = ChunkQueue(lambda i: 0.0)
    got: list = []
    t = threading.Thread(target=lambda: got.extend(item for batch in iter(q.get_due, []) for _, item in batch))
    t.start()
    q.put(0, "x")
    q.put(1, "y")
    q.close()
    t.join(timeout=5)
    assert not t.is_alive() and got == ["x", "y"]
    try:
        q.put(0, "late")
    except RuntimeError as e:
        assert "closed" in str(e)
    else:
        raise AssertionError("put after close must raise")


def test_each_chunks_start_is_the_frames_before_it():
    """START travels with each chunk (the vocoder's deadline): the frames of the stream before it,
    across sentences, which is the schedule's bounds within one sentence."""
    from velocity.tts.chunking import FrameChunker
    s = ChunkSchedule(12, 36, 144)
    ends = [b for b, _ in zip(s.bounds(), range(6))]
    fc = FrameChunker(s, left=4, lookahead=2)
    chunks = fc.push([(0,)] * 600) + fc.finish() + fc.push([(0,)] * 30) + fc.finish()
    assert [c.start for c in chunks[:6]] == [0] + ends[:5]
    assert [c.start for c in chunks] == list(itertools.accumulate([0] + [c.length for c in chunks[:-1]]))


def test_a_batch_is_the_most_urgent_chunk_and_queued_chunks_of_its_length():
    """get_due: the earliest deadline, then others with its key (deadline order, at most n);
    other lengths and refused chunks (key None) stay queued in their order."""
    clock = Clock()
    q = ChunkQueue(lambda i: 1.0 * i, clock)
    for index, item in [(2, ("a2", 64)), (0, ("b0", 28)), (1, ("c1", 64)), (0, ("d0", 28)), (-1, ("e-err", None)),
                        (3, ("f3", 64)), (0, ("g0", 28)), (0, ("h0", 28))]:
        q.put(index, item)
    key = lambda item: item[1]  # noqa: E731
    names = lambda batch: [item[0] for _, item in batch]  # noqa: E731
    assert names(q.get_due(3, key)) == ["b0", "d0", "g0"]          # n = 3: h0 waits
    assert names(q.get_due(8, key)) == ["h0"]
    assert names(q.get_due(8, key)) == ["c1", "a2", "f3"]         # later deadlines join the batch
    assert names(q.get_due(8, key)) == ["e-err"]
    q.put(0, ("x", None))
    q.put(0, ("y", None))
    assert names(q.get_due(8, key)) == ["x"]                      # key None: alone
    assert names(q.get_due(1, key)) == ["y"]
    q.close()
    assert q.get_due(8, key) == []


def test_a_batch_holds_one_chunk_of_a_stream_and_the_rest_keep_their_order():
    """one_of: streams' chunks through their stateful decoders go together, one chunk a stream a
    call (its decoder takes its chunks in order); the next call takes the next of each."""
    clock = Clock()
    q = ChunkQueue(lambda i: 1.0 * i, clock)
    for stream, index in [(1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (2, 2)]:
        q.put(index, (f"s{stream}c{index}", stream))
    key = lambda item: "stream"  # noqa: E731
    one_of = lambda item: item[1]  # noqa: E731
    names = lambda batch: [item[0] for _, item in batch]  # noqa: E731
    assert names(q.get_due(8, key, one_of)) == ["s1c1", "s2c1", "s3c1"]
    assert names(q.get_due(8, key, one_of)) == ["s1c2", "s2c2"]
    assert names(q.get_due(2, key, one_of)) == ["s1c3"]
    for k in range(3):                                  # no stream (None): any number of them
        q.put(1 + k, (f"x{k}", None))
    assert names(q.get_due(8, key, one_of)) == ["x0", "x1", "x2"]
