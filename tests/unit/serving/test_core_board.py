"""The vocoder's busy marks as the llm sees them (velocity.serving.boards.core_board), across processes."""
import os
import subprocess
import sys

from velocity.serving.boards.core_board import SLOTS, CoreBoard, ThreadLender, board_path, find_boards


def test_busy_marks_are_seen_by_another_board_and_slots_are_reused(tmp_path):
    path = tmp_path / "board"
    llm, voc1, voc2 = CoreBoard(path), CoreBoard(path), CoreBoard(path)
    assert (voc1.claim(), voc2.claim()) == (0, 1)
    assert not llm.any_busy()
    with voc2.busy():
        assert llm.any_busy()
        with voc1.busy():
            assert llm.any_busy()
        assert llm.any_busy()                  # voc2 still decodes
    assert not llm.any_busy()
    voc1.close()
    assert CoreBoard(path).claim() == 0        # a closed instance's slot is free again
    llm.close(unlink=True)
    assert not path.exists()


def test_a_full_board_claims_nothing_and_busy_is_then_a_no_op(tmp_path):
    boards = [CoreBoard(tmp_path / "b") for _ in range(SLOTS + 1)]
    assert [b.claim() for b in boards] == list(range(SLOTS)) + [None]
    with boards[-1].busy():
        assert not boards[0].any_busy()


def test_the_mark_crosses_processes(tmp_path):
    path = tmp_path / "board"
    llm = CoreBoard(path)
    code = ("import sys; from velocity.serving.boards.core_board import CoreBoard\n"
            f"b = CoreBoard({str(path)!r}); b.claim()\n"
            "with b.busy():\n    print('busy', flush=True); sys.stdin.readline()\n"
            "print('idle', flush=True); sys.stdin.readline()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "busy" and llm.any_busy()
        p.stdin.write("\n"); p.stdin.flush()
        assert p.stdout.readline().strip() == "idle" and not llm.any_busy()
    finally:
        p.communicate("\n", timeout=30)
    assert p.returncode == 0


def test_lender_switches_threads_only_when_the_vocoder_state_changes(tmp_path):
    board, voc = CoreBoard(tmp_path / "b"), CoreBoard(tmp_path / "b")
    voc.claim()
    calls = []
    lend = ThreadLender(board, own=1, lent=2, set_threads=calls.append)

    def step():
        with lend():
            pass
    step(); step()
    with voc.busy():
        step(); step()
    step()
    assert calls == [2, 1, 2] and lend.current == 2 and lend.lent_steps == 3


def test_a_decode_waits_for_the_llms_next_look_and_the_step_takes_the_core_back_after_it(tmp_path):
    """A vocoder that starts to decode while the llm runs on the lent threads raises its busy mark
    only once the llm looked again (before a layer) and gave the threads back; once the decode is
    over, the next look takes them again, mid-step."""
    import threading
    import time

    board, voc = CoreBoard(tmp_path / "b"), CoreBoard(tmp_path / "b")
    voc.claim()
    calls, decoding, done = [], threading.Event(), threading.Event()
    lend = ThreadLender(board, own=1, lent=2, set_threads=calls.append)

    def decode():
        with voc.busy():
            decoding.set()
            done.wait(30)
    t = threading.Thread(target=decode)
    with lend():
        assert calls == [2]
        t.start()
        deadline = time.monotonic() + 10
        while not board.any_busy() and time.monotonic() < deadline:       # its want mark
            time.sleep(0.001)
        assert board.any_busy()
        time.sleep(0.2)
        assert not decoding.is_set()                  # it waits for the llm's next look (a layer's start)
        lend.check()
        assert calls == [2, 1] and decoding.wait(10)  # its turn, on the vocoder's core
        lend.check()
        assert calls == [2, 1]
        done.set()
        t.join(10)
        lend.check()                                  # the decode is over: the step takes the core back
        assert calls == [2, 1, 2]
    with lend():
        pass
    assert lend.lent_steps == 2 and calls == [2, 1, 2]
    lend.check()                                      # outside a step: no lock taken, nothing changed
    assert not lend.holding and calls == [2, 1, 2]
    with voc.busy():                                  # (the lock is free: this would block otherwise)
        pass


def test_a_vocoder_killed_in_the_lock_leaves_it_free(tmp_path):
    """The lock is the kernel's (flock): while another process holds it the llm's steps keep to
    their own threads (they never wait for it), and once that process dies they are lent again."""
    path = tmp_path / "board"
    board = CoreBoard(path)
    code = ("import sys, time; from velocity.serving.boards.core_board import CoreBoard\n"
            f"b = CoreBoard({str(path)!r}); b.claim()\n"
            "with b.lent_step():\n    print('held', flush=True); time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    calls = []
    lend = ThreadLender(board, own=1, lent=2, set_threads=calls.append)
    try:
        assert p.stdout.readline().strip() == "held"
        with lend():
            pass
        assert lend.lent_steps == 0 and calls == []
        p.kill()
        p.wait(30)
        with lend():
            pass
        assert lend.lent_steps == 1 and calls == [2]
    finally:
        p.kill()
        p.wait(30)


def test_board_path_is_one_per_parent_process():
    p = board_path()
    assert p.name.startswith(f"velocity-cores-{os.getppid()}-")
    out = subprocess.run([sys.executable, "-c", "from velocity.serving.boards.core_board import board_path; print(board_path())"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out.rsplit("-", 2)[1] == str(os.getpid())                # a child's board is keyed by us, its parent


def test_a_board_in_serve_sh_run_folder_is_found(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))             # serve.sh: ${TMPDIR:-/tmp}
    run = tmp_path / "velocity-serve.abc123"
    run.mkdir()
    p = board_path(str(run))
    assert p.parent == run
    CoreBoard(p).close()
    assert p in find_boards() and find_boards(os.getppid()) == [p]
    assert find_boards(os.getppid() + 1) == []                          # another server's pid


def test_threads_lent_adds_the_vocoders_within_the_cores(monkeypatch):
    from velocity.serving.settings import Settings
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert Settings(vocoder_threads=1).threads_lent(1) == 2
    assert Settings(vocoder_threads=2).threads_lent(1) == 2            # never more threads than cores
    assert Settings(vocoder_threads=1).threads_lent(4) == 4            # an explicit llm count is kept
