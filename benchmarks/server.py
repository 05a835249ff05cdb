"""A serve.sh server on free ports in a session of its own: what the tests and the benchmarks
that start servers (bench_replicas) share. Also the small process and port helpers they use."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.soak import descendants
from client.triton import fetch_metrics, parse_metric

ROOT = Path(__file__).resolve().parents[1]


def default_sigint() -> None:
    """A shell started in the background (`make test &`) passes SIGINT on ignored, and bash cannot
    trap a signal ignored on entry, nor Python handle it: give a child the Ctrl-C a terminal would
    deliver (Popen's preexec_fn)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before in this process: the OS may return a port it
    just released again, and one server's HTTP and gRPC ports once came out equal."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def listening(port: int) -> bool:
    """Something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_status(url: str) -> int:
    """The HTTP status of GET url (0: nothing answered)."""
    import urllib.error
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll cond until it holds or timeout passes; its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def pgid(pid: int) -> int | None:
    """The process group of pid; None once it has ended (a listed process may end before it is asked)."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def comm(pid: int) -> str:
    """The program name of pid (argv[0]'s basename; /proc/pid/comm cuts at 15 characters)."""
    try:
        return Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()).name
    except (OSError, UnicodeDecodeError):
        return ""


class PortTaken(RuntimeError):
    """A port free_port() handed out was taken by another process before the server bound it."""


@dataclass
class TritonServer:
    """A running tritonserver started by scripts/serve.sh in a session of its own."""

    repo: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    gateway_port: int = field(default_factory=free_port)   # serve.sh starts one when the repository has `tts`
    via_make: bool = False            # start with `make serve` (ports by environment) instead of serve.sh
    root: Path = ROOT                 # whose serve.sh and packages: a baseline's tree (harness.baseline_tree)
    proc: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def start(self, timeout: float = 240.0, until: str = "ready") -> "TritonServer":
        """Start serve.sh; wait until /v2/health/{until} ("ready", or "live" for a server whose
        models may fail to load) and the metrics port listens. A server that fails to load a model
        is stopped at once when waiting for "ready" (RuntimeError with its log). A port taken
        between free_port() and Triton's bind (by another process, seconds later, once the models
        loaded) costs a start on fresh ports, at most twice."""
        for _ in range(2):
            try:
                return self._start(timeout, until)
            except PortTaken:
                for name in ("http_port", "grpc_port", "metrics_port", "health_port", "gateway_port"):
                    setattr(self, name, free_port())
        return self._start(timeout, until)

    def _start(self, timeout: float, until: str) -> "TritonServer":
        if os.environ.get("TESTS_WITHOUT_SERVERS") == "1":     # scripts/test.sh's second pytest
            raise RuntimeError("a test without the `server` mark starts a Triton server: mark it "
                               "(pytestmark = pytest.mark.server), so that scripts/test.sh runs it in the foreground")
        ports = {"HTTP_PORT": self.http_port, "GRPC_PORT": self.grpc_port, "METRICS_PORT": self.metrics_port,
                 "HEALTH_PORT": self.health_port, "GATEWAY_PORT": self.gateway_port}
        cmd = (["make", "-s", "serve"] if self.via_make else
               ["bash", str(self.root / "scripts" / "serve.sh"), "--model-repository", str(self.repo)]
               + [a for k, v in ports.items() for a in (f"--{k[:-5].lower()}-port", str(v))])
        # EXIT_WITH_PID: a runner that dies (a crashed pytest, a killed benchmark) takes its servers with it
        env = {**os.environ, "EXIT_TIMEOUT": "10", "DRAIN_TIMEOUT": "5", "EXIT_WITH_PID": str(os.getpid()),
               **{k: str(v) for k, v in ports.items()}, **self.env}
        if self.root != ROOT:         # another tree: its packages first on the path, this checkout's venv
            env |= {"PYTHONPATH": os.pathsep.join(filter(None, (str(self.root), env.get("PYTHONPATH")))),
                    "VENV": env.get("VENV", str(ROOT / ".venv"))}
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(self.root),
                                     env=env, start_new_session=True, preexec_fn=default_sigint)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "already in use" in self.log():          # Triton exits; serve.sh may start it again
                self.stop(at_once=True)
                self._log.close()
                raise PortTaken(f"a port of this server was taken before Triton bound it:\n{self.log()}")
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}:\n{self.log()}")
            # Triton starts its metrics service just after the HTTP one (tens of ms): a scrape
            # right after "ready" could be refused; and a port another process holds also listens
            if self.health(until) and self._metrics_answer():
                return self
            if until == "ready" and "failed to load all models" in self.log():    # up, but never ready
                self.stop()
                raise RuntimeError(f"tritonserver failed to load its models:\n{self.log()}")
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f}s:\n{self.log()}")

    def _metrics_answer(self) -> bool:
        try:
            return "nv_" in self.metrics()
        except OSError:
            return False

    def ready(self) -> bool:
        return self.health("ready")

    def health(self, what: str = "ready", port: int | None = None) -> bool:
        """Triton's /v2/health/{what}; on serve.sh's health port with port=s.health_port."""
        try:
            with urllib.request.urlopen(f"http://localhost:{port or self.http_port}/v2/health/{what}",
                                        timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-20000:]

    @property
    def run_dir(self) -> Path | None:
        """serve.sh's run folder (its log names the operator key's file there); None for a tree
        from before the key."""
        import re

        m = re.search(r"\[serve\] operator key: (\S+)", self.log_path.read_text(errors="replace"))
        return Path(m[1]).parent if m else None

    @property
    def triton_key(self) -> str:
        """The Triton key this serve.sh run shows (velocity.serving.wire.triton_key): its run folder's,
        or `local` (a tree from before the key)."""
        from velocity.serving.wire import triton_key
        return triton_key.load(run_dir=str(self.run_dir or ""))

    @property
    def grpc_headers(self) -> dict | None:
        """tritonclient's `headers=` for this server's gRPC port (None: it asks for no key)."""
        from velocity.serving.wire import triton_key
        return triton_key.grpc_headers(self.triton_key)

    @property
    def http_headers(self) -> dict:
        """The header Triton's HTTP port asks for (inference, always)."""
        from velocity.serving.wire import triton_key
        return triton_key.http_headers(self.triton_key)

    def metric(self, name: str) -> float:
        """One sample from the metrics port (see client.triton.parse_metric)."""
        return parse_metric(self.metrics(), name)

    def metrics(self) -> str:
        return fetch_metrics(f"http://localhost:{self.metrics_port}/metrics")

    def core_board(self) -> Path:
        """The llm's and vocoder's shared core board (velocity.serving.boards.core_board), keyed by
        the tritonserver process."""
        from velocity.serving.boards.core_board import find_boards
        found = [p for pid in self.processes() for p in find_boards(pid)]
        assert len(found) == 1, f"core boards of this server: {found}"
        return found[0]

    def part_pid(self, part: str) -> int:
        """The pid of a part of the running server: "tritonserver", one of a model's stubs (the
        watchdog's view of the server's process group), or "llm engine", the llm's engine core."""
        from velocity.serving.lifecycle.watchdog import group_stubs
        server = next(p for p in self.processes() if comm(p) == "tritonserver")
        if part == "tritonserver":
            return server
        if part == "llm engine":                   # the llm stub's engine core (velocity.serving.llm.engine_core)
            llm = self.part_pid("llm")
            found = [p for p in descendants(llm)
                     if b"velocity.serving.llm.engine_core" in Path(f"/proc/{p}/cmdline").read_bytes()]
            if not found:
                raise RuntimeError(f"no engine core under the llm's process {llm}")
            return found[0]
        found = sorted(p for p, model in group_stubs(server).items() if model == part)
        if not found:
            raise RuntimeError(f"no {part} process in tritonserver {server}'s process group")
        return found[0]

    def processes(self) -> list[int]:
        """serve.sh, the server and its stubs."""
        return [self.proc.pid, *descendants(self.proc.pid)] if self.proc else []

    def interrupt_twice(self) -> None:
        """Ctrl-C twice to serve.sh: the second skips the drain and kills the server's group."""
        self.proc.send_signal(signal.SIGINT)
        # the second counts once serve.sh's stop has begun: it logs one of these first
        wait_for(lambda: self.proc.poll() is not None or any(
            m in self.log() for m in ("[serve] draining", "[serve] stopping")), 10)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def stop(self, timeout: float = 60.0, at_once: bool = False) -> None:
        """SIGTERM serve.sh (which drains, then stops its process group), then make sure of it.
        at_once: interrupt_twice instead (no drain, no unload): for a stop whose grace nothing checks."""
        if self.proc is None:
            return
        pids = self.processes()
        if self.proc.poll() is None:
            if at_once:
                self.interrupt_twice()
            else:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        for pid in pids:  # anything left behind is a bug the tests report; clean it anyway
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        self._log.close()
        self.proc = None


def start_servers(stack, roots: dict[str, Path], logs: Path, env_of: Callable[[str], dict], **kw) -> dict[str, TritonServer]:
    """A started server (serve.sh) of each tree in roots (name -> tree, as harness.trees gives),
    with env_of(name) and TritonServer's other fields in kw, stopped when the stack closes; each
    logs to logs/<name>.log."""
    servers = {}
    for name, root in roots.items():
        s = TritonServer(root / "model_repository", logs / f"{name}.log", env_of(name), root=root, **kw)
        stack.callback(s.stop)
        servers[name] = s.start(timeout=400)
    return servers
