"""Two replicas (serve.sh, tiny demo checkpoint) behind a gRPC-aware balancer (Debian's HAProxy,
benchmarks/replicas.py), on loopback: streams spread over both; SIGTERM to one under load drains it
(its live streams finish, new streams go to the other, no request fails); the restarted replica
takes streams again; the gateway, given both replicas, retries a request that a draining
replica refuses before its first chunk on the other one.

On two cores two replicas are no faster than one: this proves correctness, not speed-up
(benchmarks/bench_replicas.py measures the split).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from benchmarks.replicas import Balancer, Replica, stop_group, tts_requests, tts_served
from client.triton import ServerError, parse_metric, stream_grpc
from test_lifecycle import LONG, Listener
from triton_server import ROOT, TritonServer, free_port, listening, side_by_side, wait_for
from checkpoints import tiny_checkpoint

pytestmark = pytest.mark.server
# seconds: the gateway's four short requests need about 2 while r1 drains, over 7 in a loaded
# suite; a drain ends as soon as its streams do, so the bound costs nothing when they are quick
DRAIN = 20
SHORT = {"MAX_NEW_TOKENS": 40, "REPETITION_PENALTY": 1.0}


def replica(tmp_path: Path, ckpt: Path, name: str, like: TritonServer | None = None) -> TritonServer:
    """A serve.sh replica without a gateway (on `like`'s ports: a restart)."""
    ports = {} if like is None else {k: getattr(like, k) for k in ("http_port", "grpc_port", "metrics_port",
                                                                   "health_port")}
    return TritonServer(repo=ROOT / "model_repository", log_path=tmp_path / f"{name}.log", gateway_port=0,
                        env={"VELOCITY_WEIGHTS": str(ckpt), "DRAIN_TIMEOUT": str(DRAIN), "EXIT_TIMEOUT": "20",
                             "VELOCITY_KV_CACHE_BYTES": str(32 << 20)}, **ports)


def start_all(*servers: TritonServer) -> None:
    """Start the servers side by side (each start is mostly loading)."""
    side_by_side(lambda s: s.start(timeout=400), servers)


def load(url: str, n: int, concurrency: int, first_seed: int, retries: int = 2) -> list[str | None]:
    """n short streams through url, `concurrency` at a time: None for each that completed with
    audio, else its error."""
    def one(i: int) -> str | None:
        try:
            chunks = list(stream_grpc(url, {"TEXT": f"Stream number {i} of the load.", "SEED": i, **SHORT},
                                      timeout=300, retries=retries))
            return None if chunks and all(len(a) for _, a in chunks) else "no audio"
        except ServerError as e:
            return str(e)

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(first_seed, first_seed + n)))


def metrics_url(s: TritonServer) -> str:
    return f"http://localhost:{s.metrics_port}/metrics"


def test_two_replicas_behind_a_balancer(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=0, small_audio=True)
    r1, r2 = replica(tmp_path, ckpt, "r1"), replica(tmp_path, ckpt, "r2")
    lb = None
    gateway = None
    r1b = None
    try:
        start_all(r1, r2)
        lb = Balancer(free_port(), [Replica("127.0.0.1", s.grpc_port, s.health_port) for s in (r1, r2)],
                      log_path=tmp_path / "haproxy.log")
        def lb_log() -> str:
            return (tmp_path / "haproxy.log").read_text()

        assert wait_for(lambda: listening(lb.listen), 10), lb_log()
        time.sleep(1.0)                                   # both replicas pass their first checks

        # 1. streams spread over both replicas
        urls = [metrics_url(s) for s in (r1, r2)]
        before = [tts_requests(u) for u in urls]
        assert load(lb.url, 8, 4, first_seed=0, retries=0) == [None] * 8
        served = tts_served(urls, before, 8)
        assert sum(served) == 8 and min(served) >= 2, served

        # 2. SIGTERM to r1 under load: its live streams finish, the rest go to r2, nothing fails
        outcome: list = []
        loader = threading.Thread(target=lambda: outcome.extend(load(lb.url, 16, 3, first_seed=100)))
        on_r1, on_r2 = tts_requests(metrics_url(r1)), tts_requests(metrics_url(r2))
        loader.start()
        assert wait_for(lambda: parse_metric(r1.metrics(), "velocity_active_requests") >= 1, 120)
        r1.proc.send_signal(signal.SIGTERM)
        # once r1 drains it admits nothing new: its share is what it had served by then, and at
        # most the loader's 3 streams in flight
        assert wait_for(lambda: "[serve] draining" in r1.log(), 10), r1.log()[-3000:]
        r1_share = tts_requests(metrics_url(r1)) - on_r1 + 3
        loader.join(300)
        assert outcome == [None] * 16, outcome
        # the balancer saw the drain on r1's health port and sent new streams to r2
        assert "replicas/r0 is DOWN, reason: Layer7 wrong status, code: 503" in lb_log(), lb_log()
        assert r1.proc.wait(DRAIN + 60) == 143
        log = r1.log()
        assert "[serve] draining" in log and "[serve] drained" in log, log[-3000:]
        on_r2 = tts_served([metrics_url(r2)], [on_r2], 16 - r1_share)[0]
        assert on_r2 >= 16 - r1_share, (on_r2, r1_share, lb_log())      # all but r1's share
        r1.stop()

        # 3. the restarted replica takes streams again. A busy CI machine can fail one of r1's checks
        # before the stop (its health port asks Triton, with a 2 s timeout): an "is UP" of r0 may be
        # in the log already, so the one awaited is the next
        ups = lb_log().count("replicas/r0 is UP")
        r1b = replica(tmp_path, ckpt, "r1-restarted", like=r1)
        start_all(r1b)
        assert wait_for(lambda: lb_log().count("replicas/r0 is UP") > ups, 10), lb_log()   # two good checks
        again = tts_requests(metrics_url(r1b))
        assert load(lb.url, 8, 4, first_seed=200, retries=0) == [None] * 8
        assert tts_served([metrics_url(r1b)], [again], 2)[0] >= 2

        # 4. the gateway given both replicas: a request r1 refuses while draining goes to r2
        port = free_port()
        gateway = subprocess.Popen(
            [sys.executable, "-m", "velocity.gateway.app", "--triton",
             f"127.0.0.1:{r1b.grpc_port},127.0.0.1:{r2.grpc_port}", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT, stdout=open(tmp_path / "gateway.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        assert wait_for(lambda: listening(port), 60), (tmp_path / "gateway.log").read_text()
        import openai
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        held = Listener(r1b.grpc_url, {**LONG, "SEED": 7}, realtime=True)    # keeps r1 draining for DRAIN seconds
        held.start()
        assert held.first.wait(120) and held.outcome is None, held.outcome
        refused = parse_metric(r1b.metrics(), "velocity_refused_requests_total")
        r1b.proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: not r1b.health(port=r1b.health_port), 10)    # draining
        # the health port says 503 as soon as serve.sh starts stopping; the llm sees the drain at its
        # next poll (4 a second), and a request that comes before that is still served
        assert wait_for(lambda: "velocity.drain: draining" in r1b.log(), 10), r1b.log()[-3000:]
        for i in range(4):                                # round robin: two of them start on r1
            pcm = api.audio.speech.create(model="tts-1", voice="amber", input=f"Through the gateway, {i}.",
                                          response_format="pcm", extra_body={"seed": i, "max_new_tokens": 40}).read()
            assert len(pcm) > 0
        assert held.outcome is None, "the held stream ended before the gateway's requests were done"
        # (counted in the llm, published four times a second)
        assert wait_for(lambda: parse_metric(r1b.metrics(), "velocity_refused_requests_total") - refused >= 2, 2), \
            "r1 refused none of the gateway's requests: the retry was not exercised"
        assert "trying again on" in (tmp_path / "gateway.log").read_text()
        held.leave.set()                                  # done with it: r1 need not wait out its drain
        held.join(DRAIN + 60)
        assert held.outcome is not None
    finally:
        if gateway is not None:
            stop_group(gateway, 20)
        if lb is not None:
            lb.stop()
        side_by_side(lambda s: s.stop(at_once=True), [s for s in (r1, r2, r1b) if s is not None])
