"""client.pace_teller: the server is told of a caller's lag as the chunks arrive, not only when
the caller comes back for the next one (a player held on one chunk). The telling function here
records what it is told; the whole path with a real server: tests/server/test_backpressure_gateway.py."""
from __future__ import annotations

import threading

from client.pace_teller import PaceTeller
from triton_server import wait_for
from velocity.serving.wire.tts_responses import BEHIND, KEEPS_UP, STEP


def recorder(answer: bool = True):
    told: list[tuple[int, int]] = []
    lock = threading.Lock()

    def tell(ref: int, taken: int) -> bool:
        with lock:
            told.append((ref, taken))
        return answer
    return told, tell


def test_a_caller_held_on_a_chunk_is_told_behind_as_the_next_chunks_arrive():
    told, tell = recorder()
    with PaceTeller(tell) as t:
        t.arrive(10, ref=7)
        t.take(10)                                   # the caller took the first chunk, then is held
        t.arrive(10 + BEHIND - 1, ref=7)
        assert not wait_for(lambda: told, 0.3), told     # within BEHIND: nothing to tell
        t.arrive(10 + BEHIND, ref=7)                 # no take since: told from the teller's thread
        assert wait_for(lambda: told == [(7, 10)], 5), told
        t.take(10 + STEP)                            # it reads on, still behind: its position, each STEP
        assert wait_for(lambda: told == [(7, 10), (7, 10 + STEP)], 5), told
        t.take(10 + BEHIND)                          # caught up: the server is told it keeps up
        assert wait_for(lambda: told[-1] == (7, KEEPS_UP), 5), told


def test_nothing_is_told_before_the_stream_is_known_and_after_a_server_without_pace():
    told, tell = recorder(answer=False)
    with PaceTeller(tell) as t:
        t.arrive(BEHIND * 2)                         # no reference yet (ref 0): nobody to tell
        assert not wait_for(lambda: told, 0.3), told
        t.arrive(BEHIND * 2, ref=3)
        assert wait_for(lambda: told == [(3, 0)], 5), told
        t.take(STEP)                                 # the server has no `pace`: never asked again
        t.take(2 * STEP)
        assert not wait_for(lambda: len(told) > 1, 0.3), told


def test_close_ends_the_thread():
    _, tell = recorder()
    t = PaceTeller(tell)
    t.close()
    t._thread.join(5)
    assert not t._thread.is_alive()
