"""Several replicas behind one gRPC address: HAProxy (Debian's `haproxy`) as the L7 balancer.

A Kubernetes Service balances TCP connections, and one gRPC client keeps one HTTP/2 connection
for all its streams, so every stream of that client lands on one replica. An L7 balancer
balances each stream (HTTP/2 request) on its own. HAProxy is used here because it checks each
replica's health port (serve.sh's HEALTH_PORT: 503 while draining) and stops sending new streams
to a draining replica at once, as Kubernetes does with a failed readiness probe; open-source
nginx's `grpc_pass` has no active checks and would send new streams to a draining replica
until it exits.

    python -m benchmarks.replicas --listen 9001 --replica 127.0.0.1:8001/8003 --replica 10.0.0.2:8001/8003
        # serves the replicas' `tts` on :9001 (REPLICA = host:grpc_port/health_port)
    python -m benchmarks.replicas ... --print-config > haproxy.cfg
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from client.triton import fetch_metrics, model_metric


@dataclass(frozen=True, slots=True)
class Replica:
    """One server: where its gRPC port and its drain-aware health port are."""
    host: str
    grpc_port: int
    health_port: int

    @classmethod
    def parse(cls, text: str) -> "Replica":
        """host:grpc_port/health_port"""
        try:
            addr, health = text.rsplit("/", 1)
            host, grpc = addr.rsplit(":", 1)
            return cls(host, int(grpc), int(health))
        except ValueError as e:
            raise ValueError(f"a replica is host:grpc_port/health_port (e.g. 127.0.0.1:8001/8003), got {text!r}") from e


def haproxy_config(listen: int, replicas: list[Replica], bind: str = "127.0.0.1", check_ms: int = 300,
                   timeout_s: int = 600) -> str:
    """HAProxy configuration: gRPC (HTTP/2 without TLS) on bind:listen, each stream to the next
    healthy replica (round robin); a replica is out after one failed check of its health port
    (a 503 while draining, or no answer within 2 s: a busy replica answers slowly) and back
    after two good ones. timeout_s bounds a stream's silence (a long sentence's
    generation), not its length."""
    servers = "\n".join(f"    server r{i} {r.host}:{r.grpc_port} proto h2 check port {r.health_port} check-proto h1"
                        for i, r in enumerate(replicas))
    return f"""global
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client {timeout_s}s
    timeout server {timeout_s}s
    timeout check 2s

frontend grpc
    bind {bind}:{listen} proto h2
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /v2/health/ready
    http-check expect status 200
    default-server inter {check_ms}ms fall 1 rise 2
{servers}
"""


class Balancer:
    """A running haproxy (foreground, a session of its own) in front of `replicas`."""

    def __init__(self, listen: int, replicas: list[Replica], log_path: Path | None = None, **config) -> None:
        exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not os.access(exe, os.X_OK):
            raise RuntimeError("haproxy is not installed: apt-get install haproxy (Debian)")
        self.listen, self.replicas = listen, replicas
        self.dir = Path(tempfile.mkdtemp(prefix="velocity-haproxy-"))
        cfg = self.dir / "haproxy.cfg"
        cfg.write_text(haproxy_config(listen, replicas, **config))
        check = subprocess.run([exe, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused the configuration:\n{check.stdout}{check.stderr}")
        self.log = open(log_path or self.dir / "haproxy.log", "w")
        self.proc = subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    @property
    def url(self) -> str:
        return f"localhost:{self.listen}"

    def stop(self) -> None:
        stop_group(self.proc, 10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Balancer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the process group `proc` leads (started with start_new_session), then SIGKILL
    what is left after `timeout` seconds."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def tts_requests(metrics_url: str) -> float:
    """Requests a server's `tts` ensemble has answered successfully (Triton's
    nv_inference_request_success for model "tts"): a replica's share of the load."""
    return model_metric(fetch_metrics(metrics_url), "nv_inference_request_success", "tts")


def tts_served(metrics_urls: list[str], before: list[float], total: int, timeout: float = 10.0) -> list[float]:
    """Each server's `tts` requests since `before`, read once they add up to `total` (or after
    `timeout` seconds): Triton counts a request when it releases it, which can come just after
    the client has had its final response."""
    from benchmarks.server import wait_for

    def served() -> list[float]:
        return [tts_requests(u) - b for u, b in zip(metrics_urls, before)]

    wait_for(lambda: sum(served()) >= total, timeout)
    return served()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.replicas", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", type=int, default=9001, help="the balancer's gRPC port")
    ap.add_argument("--bind", default="127.0.0.1", help="the balancer's address (0.0.0.0: every interface)")
    ap.add_argument("--replica", action="append", required=True, metavar="HOST:GRPC/HEALTH",
                    help="a replica: host:grpc_port/health_port (repeat for each)")
    ap.add_argument("--check-ms", type=int, default=300, help="health check interval")
    ap.add_argument("--print-config", action="store_true", help="print the HAProxy configuration and exit")
    args = ap.parse_args(argv)
    try:
        replicas = [Replica.parse(r) for r in args.replica]
    except ValueError as e:
        ap.error(str(e))
    if args.print_config:
        print(haproxy_config(args.listen, replicas, args.bind, args.check_ms), end="")
        return 0
    with Balancer(args.listen, replicas, bind=args.bind, check_ms=args.check_ms) as lb:
        print(f"[replicas] gRPC on {args.bind}:{args.listen} -> {', '.join(args.replica)} (Ctrl-C stops)", flush=True)
        try:
            while lb.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        return lb.proc.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
