"""A Triton Python stub that ends without tearing its interpreter down.

When Triton unloads a model it sends each instance's stub `finalize`; the stub answers, releases
its shared memory, and then finalizes its interpreter, which frees every object one by one
(torch, the text front end, the weights): about a second of CPU per stub on 2 cores, paid in turn
for each instance, since Triton unloads a model's instances one after another. Nothing in that
teardown is ours to keep: by then finalize() has drained the model. So the stub's first exit
handler flushes the logs and ends the process there (its exit status 0, as Triton expects).
"""
from __future__ import annotations

import atexit
import logging
import os
import sys

_registered = False


def _end() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def end_quickly() -> None:
    """Register the quick end (once per process): call from a model's initialize."""
    global _registered
    if not _registered:
        atexit.register(_end)
        _registered = True
