"""The llm stub's side of its engine core (CoreClient): starts the core process, sends it
commands from a thread of its own (no caller ever waits on the socket), and hands each of the
core's reports to `on_report` on a receiving thread; `on_death` once the core is gone unasked.
"""
from __future__ import annotations

import logging
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from velocity.serving.boards.core_board import board_path
from velocity.serving.llm.engine_core.wire import Channel, Report, heap_for_large_buffers
from velocity.serving.llm.llm_inputs import LLMInputs
from velocity.serving.settings import Settings

log = logging.getLogger("velocity.llm")
STOP_S = 30.0            # seconds the core gets to shut down before it is killed


def python() -> str:
    """The interpreter of this process's environment: a stub embeds Python, so sys.executable may
    be the stub itself; the venv's bin/ is first on the stub's PATH (scripts/serve.sh)."""
    exe = Path(sys.executable or "")
    if exe.name.startswith("python") and exe.is_file():
        return str(exe)
    for candidate in (Path(sys.prefix) / "bin" / "python3", shutil.which("python3")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    raise RuntimeError("no python3 to run the engine core in (put the venv's bin/ first on PATH)")


class CoreClient:
    """The engine core process and the two threads that talk to it (see the module)."""

    def __init__(self, settings: Settings, on_report: Callable[[Report], None], on_death: Callable[[str], None]) -> None:
        heap_for_large_buffers()               # the reports' chunks are read into this process's heap
        ours, theirs = socket.socketpair()
        cmd = [python(), "-m", "velocity.serving.llm.engine_core", "--fd", str(theirs.fileno()),
               "--parent", str(os.getpid())]
        self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()])
        theirs.close()
        self.channel = Channel(ours)
        # the core runs on this process's settings, not its environment's, and shares the vocoder's
        # core board, which is named after this stub's parent (the server)
        self.channel.send((settings, str(board_path(settings.run_dir))))
        try:
            first = self.channel.recv()        # the model loads: seconds on CPU, minutes with CUDA graphs
        except (EOFError, OSError):
            code = self.proc.wait()
            raise RuntimeError(f"the engine core exited with {code} while starting (the server log has why)") from None
        if first[0] != "ready":
            self.proc.wait()
            raise RuntimeError(first[1])
        self.info: dict = first[1]
        self.on_report, self.on_death = on_report, on_death
        self.closing = False
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._send_loop, name="llm-core-send", daemon=True),
                         threading.Thread(target=self._recv_loop, name="llm-core-recv", daemon=True)]
        for t in self._threads:
            t.start()
        log.info("the engine core runs in process %d", self.proc.pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    # -- commands (any thread; never blocks) ------------------------------------------
    def start(self, key: int, ref: int, inputs: LLMInputs) -> None:
        self._outbox.put(("start", key, ref, inputs))

    def stop(self, key: int) -> None:
        self._outbox.put(("stop", key))

    def progress(self, done: list[tuple[int, int]]) -> None:
        self._outbox.put(("progress", done))

    def _send_loop(self) -> None:
        """Everything queued goes in one message."""
        while (cmd := self._outbox.get()) is not None:
            batch = [cmd]
            while True:
                try:
                    more = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._outbox.put(None)
                    break
                batch.append(more)
            try:
                self.channel.send(batch)
            except OSError:                      # the core is gone: the receiver tells
                return

    def _recv_loop(self) -> None:
        while True:
            try:
                report = self.channel.recv()
            except (EOFError, OSError):
                break
            try:
                self.on_report(report)
            except Exception:                    # one bad report must not stop the others
                log.exception("llm: could not handle the engine core's report")
        if not self.closing:
            code = self.proc.wait()
            why = f"the engine core (process {self.proc.pid}) died" + (f" (signal {-code})" if code < 0 else
                                                                         f" (exit code {code})")
            log.error("llm: %s: every stream ends now", why)
            self.on_death(why)

    def close(self) -> None:
        """Tell the core to shut down (it aborts what is left and reports it), then wait for it."""
        self.closing = True
        self._outbox.put(("shutdown",))
        self._outbox.put(None)
        try:
            self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            log.error("llm: the engine core did not stop within %.0f s: killing it", STOP_S)
            self.proc.kill()
            self.proc.wait()
        for t in self._threads:
            t.join(timeout=5)
        self.channel.close()
