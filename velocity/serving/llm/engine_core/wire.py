"""What the llm stub and its engine core say to each other, and the socket they say it over.

The stub sends commands, several at a time in one message (a list):

    ("start", key, ref, inputs)     a checked request (velocity.serving.llm.llm_inputs.LLMInputs),
                                    ref: its stream-board slot (0: a direct caller)
    ("stop", key)                   the stub ended the stream: abort its engine requests
    ("progress", [(key, done)...])  frames of each stream decoded (and read, for a client that
                                    fell behind): the core pauses a stream that is too far ahead
    ("shutdown",)                   abort everything, send what is left, exit

The core sends one `Report` a step (or after commands that made events), with its events:

    ("chunk", key, chunk)           a chunk (velocity.tts.chunking.CodeChunk, protocol.packed): the
                                    stub builds its response tensors (protocol.chunk_outputs)
    ("generated", key)              every frame is out: the stub ends it once the vocoder has them
    ("end", key, code)              ended by the core: the final flag (code None) or a STREAM_* error
    ("reject", key, message, invalid)  not started: ValueError (invalid) or our own fault

A message is one pickle (protocol 5) on a Unix socketpair, the arrays' bytes beside it, out of
band (Channel; docs/architecture.md says why this transport: benchmarks/bench_transport.py).
"""
from __future__ import annotations

import pickle
import select
import socket
import struct
import threading
from dataclasses import dataclass, field

BUFFER_BYTES = 4 << 20      # each socket's kernel buffers: a burst of requests or chunks waits there
OUT_OF_BAND_BYTES = 4096    # arrays this large go beside the pickle, not into it
IOV_MAX = 512               # buffers one sendmsg writes at most (Linux allows 1024)


@dataclass(slots=True)
class Totals:
    """The core's counts since it started (the stub publishes their changes as metrics)."""
    frames: int = 0                 # audio frames sampled (each sentence's end frame too)
    steps: int = 0                  # engine steps
    step_seconds: float = 0.0       # seconds in them, with the streams' work on their outputs
    worker_seconds: float = 0.0     # of them, in the engine's worker (LLMEngine.worker_seconds)
    lent_steps: int = 0             # steps run with the idle vocoder's CPU threads too
    running: int = 0                # the engine's gauges as of the last step
    waiting: int = 0
    kv_used: int = 0
    kv_free: int = 0
    preemptions: int = 0
    paused: int = 0
    clients: int = 0                # clients with requests in the engine


@dataclass(slots=True)
class Report:
    """The core's message: its events since the last one, and its totals."""
    events: list = field(default_factory=list)
    totals: Totals = field(default_factory=Totals)


def heap_for_large_buffers() -> None:
    """glibc serves this process's allocations up to 256 MiB from its heap and keeps up to 512 MiB
    of freed heap: by default each buffer over 128 KiB a message is read into (a chunk's hidden
    states: 0.65 MB) is a fresh mmap, whose pages fault in one by one as the socket fills them,
    and that doubled a report's cost (benchmarks/bench_transport.py). No-op where libc is not glibc."""
    import ctypes
    import ctypes.util

    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 256 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 512 << 20)
    except (OSError, AttributeError):
        pass


class Channel:
    """One end of the socketpair: whole pickled messages each way, each array's bytes out of band
    (pickle protocol 5): a message is a prefix (the sizes), the pickle and the buffers, written
    with one sendmsg and read into buffers of their own, on which the arrays are built (no copy
    into or out of the pickle). send() may be called from several threads; recv() from one."""

    def __init__(self, sock: socket.socket) -> None:
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, BUFFER_BYTES)
        sock.setblocking(True)
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, message) -> None:
        raws: list = []

        def aside(b: pickle.PickleBuffer) -> bool:    # False: out of band (a large array's bytes)
            raw = b.raw()
            if raw.nbytes < OUT_OF_BAND_BYTES:
                return True
            raws.append(raw)
            return False

        head = pickle.dumps(message, protocol=5, buffer_callback=aside)
        sizes = [len(head)] + [r.nbytes for r in raws]
        parts = [struct.pack(f"<I{len(sizes)}Q", len(sizes), *sizes), head, *raws]
        with self._lock:
            while parts:
                sent = self.sock.sendmsg(parts[:IOV_MAX])
                while parts and sent >= len(parts[0]):      # a large message goes in several writes
                    sent -= len(parts[0])
                    parts.pop(0)
                if parts and sent:
                    parts[0] = memoryview(parts[0])[sent:]

    def recv(self):
        """The next message; EOFError once the other end has closed (or died)."""
        (n,) = struct.unpack("<I", self._read(4))
        sizes = struct.unpack(f"<{n}Q", self._read(8 * n))
        head = self._read(sizes[0])
        return pickle.loads(head, buffers=[self._read(size) for size in sizes[1:]])

    def _read(self, size: int) -> bytearray:
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise EOFError("the other end closed the socket")
            got += n
        return buf

    def poll(self, timeout: float | None) -> bool:
        """A message is waiting (within timeout seconds; None: until one is)."""
        return bool(select.select([self.sock], [], [], timeout)[0])

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()
