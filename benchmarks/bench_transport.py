#!/usr/bin/env python
"""The llm stub <-> engine core transport: what one message costs each way, by transport.

    .venv/bin/python benchmarks/bench_transport.py --rounds 3

The engine core (velocity.serving.llm.engine_core) sends the stub one message a step: the step's
counts and the chunks that became ready (each the frames' codes [4, T] and, on the Decoder path,
their hidden states [T, 768] float32: 0.65 MB for T = 212); the stub sends commands back (new
requests, stops, progress). Each transport here carries the same messages between two processes
in ping-pong (a step's message out, a small command message back), in paired rounds:

- `channel`: what the core uses (velocity.serving.llm.engine_core.wire.Channel): a socketpair, pickle
  protocol 5 with the large arrays' bytes out of band, written with one sendmsg and read into
  buffers of their own, from the heap (heap_for_large_buffers);
- `pipe`: a socketpair as multiprocessing.connection.Connection, pickle protocol 5 in one buffer;
- `zmq`: pyzmq PAIR sockets over ipc://, pickle protocol 5 with the arrays' buffers as frames of
  their own (out of band, no copy into the pickle), as vLLM's engine core does with msgspec;
- `zmq-inband`: the same sockets, one pickle buffer.

Per transport and message: microseconds per round trip, and the CPU seconds both processes spent.
"""
from __future__ import annotations

import argparse
import logging
import os
import pickle
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, by_arm, finish, hardware, paired_rounds, save  # noqa: E402

log = logging.getLogger("bench_transport")
ARMS = ("channel", "pipe", "zmq", "zmq-inband")


def message(chunks: int, streams: int) -> dict:
    """A step's message: counts for `streams` streams' steps, and `chunks` ready chunks (the core's
    CodeChunk: frames of codes as tuples, the hidden rows one array)."""
    from velocity.tts.chunking import CodeChunk

    rng = np.random.default_rng(0)
    return {"steps": 1, "frames": streams, "stats": list(range(8)),
            "events": [("chunk", k, CodeChunk(3, [tuple(f) for f in rng.integers(0, 625, (212, 4)).tolist()], 52, 144,
                                              rng.standard_normal((212, 768), dtype=np.float32)))
                       for k in range(chunks)]}


COMMANDS = {"progress": [(k, 100 + k) for k in range(64)]}


class Pipe:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def send(self, obj) -> None:
        self.conn.send_bytes(pickle.dumps(obj, protocol=5))

    def recv(self):
        return pickle.loads(self.conn.recv_bytes())


class Zmq:
    def __init__(self, address: str, bind: bool, oob: bool) -> None:
        import zmq
        self.sock = zmq.Context.instance().socket(zmq.PAIR)
        (self.sock.bind if bind else self.sock.connect)(address)
        self.oob = oob

    def send(self, obj) -> None:
        if not self.oob:
            self.sock.send(pickle.dumps(obj, protocol=5), copy=False)
            return
        buffers: list = []
        head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        self.sock.send_multipart([head, *buffers], copy=False)

    def recv(self):
        frames = self.sock.recv_multipart(copy=False)
        return pickle.loads(frames[0].buffer, buffers=[f.buffer for f in frames[1:]])


def endpoint(arm: str, conn: Connection | None, address: str, server: bool):
    if arm == "channel":
        import socket

        from velocity.serving.llm.engine_core.wire import Channel
        return Channel(socket.socket(fileno=os.dup(conn.fileno())))
    return Pipe(conn) if arm == "pipe" else Zmq(address, server, oob=arm == "zmq")


def stub_side(arm: str, conn: Connection | None, address: str, n: int) -> None:
    """The stub's end, in a process of its own (spawned, as the core is): answers each step."""
    if arm == "channel":                          # as the llm stub sets it up (CoreClient)
        from velocity.serving.llm.engine_core.wire import heap_for_large_buffers
        heap_for_large_buffers()
    end = endpoint(arm, conn, address, server=False)
    for _ in range(n + 1):
        end.recv()
        end.send(COMMANDS)


def run(arm: str, chunks: int, streams: int, n: int) -> dict:
    """n round trips of (a step's message, a command message back): us each, CPU seconds."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()                     # a socketpair on Linux, as the core's
    address = f"ipc://{tempfile.mkdtemp()}/core.sock"
    msg = message(chunks, streams)
    child = ctx.Process(target=stub_side, args=(arm, theirs if arm in ("pipe", "channel") else None, address, n))
    child.start()
    end = endpoint(arm, ours, address, server=True)
    end.send(msg)                                 # the first one connects and warms up
    end.recv()
    cpu0 = time.process_time()
    with open(f"/proc/{child.pid}/stat") as f:
        c0 = sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])
    t = time.perf_counter()
    for _ in range(n):
        end.send(msg)
        end.recv()
    wall = time.perf_counter() - t
    with open(f"/proc/{child.pid}/stat") as f:
        c1 = sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])
    cpu = time.process_time() - cpu0 + (c1 - c0) / os.sysconf("SC_CLK_TCK")
    child.join()
    return {"us_per_round_trip": 1e6 * wall / n, "cpu_us_per_round_trip": 1e6 * cpu / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "transport" / "transport"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cases = {"a step, no chunk": (0, 256, 4000), "a step, 1 chunk": (1, 256, 1000), "a step, 8 chunks": (8, 256, 300)}
    res = {"hardware": hardware(), "cases": {}}
    for name, (chunks, streams, n) in cases.items():
        rounds = paired_rounds(ARMS, args.rounds, lambda arm: run(arm, chunks, streams, n))
        res["cases"][name] = {arm: {k: statistics.median(x[k] for x in xs) for k in xs[0]}
                              for arm, xs in by_arm(rounds).items()}
        log.info("%s: %s", name, ", ".join(f"{arm} {v['us_per_round_trip']:.0f} us (CPU {v['cpu_us_per_round_trip']:.0f})"
                                         for arm, v in res["cases"][name].items()))
    log.info("wrote %s and its .png", save(res, Path(args.out), plot))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(res["cases"])
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(ARMS)
    for j, arm in enumerate(ARMS):
        xs = [i + (j - (len(ARMS) - 1) / 2) * width for i in range(len(cases))]
        ax.bar(xs, [res["cases"][c][arm]["us_per_round_trip"] for c in cases], width, label=arm)
    ax.set_xticks(range(len(cases)), cases)
    ax.set(yscale="log", ylabel="us per round trip (a step out, commands back)",
           title="The llm stub <-> engine core transport")
    ax.legend()
    finish(fig, path, res)


if __name__ == "__main__":
    main()
