"""The watchdog: a dead part is seen at once, the server restarted, readiness and liveness told.

Triton 2.51 does not notice a python stub that died (docs/architecture.md, "When a part
dies"): a dead `llm` leaves its streams waiting for ever, a dead `vocoder` fails each chunk,
and the server stays ready. So the health process (velocity.serving.lifecycle.health) watches from
outside, every POLL_S seconds:

- serve.sh writes tritonserver's pid to `<run dir>/triton.pid` at each start; the server leads
  its own process group, whose `triton_python_backend_stub` processes are the models' stubs,
  each named by its instance (`llm_0_0`) on its command line;
- once Triton is ready the stubs are known; a stub that is gone, or Triton itself, is a part
  failure: counted (`velocity_part_failures_total{part}`), logged; when it is not on every
  stream's path (UNNAMED), the llm first ends its streams with an error naming the part
  (`failed` and `told.<pid>` in the run dir, at most TELL_S: velocity.serving.lifecycle.drain); then the
  whole group is killed (SIGKILL), so every stream left ends with an error at once (UNAVAILABLE
  on gRPC; the gateways name the part from readiness's reason), and serve.sh starts it again;
- until the new server is ready, readiness is false (`failed` names the part); liveness turns
  false only when the server has not been ready for `live_grace_s` (a server that cannot come
  back: Kubernetes then restarts the container).

While serve.sh stops (`<run dir>/stopping`) nothing is a failure. Standard library only (and the
drain's files: velocity.serving.lifecycle.drain).
"""
from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from velocity.serving.lifecycle.drain import all_told, failed_part

log = logging.getLogger("velocity.watchdog")

POLL_S = 0.2
TELL_S = 1.0                    # seconds the llm gets to end its streams naming a dead part, before the kill
# parts on every `tts` stream's path: their death leaves no one to name it on Triton's own protocols
# (a dead vocoder's "not healthy" comes after seconds), so the kill comes at once
UNNAMED = ("tritonserver", "llm", "vocoder")
DIED = "process died"           # in readiness's reason after a failure (the gateways pass it on to clients)
# parts inside a model's process tree: the llm's engine core (velocity.serving.llm.engine_core), whose
# death its stub names in `failed` before it ends itself
WITHIN = {"llm": "llm engine"}
STUB = "triton_python_backend_stub"
INSTANCE = re.compile(r"^([A-Za-z0-9_.-]+?)_\d+_\d+$")      # llm_0_0 -> llm


def stat_fields(pid_dir: Path) -> list[str]:
    """/proc/<pid>/stat's fields after "pid (comm) ": [state, ppid, pgrp, ...]; OSError once gone."""
    stat = (pid_dir / "stat").read_text()
    return stat[stat.rindex(")") + 2:].split()


def group_stubs(pgid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """{pid: model} of the python stubs in process group `pgid` (Linux /proc).

    A stub's own child is not a stub: between its fork and its exec (or for good, if it never
    execs) it carries the stub's command line, and its end is no part's death."""
    found = {}                                                       # pid -> (ppid, model)
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = stat_fields(d)
            if int(fields[2]) != pgid or fields[0] == "Z":        # its group; not a zombie
                continue
            ppid = int(fields[1])
            args = (d / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):                  # gone meanwhile
            continue
        if args and args[0].decode(errors="replace").endswith(STUB):
            model = next((m.group(1) for a in args[1:] if (m := INSTANCE.match(a.decode(errors="replace")))), "?")
            found[int(d.name)] = (ppid, model)
    return {pid: model for pid, (ppid, model) in found.items() if ppid not in found}


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return stat_fields(Path(f"/proc/{pid}"))[0] != "Z"
    except (OSError, ValueError, IndexError):
        return False


class Watchdog:
    """Watches the server that serve.sh runs (see the module); its state answers the probes."""

    def __init__(self, run_dir: Path, ready: Callable[[], bool], live_grace_s: float = 300.0) -> None:
        self.run_dir, self.ready_check, self.live_grace_s = run_dir, ready, live_grace_s
        self.failures: dict[str, int] = {"tritonserver": 0}     # each model joins at 0 once seen
        self.failed: str | None = None           # the part that died, until the server is ready again
        self.ready = False
        self.down_since: float | None = None     # not ready since (after having been ready once)
        self._pid: int | None = None
        self._stubs: dict[int, str] = {}
        self._lock = threading.Lock()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self._run, name="watchdog", daemon=True)
        t.start()
        return t

    def _run(self) -> None:
        while True:
            try:
                self.poll()
            except Exception:                     # never let the watch end
                log.exception("watchdog: the check failed")
            time.sleep(POLL_S)

    def stopping(self) -> bool:
        return (self.run_dir / "stopping").exists()

    def server_pid(self) -> int | None:
        try:
            return int((self.run_dir / "triton.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def poll(self) -> None:
        """One look: a new server, a death, or readiness come back."""
        pid = self.server_pid()
        if pid != self._pid:                      # serve.sh started a (new) server
            if self._pid is not None and (self._stubs or self.ready) and not alive(self._pid):
                self.fail("tritonserver", self._pid)      # it died and was restarted between two looks
            self._pid, self._stubs = pid, {}
        if pid is None or self.stopping():
            self.ready = False
            return
        if not alive(pid):
            if self._stubs or self.ready:         # it was serving: a death, not a failed start
                self.fail("tritonserver", pid)
            self.ready = False
            return
        if self._stubs:
            gone = [(p, m) for p, m in self._stubs.items() if not alive(p)]
            if gone:
                self.fail(gone[0][1], gone[0][0])
                return
        ready = self.ready_check()
        if ready and not self._stubs:
            (self.run_dir / "served").write_text(str(pid))   # serve.sh: this one served (see its restarts)
            self._stubs = group_stubs(pid)
            with self._lock:
                for model in self._stubs.values():
                    self.failures.setdefault(model, 0)
                    if model in WITHIN:
                        self.failures.setdefault(WITHIN[model], 0)
            log.info("watchdog: serving with %d model processes: %s", len(self._stubs),
                     ", ".join(sorted(set(self._stubs.values()))))
        with self._lock:
            if ready:
                if self.failed is not None:
                    log.info("watchdog: the server is ready again after the %s failure", self.failed)
                self.failed, self.down_since = None, None
            elif self.ready and self.down_since is None:
                self.down_since = time.monotonic()
            self.ready = ready

    def fail(self, part: str, pid: int) -> None:
        """A part died: count it and restart the whole server (serve.sh starts it again). A stub
        that ended itself for a death inside it (WITHIN) names that in `failed` first."""
        if part in WITHIN and failed_part(str(self.run_dir)) == WITHIN[part]:
            part = WITHIN[part]
        with self._lock:
            self.failures[part] = self.failures.get(part, 0) + 1
            self.failed, self.ready = part, False
            if self.down_since is None:
                self.down_since = time.monotonic()
        what = "tritonserver" if part == "tritonserver" else f"the {part} process" if " " in part else \
            f"the {part} model's process"
        log.error("watchdog: %s (pid %d) died: every live stream ends now and the server restarts", what, pid)
        if part not in UNNAMED:
            self.tell(part)
        if self._pid is not None and part != "tritonserver":
            try:
                os.killpg(self._pid, signal.SIGKILL)
            except OSError:
                pass
        self._stubs = {}

    def tell(self, part: str) -> None:
        """Let the llm end its streams with an error naming the part, and the vocoder send on those
        of the `tts` ensemble (velocity.serving.lifecycle.drain), for at most TELL_S; a dead llm tells no
        one, and without one no `told` comes."""
        (self.run_dir / "failed.tmp").write_text(part)
        (self.run_dir / "failed.tmp").replace(self.run_dir / "failed")
        end = time.monotonic() + TELL_S
        while time.monotonic() < end and not all_told(self.run_dir):    # the llm's, then the vocoder's
            time.sleep(0.05)

    def status(self, what: str) -> tuple[bool, str]:
        """(healthy, why) for "ready" or "live", from the last look."""
        with self._lock:
            if what == "live":
                if self.down_since is not None and time.monotonic() - self.down_since > self.live_grace_s:
                    return False, (f"not ready for {time.monotonic() - self.down_since:.0f} s"
                                   + (f" since the {self.failed} failure" if self.failed else "")
                                   + ": the server cannot come back")
                return True, "live"
            if self.failed is not None:
                return False, f"the {self.failed} {DIED}: the server is restarting"
            return self.ready, "ready" if self.ready else "triton is not ready"

    def metrics(self) -> str:
        """Prometheus text: failures by part, and readiness."""
        with self._lock:
            lines = ["# HELP velocity_part_failures_total Parts of the server that died (each restarts the server)",
                     "# TYPE velocity_part_failures_total counter"]
            lines += [f'velocity_part_failures_total{{part="{p}"}} {n}' for p, n in sorted(self.failures.items())]
            lines += ["# HELP velocity_server_ready Whether the server is ready (1) or not (0)",
                      "# TYPE velocity_server_ready gauge", f"velocity_server_ready {int(self.ready)}"]
        return "\n".join(lines) + "\n"
