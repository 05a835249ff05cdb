"""The llm's side of serve.sh's drain handshake (velocity.serving.lifecycle.drain), on its own."""
from __future__ import annotations

import os
import time

from velocity.serving.lifecycle.drain import Drain


def test_without_a_run_dir_it_never_drains(tmp_path):
    d = Drain("")
    assert not d.poll() and not d.draining and not d.expired()
    d.done()                                      # nothing to tell, nothing written
    assert list(tmp_path.iterdir()) == []


def test_handshake(tmp_path):
    d = Drain(str(tmp_path))
    pid = os.getpid()
    assert (tmp_path / f"serving.{pid}").exists()
    assert not d.poll() and not d.draining        # serve.sh has not asked

    (tmp_path / "draining").write_text("0.3\n")
    t0 = time.monotonic()
    assert d.poll() and d.draining
    assert not d.expired()                        # within its grace period
    while not d.expired():
        assert time.monotonic() - t0 < 5
        time.sleep(0.02)
    assert time.monotonic() - t0 >= 0.3

    d.done()
    assert not (tmp_path / f"serving.{pid}").exists() and (tmp_path / f"drained.{pid}").exists()
    d.done()                                      # once is enough; a second call changes nothing
    assert (tmp_path / f"drained.{pid}").exists()


def test_an_unreadable_grace_period_means_none(tmp_path):
    d = Drain(str(tmp_path))
    (tmp_path / "draining").write_text("soon")
    assert d.poll() and d.expired()


def test_a_stub_that_ends_quickly_still_flushes_its_logs_and_exits_0():
    """velocity.serving.lifecycle.stub_exit: the process ends in its first exit handler (no interpreter
    teardown) with status 0, what it printed and logged written out; exit handlers registered
    after it (which run before it) still run."""
    import subprocess
    import sys

    code = ("import atexit, logging, sys\n"
            "from velocity.serving.settings import Settings\n"
            "from velocity.serving.lifecycle.stub_exit import end_quickly\n"
            "Settings().configure_logging()\n"
            "end_quickly(); end_quickly()\n"
            "atexit.register(lambda: print('later handler', end=' '))\n"
            "class Late:\n"
            "    def __del__(self):\n"
            "        sys.stdout.write('torn down')\n"
            "keep = Late()\n"
            "print('printed', end=' ')\n"
            "logging.getLogger('velocity.x').warning('logged')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "printed later handler " and "logged" in p.stderr   # no teardown: no "torn down"
