"""The llm's side of serve.sh's drain handshake (velocity.serving.drain), on its own."""
from __future__ import annotations

import os
import time

from velocity.serving.drain import Drain


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
