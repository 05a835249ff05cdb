"""The stream board (velocity.serving.stream_board) between two processes' views of one file."""
from __future__ import annotations

from velocity.serving.stream_board import CANCELLED, ENDED, FAILED, LIVE, StreamBoard


def test_the_vocoders_marks_and_progress_reach_the_llm(tmp_path):
    llm, vocoder = StreamBoard(tmp_path / "b", slots=8), StreamBoard(tmp_path / "b", slots=8)
    a, b = llm.open(), llm.open()
    assert a != b and a > 0 and b > 0 and llm.in_use() == 2
    vocoder.decoded_to(a, 48)
    vocoder.decoded_to(a, 12)                      # an earlier chunk decoded late: progress never goes back
    vocoder.mark(b, CANCELLED)
    vocoder.mark(b, FAILED)                        # the first mark stays
    assert llm.read(a) == (LIVE, 48) and llm.read(b) == (CANCELLED, 0)
    assert vocoder.ended(b) and not vocoder.ended(a)


def test_a_closed_slot_keeps_its_state_until_reused_and_stale_references_touch_nothing(tmp_path):
    board = StreamBoard(tmp_path / "b", slots=2)
    a = board.open()
    board.mark(a, ENDED)
    board.close(a)
    assert board.ended(a)                          # queued chunks of an ended stream: still not decoded
    refs = [board.open(), board.open()]            # round robin: the slot comes back with a new token
    assert a not in refs and board.open() is None  # full
    reused = next(r for r in refs if r % 2 == a % 2)
    assert board.read(reused) == (LIVE, 0) and not board.ended(a)
    board.decoded_to(a, 99)                        # a late chunk of the old stream
    board.mark(a, CANCELLED)
    assert board.read(reused) == (LIVE, 0)
    assert board.read(0) == (LIVE, 0) and not board.ended(0)    # a direct caller has no slot
