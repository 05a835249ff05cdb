"""The tiny demo checkpoints of the tests: each seed's written once a session (its audio models
are release-size: writing them costs CPU, copying them little) and copied into each test's folder."""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_written: dict[int, Path] = {}


def tiny_checkpoint(out: str | Path, seed: int = 0) -> Path:
    """A copy of write_checkpoint(out, "tiny", seed): a folder of its own, free to change."""
    if seed not in _written:
        from velocity.demo.checkpoint import write_checkpoint

        cache = Path(tempfile.mkdtemp(prefix="velocity-tiny-"))
        atexit.register(shutil.rmtree, cache, True)
        _written[seed] = write_checkpoint(cache / f"seed{seed}", "tiny", seed)
    shutil.copytree(_written[seed], out, dirs_exist_ok=True)
    return Path(out)
