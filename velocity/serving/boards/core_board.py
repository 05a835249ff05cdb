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

A decode never starts while the llm computes on the lent threads: the llm holds a lock (flock on
the board's `-turn` file, which the kernel frees when its holder dies) while it does, and a
vocoder takes it before it raises its busy mark, with a want mark up while it waits, which the
llm looks at before each layer (ThreadLender). A decode beside the lent threads would put three
threads on two cores: the step's two then meet at each barrier at the pace of the one that shares
its core.
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

SLOTS = 64                     # bytes [0, SLOTS): claimed slots; [SLOTS, 2 * SLOTS): busy marks;
WANT = 2 * SLOTS               # [WANT, WANT + SLOTS): want marks (a vocoder waits for the lent threads back)
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


def turn_path(board: Path) -> Path:
    """The file whose lock the llm holds on the lent threads (CoreBoard.lent_step)."""
    return board.with_name(board.name + "-turn")


def board_dir() -> Path:
    return Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())


def find_boards(pid: int | str = "*", kind: str = "cores") -> list[Path]:
    """Boards of running servers on this machine (of the tritonserver `pid`): in serve.sh's run
    folders (`$TMPDIR/velocity-serve.*`) and in board_dir()."""
    name = f"velocity-{kind}-{pid}-*"
    runs = Path(tempfile.gettempdir()).glob(f"velocity-serve.*/{name}")
    return sorted(b for b in {*runs, *board_dir().glob(name)} if not b.name.endswith("-turn"))


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
        self._fd, self._mm = map_file(self.path, 3 * SLOTS)
        self._turn_fd: int | None = None
        self.slot: int | None = None

    def _locked(self):
        return flocked(self._fd)

    # -- vocoder side ----------------------------------------------------------------
    def claim(self) -> int | None:
        """Take a free slot for this process; None (with a warning) if all are taken."""
        with self._locked():
            for i in range(SLOTS):
                if not self._mm[i]:
                    self._mm[i], self._mm[SLOTS + i], self._mm[WANT + i], self.slot = 1, 0, 0, i
                    return i
        log.warning("core board %s is full: the llm will not see this vocoder's work", self.path)
        return None

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Mark this process's slot busy for the duration of the block, once a step of the llm's
        on the lent threads (if one runs) has ended."""
        if self.slot is not None:
            self._mm[WANT + self.slot] = 1            # the llm's next step keeps to its own threads
            with self.lent_step():
                self._mm[SLOTS + self.slot] = 1
                self._mm[WANT + self.slot] = 0
        try:
            yield
        finally:
            if self.slot is not None:
                self._mm[SLOTS + self.slot] = 0

    # -- llm side --------------------------------------------------------------------
    def any_busy(self) -> bool:
        """Whether a vocoder decodes or waits to (its busy or want mark)."""
        return self._mm.find(b"\x01", SLOTS, 3 * SLOTS) != -1

    @contextmanager
    def lent_step(self) -> Iterator[None]:
        """The lock the llm holds on the lent threads (and a vocoder, to raise its busy mark)."""
        with flocked(self._turn_lock()):
            yield

    def try_lent(self) -> bool:
        """Take that lock if it is free (the llm); end_lent gives it back."""
        try:
            fcntl.flock(self._turn_lock(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def end_lent(self) -> None:
        fcntl.flock(self._turn_lock(), fcntl.LOCK_UN)

    def _turn_lock(self) -> int:
        if self._turn_fd is None:
            self._turn_fd = os.open(turn_path(self.path), os.O_RDWR | os.O_CREAT, 0o600)
        return self._turn_fd

    def close(self, unlink: bool = False) -> None:
        """Free this process's slot; unlink: also remove the file (the llm, at finalize)."""
        if self.slot is not None:
            with self._locked():
                self._mm[self.slot] = self._mm[SLOTS + self.slot] = 0
            self.slot = None
        self._mm.close()
        os.close(self._fd)
        if self._turn_fd is not None:
            os.close(self._turn_fd)
            self._turn_fd = None
        if unlink:
            self.path.unlink(missing_ok=True)
            turn_path(self.path).unlink(missing_ok=True)


class ThreadLender:
    """On the llm's engine thread: `own` threads while a vocoder decodes (or waits to), `lent`
    (own + the vocoder's) while none does, looked at when a step starts and before each of its
    layers (`check`, LlamaBody.between_layers). On the lent threads it holds the board's lock, and
    gives it up (and the threads) at the first look after a vocoder raised its want mark, so that
    a decode waits a layer at most and never shares a core with a step's thread; a step that
    started on its own threads takes the vocoder's once its decode is over. set_threads:
    torch.set_num_threads."""

    def __init__(self, board: CoreBoard, own: int, lent: int, set_threads: Callable[[int], None]) -> None:
        self.board, self.own, self.lent, self._set = board, own, lent, set_threads
        self.current = own
        self.holding = False                    # the board's lock: on the lent threads
        self.lent_steps = 0                     # steps run with the vocoder's threads too, in part at least
        self._lent_now = self._in_step = False

    @contextmanager
    def __call__(self) -> Iterator[None]:
        """Around one step."""
        self._lent_now, self._in_step = False, True
        self.check()
        try:
            yield
        finally:
            self._in_step = False
            self._give_back()
            self.lent_steps += self._lent_now

    def check(self) -> None:
        """Lend or give back, as the vocoders' marks say now (within a step; outside one, nothing)."""
        if not self._in_step:
            return
        if self.holding:
            if not self.board.any_busy():
                return
            self._give_back()                     # a vocoder waits: its turn, on the vocoder's core
        elif self.lent > self.own and not self.board.any_busy() and self.board.try_lent():
            if not self.board.any_busy():         # (a vocoder may have raised its mark meanwhile)
                self.holding = self._lent_now = True
                self._threads(self.lent)
                return
            self.board.end_lent()
        self._threads(self.own)

    def _give_back(self) -> None:
        """The board's lock given back, if held (the threads are check's to set)."""
        if self.holding:
            self.board.end_lent()
            self.holding = False

    def _threads(self, n: int) -> None:
        if n != self.current:
            self._set(n)
            self.current = n
