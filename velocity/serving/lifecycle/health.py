"""The readiness endpoint a load balancer should probe: Triton's, but not ready while draining.

Triton 2.51's own /v2/health/ready stays 200 while serve.sh drains (the models refuse new
requests then, and no python model can mark itself not ready), so a balancer keeps sending
traffic to a server that refuses it. scripts/serve.sh runs this next to Triton (HEALTH_PORT,
default 8003):

    GET /v2/health/ready   200 when Triton is ready, no part has died since, and no drain is
                           under way; else 503 with the reason
    GET /v2/health/live    200 unless the server has not been ready for --live-grace seconds
                           (one that cannot come back); without --run-dir, Triton's liveness
    GET /metrics           velocity_part_failures_total{part} and velocity_server_ready

    python -m velocity.serving.lifecycle.health --port 8003 --triton http://127.0.0.1:8000 --run-dir DIR

With --run-dir it also runs the watchdog (velocity.serving.lifecycle.watchdog): a model's process or
Triton that dies is seen within a fraction of a second, and the server is restarted.

Standard library only: it runs with any python3, in the venv or in the Docker image.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from velocity.serving.lifecycle.watchdog import Watchdog

log = logging.getLogger("velocity.health")
PATHS = {"/v2/health/ready": "ready", "/ready": "ready", "/v2/health/live": "live", "/live": "live",
         "/metrics": "metrics"}


def triton_says(triton: str, what: str) -> bool:
    try:
        with urllib.request.urlopen(f"{triton}/v2/health/{what}", timeout=2) as r:
            return r.status == 200
    except OSError:                       # urllib's HTTPError (a 503) is one too
        return False


def status(triton: str, run_dir: Path | None, what: str, watchdog: Watchdog | None = None) -> tuple[bool, str]:
    """(healthy, why) for "ready" or "live"."""
    if what == "ready" and run_dir is not None and (run_dir / "stopping").exists():
        return False, "draining: this server is stopping and refuses new requests"
    if watchdog is not None:
        return watchdog.status(what)
    if not triton_says(triton, what):
        return False, f"triton is not {what}"
    return True, what


def make_handler(triton: str, run_dir: Path | None, watchdog: Watchdog | None = None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:                     # noqa: N802 (http.server's name)
            what = PATHS.get(self.path.split("?")[0])
            if what is None:
                self.send_error(404, f"try {', '.join(PATHS)}")
                return
            if what == "metrics":
                ok, kind = True, "text/plain; version=0.0.4"
                body = (watchdog.metrics() if watchdog else "").encode()
            else:
                ok, why = status(triton, run_dir, what, watchdog)
                kind, body = "application/json", json.dumps({what: ok, "reason": why}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):   # a balancer's probe that hung up once it had the status
                pass

        def log_message(self, *args) -> None:         # probes every few seconds: keep the log quiet
            pass

    return Handler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=8003)
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--triton", default="http://127.0.0.1:8000", help="Triton's HTTP endpoint")
    ap.add_argument("--run-dir", default="", help="serve.sh's run folder (it writes `stopping` there)")
    ap.add_argument("--live-grace", type=float, default=300.0,
                    help="seconds not ready (after having been ready) before liveness fails")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[health] %(levelname)s %(message)s")
    triton, run_dir = args.triton.rstrip("/"), Path(args.run_dir) if args.run_dir else None
    watchdog = None
    if run_dir is not None:
        watchdog = Watchdog(run_dir, lambda: triton_says(triton, "ready"), args.live_grace)
        watchdog.start()
    server = ThreadingHTTPServer((args.bind, args.port), make_handler(triton, run_dir, watchdog))
    server.daemon_threads = True
    parent = os.getppid()

    def orphaned() -> None:               # serve.sh gone (even by SIGKILL): go too, free the port
        while os.getppid() == parent:
            time.sleep(1)
        server.shutdown()

    threading.Thread(target=orphaned, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
