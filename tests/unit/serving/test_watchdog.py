"""The watchdog (velocity/serving/lifecycle/watchdog.py) on real processes: a process group whose leader
stands for tritonserver and whose members carry a stub's name and instance on their command
line, as Triton 2.51 starts them. A member that dies is a part failure: counted, the group
killed, readiness false naming the part; liveness fails once not ready for the grace. (The
whole path with a real server: tests/server/test_part_death.py.)"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.soak import descendants
from triton_server import alive, wait_for
from velocity.serving.lifecycle.watchdog import STUB as STUB_NAME, Watchdog, group_stubs


@contextlib.contextmanager
def new_server(tmp_path):
    """Another "tritonserver", whose pid serve.sh has just written (a restart)."""
    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    (tmp_path / "triton.pid").write_text(str(p.pid))
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.fixture
def group(tmp_path):
    """(the leader's pid, {model: stub pid}), the leader's pid written where serve.sh writes it."""
    leader = subprocess.Popen(["sleep", "60"], process_group=0)
    stubs = {}
    for model in ("llm", "vocoder"):
        # argv as Triton's: the stub's path first, the instance among the arguments ("; :" keeps
        # sh from exec'ing sleep in its place)
        p = subprocess.Popen(["/x/triton_python_backend_stub", "-c", "sleep 60; :", f"{model}_0_0"],
                             executable="/bin/sh", process_group=leader.pid)
        stubs[model] = p
    (tmp_path / "triton.pid").write_text(str(leader.pid))
    yield leader, stubs
    for p in (leader, *stubs.values()):
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_stub_that_dies_is_counted_the_group_killed_and_readiness_names_it(group, tmp_path):
    leader, stubs = group
    ready = [True]
    w = Watchdog(tmp_path, lambda: ready[0], live_grace_s=0.5)
    assert group_stubs(leader.pid) == {p.pid: m for m, p in stubs.items()}
    w.poll()
    assert w.status("ready") == (True, "ready") and (tmp_path / "served").read_text() == str(leader.pid)
    assert 'velocity_part_failures_total{part="vocoder"} 0' in w.metrics()

    stubs["vocoder"].kill()
    stubs["vocoder"].wait()
    w.poll()
    ok, why = w.status("ready")
    assert not ok and "vocoder process died" in why, why
    assert 'velocity_part_failures_total{part="vocoder"} 1' in w.metrics()
    assert wait_for(lambda: leader.poll() is not None and stubs["llm"].poll() is not None, 5), \
        "the group was not killed"
    assert leader.returncode == -signal.SIGKILL

    # the leader's death that followed is not counted again; the server comes back (a new leader)
    ready[0] = False
    w.poll()
    assert 'velocity_part_failures_total{part="tritonserver"} 0' in w.metrics()
    assert w.status("live")[0]
    time.sleep(0.6)                                  # past the grace, still not ready: not live
    ok, why = w.status("live")
    assert not ok and "cannot come back" in why, why
    with new_server(tmp_path):
        ready[0] = True
        w.poll()
        assert w.status("ready") == (True, "ready") and w.status("live")[0]


def test_the_server_itself_dying_is_a_failure_and_a_stop_is_not(group, tmp_path):
    leader, _ = group
    w = Watchdog(tmp_path, lambda: True)
    w.poll()
    leader.kill()
    leader.wait()
    w.poll()
    assert not w.status("ready")[0] and 'velocity_part_failures_total{part="tritonserver"} 1' in w.metrics()

    # a stop (serve.sh's `stopping`) is no failure
    w2 = Watchdog(tmp_path, lambda: True)
    with new_server(tmp_path) as other:
        w2.poll()
        (tmp_path / "stopping").touch()
        other.kill()
        other.wait()
        w2.poll()
    assert 'velocity_part_failures_total{part="tritonserver"} 0' in w2.metrics()
    assert not alive(other.pid)


def test_a_server_that_died_and_was_restarted_between_two_looks_is_counted(group, tmp_path):
    """serve.sh starts a server that served again at once: the next look may find a new pid."""
    leader, _ = group
    w = Watchdog(tmp_path, lambda: True)
    w.poll()
    leader.kill()
    leader.wait()
    with new_server(tmp_path):
        w.poll()
        assert 'velocity_part_failures_total{part="tritonserver"} 1' in w.metrics()


def test_a_stubs_own_child_is_no_part_and_its_end_no_failure(group, tmp_path):
    """A stub that forks (a subprocess, a worker) has a child with the stub's command line until
    it execs, or for good: it is not counted as a part, and its end kills nothing. (This fixture's
    own stubs fork `sleep`, so the first assert also covers the window before that exec.)"""
    leader, stubs = group
    # sh runs the parenthesised list in a forked subshell, which keeps sh's argv; sh waits, then sleeps on
    parent = subprocess.Popen(["/x/triton_python_backend_stub", "-c", "(sleep 60; :); sleep 60; :", "llm_1_0"],
                              executable="/bin/sh", process_group=leader.pid)
    try:
        assert wait_for(lambda: descendants(parent.pid), 5), "the stub's subshell did not start"
        child = descendants(parent.pid)[0]              # its direct children come first: the subshell
        assert STUB_NAME in Path(f"/proc/{child}/cmdline").read_text()
        w = Watchdog(tmp_path, lambda: True)
        w.poll()
        assert group_stubs(leader.pid) == {**{p.pid: m for m, p in stubs.items()}, parent.pid: "llm"}
        os.kill(child, signal.SIGKILL)
        assert wait_for(lambda: not alive(child), 5)
        w.poll()
        assert w.status("ready") == (True, "ready") and "} 1" not in w.metrics()
        assert leader.poll() is None, "the group was killed for a stub's child"
    finally:
        parent.kill()
        parent.wait()


def test_the_kill_waits_until_the_vocoder_has_sent_on_the_llms_errors(tmp_path, monkeypatch):
    """A part off the streams' path died: tell() writes `failed`, and returns (the kill follows)
    only once an llm has written `told` and the vocoders' `relayed` counts reach the errors it
    says go through them (velocity.serving.lifecycle.drain). The files are written here as the llm and
    the vocoder write them; TELL_S is raised so that only the handshake can end the wait."""
    import threading

    from velocity.serving.lifecycle import watchdog
    from velocity.serving.lifecycle.drain import Drain
    from velocity.serving.lifecycle.drain import Relay
    from velocity.serving.wire.protocol import STREAM_PART_DIED

    monkeypatch.setattr(watchdog, "TELL_S", 60.0)
    w = Watchdog(tmp_path, lambda: True)
    teller = threading.Thread(target=w.tell, args=("text_frontend",), daemon=True)
    teller.start()
    assert wait_for(lambda: (tmp_path / "failed").exists(), 5) and (tmp_path / "failed").read_text() == "text_frontend"
    Drain(str(tmp_path)).told(2)            # the llm: two streams' errors go through the vocoder
    relay = Relay(str(tmp_path))
    relay.answered(0)                       # the vocoder: a chunk of audio, then one of the errors
    relay.answered(STREAM_PART_DIED)
    time.sleep(0.3)
    assert teller.is_alive(), "the watchdog went on before the vocoder had sent every error on"
    relay.answered(STREAM_PART_DIED)
    teller.join(5)
    assert not teller.is_alive()
