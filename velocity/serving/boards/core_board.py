"""The core board (CPU only): the llm borrows the vocoder's CPU cores while the vocoder has
nothing to decode. On a GPU neither model touches it (VELOCITY_LEND_VOCODER_CORES applies to CPU).

The llm and the vocoder are separate Triton model processes on the same cores, each with its own
OpenMP pool. Two pools on the same cores stall each other at every barrier, so each process gets
its own share (Settings.llm_threads / vocoder_threads). But the vocoder is idle most of the time
(at one stream between its three or four chunks, at 32 streams about five sixths of the time), and
an idle share is wasted: the llm decodes one stream faster with both (docs/benchmarks/history.md, "The
core board, and decoding in the llm's process").

A CoreBoard is a small memory-mapped file, one per Triton server: each vocoder instance claims a
slot and marks it busy while it decodes a chunk; the llm looks before each step and takes all the
cores when no slot is busy. Failing safe: a busy mark left by a crashed vocoder only stops lending.
"""
from __future__ import annotations

import fcntl
import logging
import mmap
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

SLOTS = 64                     # bytes [0, SLOTS): claimed slots; [SLOTS, 2 * SLOTS): busy marks
log = logging.getLogger(__name__)


def board_path(run_dir: str = "", kind: str = "cores") -> Path:
    """The board of the Triton server this model process belongs to (its parent: the python
    backend's stubs are children of tritonserver), keyed by the server's pid and start time.
    kind: "cores" (this module's) or "streams" (velocity.serving.boards.stream_board).
    run_dir: serve.sh's VELOCITY_RUN_DIR, removed when serve.sh exits, so a board whose models
    never finalized (stubs killed) goes with it; without it the board lies in board_dir()."""
    ppid = os.getppid()
    try:
        started = Path(f"/proc/{ppid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "0"
    return (Path(run_dir) if run_dir else board_dir()) / f"velocity-{kind}-{ppid}-{started}"


def board_dir() -> Path:
    return Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())


def find_boards(pid: int | str = "*", kind: str = "cores") -> list[Path]:
    """Boards of running servers on this machine (of the tritonserver `pid`): in serve.sh's run
    folders (`$TMPDIR/velocity-serve.*`) and in board_dir()."""
    name = f"velocity-{kind}-{pid}-*"
    runs = Path(tempfile.gettempdir()).glob(f"velocity-serve.*/{name}")
    return sorted({*runs, *board_dir().glob(name)})


@contextmanager
def flocked(fd: int) -> Iterator[None]:
    """An exclusive lock on the open file fd for the duration of the block (between processes)."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def map_file(path: Path, size: int) -> tuple[int, mmap.mmap]:
    """A board's file opened (created if need be, at least `size` bytes) and mapped: (fd, map)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with flocked(fd):
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
    return fd, mmap.mmap(fd, size)


class CoreBoard:
    """Busy marks of the vocoder instances, shared between processes through one mmap'ed file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd, self._mm = map_file(self.path, 2 * SLOTS)
        self.slot: int | None = None

    def _locked(self):
        return flocked(self._fd)

    # -- vocoder side ----------------------------------------------------------------
    def claim(self) -> int | None:
        """Take a free slot for this process; None (with a warning) if all are taken."""
        with self._locked():
            for i in range(SLOTS):
                if not self._mm[i]:
                    self._mm[i], self._mm[SLOTS + i], self.slot = 1, 0, i
                    return i
        log.warning("core board %s is full: the llm will not see this vocoder's work", self.path)
        return None

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Mark this process's slot busy for the duration of the block."""
        if self.slot is not None:
            self._mm[SLOTS + self.slot] = 1
        try:
            yield
        finally:
            if self.slot is not None:
                self._mm[SLOTS + self.slot] = 0

    # -- llm side --------------------------------------------------------------------
    def any_busy(self) -> bool:
        return self._mm.find(b"\x01", SLOTS, 2 * SLOTS) != -1

    def close(self, unlink: bool = False) -> None:
        """Free this process's slot; unlink: also remove the file (the llm, at finalize)."""
        if self.slot is not None:
            with self._locked():
                self._mm[self.slot] = self._mm[SLOTS + self.slot] = 0
            self.slot = None
        self._mm.close()
        os.close(self._fd)
        if unlink:
            self.path.unlink(missing_ok=True)


class ThreadLender:
    """On the llm's engine thread before each step: `own` threads while a vocoder decodes,
    `lent` (own + the vocoder's) while none does. set_threads: torch.set_num_threads."""

    def __init__(self, board: CoreBoard, own: int, lent: int, set_threads: Callable[[int], None]) -> None:
        self.board, self.own, self.lent, self._set = board, own, lent, set_threads
        self.current = own
        self.lent_steps = 0                     # steps run with the vocoder's threads too

    def __call__(self) -> None:
        n = self.own if self.board.any_busy() else self.lent
        self.lent_steps += n > self.own
        if n != self.current:
            self._set(n)
            self.current = n
