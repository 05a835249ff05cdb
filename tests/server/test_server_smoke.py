"""A real tritonserver (the pytriton wheel's, via scripts/serve.sh) with a small decoupled model."""
from __future__ import annotations

import glob
import json
import queue
import signal
import subprocess
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from triton_server import TESTS_REPO, TritonServer, alive, comm, shm_pattern, side_by_side, wait_for

pytestmark = pytest.mark.server


def stream(client: grpcclient.InferenceServerClient, count: int) -> list:
    """Send one COUNT request on a gRPC stream; return every result/error up to the final one."""
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    inp = grpcclient.InferInput("COUNT", [1], "INT32")
    inp.set_data_from_numpy(np.array([count], dtype=np.int32))
    client.async_stream_infer("smoke_stream", [inp], request_id="r", enable_empty_final_response=True)
    out = []
    while True:
        result, error = got.get(timeout=60)
        out.append((result, error))
        if error is not None:
            break
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    return out


def test_grpc_stream_in_order_then_final(grpc_client):
    out = stream(grpc_client, 7)
    assert all(e is None for _, e in out)
    *chunks, final = out
    assert [int(r.as_numpy("INDEX")[0]) for r, _ in chunks] == list(range(7))
    assert final[0].as_numpy("INDEX") is None  # the empty final response
    torch_info = chunks[0][0].as_numpy("TORCH")[0].decode()
    assert "velocity" in torch_info  # the stub imported the venv's packages


def test_bad_input_gets_error_and_server_goes_on(grpc_client):
    out = stream(grpc_client, -3)
    assert out[-1][1] is not None
    assert "COUNT must be in [0, 1000], got -3" in str(out[-1][1])
    good = stream(grpc_client, 2)
    assert [int(r.as_numpy("INDEX")[0]) for r, _ in good[:-1]] == [0, 1]


def test_http_generate_stream(smoke_server):
    req = urllib.request.Request(
        f"http://{smoke_server.http_url}/v2/models/smoke_stream/generate_stream",
        data=json.dumps({"COUNT": [4]}).encode(), headers={"Content-Type": "application/json", **smoke_server.http_headers})
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [json.loads(line[len(b"data: "):]) for line in r.read().splitlines()
                  if line.startswith(b"data: ")]
    assert [e["INDEX"] for e in events] == [0, 1, 2, 3]


def test_serve_sh_stop_leaves_nothing(tmp_path):
    """SIGTERM to one serve.sh, Ctrl-C's SIGINT to another, Ctrl-C twice to a third (no drain,
    the group killed: the tests' stop where its grace is not checked), and a fourth whose
    EXIT_WITH_PID process ends (what a test runner that dies does to the servers it started), side
    by side (each start is mostly loading): each stops its server and every stub, with its exit
    code, and its shared memory is gone."""
    runner = subprocess.Popen(["sleep", "600"])
    cases = [(signal.SIGTERM, 143), (signal.SIGINT, 130), ("twice", 130), ("EXIT_WITH_PID", 143)]
    servers = [TritonServer(repo=TESTS_REPO, log_path=tmp_path / f"server{i}.log",
                            env={"EXIT_WITH_PID": str(runner.pid)} if how == "EXIT_WITH_PID" else {})
               for i, (how, _) in enumerate(cases)]
    try:
        side_by_side(TritonServer.start, servers)
        pids = [s.processes() for s in servers]
        for p in pids:
            names = {comm(x) for x in p}
            assert {"tritonserver", "triton_python_backend_stub"} <= names, names
        for s, (how, _) in zip(servers, cases):
            if how == "EXIT_WITH_PID":
                runner.kill()
                runner.wait()
            elif how == "twice":
                s.interrupt_twice()
            else:
                s.proc.send_signal(how)
        rcs = [s.proc.wait(timeout=60) for s in servers]
        time.sleep(1.0)                                 # the watcher's last sleep (0.5 s) ends too
        left = [[(x, comm(x)) for x in p if alive(x)] for p in pids]
    finally:
        runner.kill()
        side_by_side(TritonServer.stop, servers)
    for s, (how, code), rc, lost in zip(servers, cases, rcs, left):
        name = getattr(how, "name", how)
        assert rc == code, (name, s.log())
        assert lost == [], f"left running after {name}: {lost}\n{s.log()}"
        assert glob.glob(shm_pattern(s)) == []
    assert "[serve] second Ctrl-C: not waiting for the" in servers[2].log()
    assert "(EXIT_WITH_PID) has ended: stopping" in servers[3].log()


def test_threads_at_the_same_metrics_leave_the_server_up(smoke_server):
    """The python backend's metrics are not thread-safe (each operation rewrites
    the metric's shared memory while the server may still read the last one); the llm and the
    vocoder update theirs from several threads, and under a burst of cancels tritonserver died
    in Metric::LoadFromSharedMemory (benchmarks/bench_cancel_burst.py). velocity.serving.metrics
    holds one lock over every publish, and counts in the process meanwhile: four threads at the
    same metrics, a timer publishing them every 10 ms, and the server lives with every count."""
    import tritonclient.http as httpclient

    from velocity.serving.wire.input_table import array_inputs
    with httpclient.InferenceServerClient(smoke_server.http_url) as c:
        for _ in range(3):
            res = c.infer("metrics_threads", array_inputs(httpclient, {"OPS": np.array([2000], dtype=np.int32)}),
                          headers=smoke_server.http_headers)
            assert int(res.as_numpy("DONE")[0]) == 4 * 2000
    want = 'velocity_vocoder_dropped_chunks_total{model="metrics_threads"} 24000'
    assert wait_for(lambda: want in smoke_server.metrics(), 5) and smoke_server.ready(), smoke_server.metrics()
