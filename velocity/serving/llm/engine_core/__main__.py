"""The engine core process: python -m velocity.serving.llm.engine_core --fd N --parent PID

N: its end of the socketpair the llm stub made (velocity.serving.llm.engine_core.client), on which the
stub's Settings and the path of its core board come first. The process ends with the stub: at once when the stub dies (the
kernel's parent-death signal), or when its socket closes.
"""
from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent (the stub) dies, even in the middle of a step."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):       # not Linux: the closed socket still ends it
        return
    if os.getppid() != parent:               # it died before the signal was asked for
        os._exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description="the llm's engine core (started by the llm stub)")
    ap.add_argument("--fd", type=int, required=True, help="this end of the stub's socketpair")
    ap.add_argument("--parent", type=int, required=True, help="the stub's pid")
    args = ap.parse_args()
    die_with_parent(args.parent)
    # Its life is its stub's: a stop signals the server's whole process group, and the core must
    # outlive it until the stub's finalize says shutdown (its streams' ends go out first)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    from velocity.serving.llm.engine_core.core import serve
    from velocity.serving.llm.engine_core.wire import Channel

    channel = Channel(socket.socket(fileno=args.fd))
    try:
        settings, core_board = channel.recv()
    except (EOFError, OSError):
        os._exit(1)                          # the stub is gone already
    settings.configure_logging()
    serve(settings, channel, core_board)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)                              # no interpreter teardown (velocity.serving.lifecycle.stub_exit's reason)


if __name__ == "__main__":
    main()
