"""The stream board (velocity.serving.boards.stream_board) between two processes' views of one file."""
from __future__ import annotations

from velocity.serving.boards.stream_board import CANCELLED, ENDED, FAILED, LIVE, StreamBoard


def test_the_vocoders_marks_and_progress_reach_the_llm(tmp_path):
    llm, vocoder = StreamBoard(tmp_path / "b", slots=8), StreamBoard(tmp_path / "b", slots=8)
    a, b = llm.open(), llm.open()
    assert a != b and a > 0 and b > 0 and llm.in_use() == 2
    vocoder.decoded_to(a, 48)
    vocoder.decoded_to(a, 12)                      # an earlier chunk decoded late: progress never goes back
    vocoder.mark(b, CANCELLED)
    vocoder.mark(b, FAILED)                        # the first mark stays
    assert llm.read(a) == (LIVE, 48, -1) and llm.read(b) == (CANCELLED, 0, -1)
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
    assert board.read(reused) == (LIVE, 0, -1) and not board.ended(a)
    board.decoded_to(a, 99)                        # a late chunk of the old stream
    board.mark(a, CANCELLED)
    assert not board.took(a, 7)                    # the gateway's word on the old stream: dropped
    assert board.read(reused) == (LIVE, 0, -1)
    assert board.read(0) == (LIVE, 0, -1) and not board.ended(0)    # a direct caller has no slot


def test_the_gateways_word_reaches_the_llm_and_a_reused_slot_forgets_it(tmp_path):
    llm, pace = StreamBoard(tmp_path / "b", slots=2), StreamBoard(tmp_path / "b", slots=2)
    a = llm.open()
    assert pace.took(a, 30) and llm.read(a) == (LIVE, 0, 30)
    assert pace.took(a, -1) and llm.read(a) == (LIVE, 0, -1)        # it keeps up again
    llm.close(a)
    assert not pace.took(a, 40)                                     # ended: nothing written
    llm.open()
    b = llm.open()
    assert b % 2 == a % 2 and b != a and llm.read(b) == (LIVE, 0, -1)


def test_references_are_not_guessable_from_one_another(tmp_path):
    """A client sees its own stream's reference (the `tts` output STREAM); the tokens are random,
    so the next stream's is not its reference plus a step."""
    board = StreamBoard(tmp_path / "b", slots=4)
    refs = []
    for _ in range(64):
        refs.append(board.open())
        board.close(refs[-1])
    tokens = [r // 4 for r in refs]
    steps = {b - a for a, b in zip(tokens, tokens[1:])}
    assert len(set(tokens)) == 64 and len(steps) > 32, steps
