"""The llm model's handshakes with scripts/serve.sh (the drain) and with the watchdog (a part
that died), through files in a run dir.

Triton closes its endpoints the moment it is signalled and then waits for live requests, so a
stream cut by a plain SIGTERM reaches its client as a dropped connection and the server hits its
exit timeout. serve.sh drains first instead:

1. each llm instance writes `serving.<pid>` when it starts;
2. on SIGTERM/Ctrl-C serve.sh writes `draining` holding the grace period in seconds;
3. the llm refuses new requests (UNAVAILABLE), lets live streams finish until the grace period
   ends, then ends the rest with an UNAVAILABLE error; with no stream left it renames its file
   to `drained.<pid>`;
4. serve.sh waits until no `serving.*` file is left (or the grace period and a margin pass),
   then signals the server, which now has nothing in flight and exits at once.

When a part off the streams' path dies (text_frontend, tts_offline, voices), the watchdog
(velocity.serving.lifecycle.watchdog) writes `failed` holding its name before it kills the server; the llm
ends its live streams with an error naming it (STREAM_PART_DIED) and writes `told.<pid>` once
they have all ended, holding how many of those errors go out through the vocoder (the `tts`
ensemble's streams); the vocoder writes `relayed.<pid>` with how many it has sent on. The
watchdog kills once they agree (or after its bound). So a client of Triton's gRPC or HTTP learns
which part died; the llm's, the vocoder's and tritonserver's deaths leave no one to tell them
(UNAVAILABLE: velocity.serving.lifecycle.watchdog.UNNAMED).

It works only under serve.sh (VELOCITY_RUN_DIR set): a bare `tritonserver` has no run dir, and
stopping it cuts live streams as Triton does.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from velocity.serving.wire.protocol import STREAM_PART_DIED

log = logging.getLogger("velocity.drain")


def failed_part(run_dir: str) -> str | None:
    """The part the watchdog saw die (its `failed` file), or None."""
    if not run_dir:
        return None
    try:
        return (Path(run_dir) / "failed").read_text().strip() or None
    except OSError:
        return None


def _count(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _write_count(folder: Path, kind: str, n: int) -> None:
    """`<kind>.<pid>` holding n, written whole (a reader never sees it half-written)."""
    tmp = folder / f"{kind}.{os.getpid()}.tmp"
    try:
        tmp.write_text(str(n))
        tmp.replace(folder / f"{kind}.{os.getpid()}")
    except OSError as e:                  # the run folder gone (a stop): nobody waits for it
        log.warning("could not write %s: %s", tmp, e)


def relayed(run_dir: str, n: int) -> None:
    """The vocoder has sent on n of the llm's errors naming a dead part (`relayed.<pid>`)."""
    if run_dir:
        _write_count(Path(run_dir), "relayed", n)


def all_told(run_dir: str | Path) -> bool:
    """An llm has told its streams of a dead part, and the vocoders have sent on every error of
    theirs that goes through them (the watchdog may kill now)."""
    d = Path(run_dir)
    told, sent = ([f for f in d.glob(f"{kind}.*") if not f.name.endswith(".tmp")] for kind in ("told", "relayed"))
    return bool(told) and sum(map(_count, sent)) >= sum(map(_count, told))


def draining(run_dir: str) -> bool:
    """serve.sh has asked this server to drain (for models other than the llm: a read, no handshake)."""
    return bool(run_dir) and (Path(run_dir) / "draining").exists()


class Drain:
    """One model instance's side of the handshake; inert when run_dir is empty."""

    def __init__(self, run_dir: str) -> None:
        self.dir = Path(run_dir) if run_dir else None
        self.deadline: float | None = None      # monotonic time the grace period ends
        self.finished = False
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / f"serving.{os.getpid()}").touch()

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def poll(self) -> bool:
        """Check for serve.sh's request (cheap; call a few times a second). True while draining."""
        if self.deadline is None and self.dir is not None:
            try:
                raw = (self.dir / "draining").read_text().strip()
            except FileNotFoundError:
                return False
            try:
                grace = max(0.0, float(raw))
            except ValueError:
                grace = 0.0
            self.deadline = time.monotonic() + grace
            log.info("draining: new requests refused, live streams get %.0f s", grace)
        return self.draining

    def told(self, through_vocoder: int = 0) -> None:
        """Every stream has been told that a part died; through_vocoder of those errors go out
        through the vocoder (the watchdog waits for it to send them on)."""
        if self.dir is not None:
            _write_count(self.dir, "told", through_vocoder)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def done(self) -> None:
        """Nothing left in flight: tell serve.sh (once)."""
        if self.finished or self.dir is None:
            return
        self.finished = True
        pid = os.getpid()
        try:
            (self.dir / f"serving.{pid}").rename(self.dir / f"drained.{pid}")
        except FileNotFoundError:
            pass
        log.info("drained")


class Relay:
    """The vocoder's side of the watchdog's wait (velocity.serving.lifecycle.drain): how many of the llm's
    errors naming a dead part (STREAM_PART_DIED chunks) it has sent on, in `relayed.<pid>`."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir, self.sent = run_dir, 0

    def answered(self, chunk_number: int) -> None:
        """A chunk was answered (sent on); count it if it is such an error."""
        if chunk_number == STREAM_PART_DIED:
            self.sent += 1
            relayed(self.run_dir, self.sent)
