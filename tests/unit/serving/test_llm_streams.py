"""velocity.serving.llm.streams's Streams without a server, over a real engine core process: which
thread asks whether a client left, the probes' rate, and where the python backend is called."""
from __future__ import annotations

import threading
import time

from checkpoints import tiny_checkpoint
from velocity.serving.llm.llm_inputs import LLMInputs, LLMRequest
from velocity.serving.metrics import LLM, make_metrics
from velocity.serving.settings import Settings
from velocity.serving.wire.protocol import chunk_outputs
from velocity.serving.llm.streams import Streams
from velocity.tts.pipeline import chattts_params


class Backend:
    """The python backend's metric classes as velocity.serving.metrics.make_metrics uses them
    (pb_utils.MetricFamily and its Metric, which exist only inside a python stub), each call
    recorded with the thread that made it: inside a stub each is a round trip to the server."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, float]] = []        # (thread, metric, operation, value)
        calls = self.calls

        class Metric:
            def __init__(self, name: str) -> None:
                self.name = name

            def increment(self, v) -> None: self.record("increment", v)
            def set(self, v) -> None: self.record("set", v)
            def observe(self, v) -> None: self.record("observe", v)

            def record(self, op: str, v: float) -> None:
                calls.append((threading.current_thread().name, self.name, op, v))

        class MetricFamily:
            COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"

            def __init__(self, name: str, description: str, kind: str) -> None:
                self.name = name

            def Metric(self, labels: dict, buckets=None) -> Metric:
                return Metric(self.name)

        self.MetricFamily = MetricFamily


def metrics():
    return make_metrics(Backend(), "llm", LLM)


def fail(sender, message: str, invalid: bool) -> None:
    raise AssertionError(f"a request was refused: {message}")


def request(sentences: list[list[int]], seed: int = 0, frames: int = 5000, hidden: bool = False) -> LLMInputs:
    """An llm request of these prompts that runs `frames` frames a sentence (the end code ignored)."""
    params = chattts_params(seed=seed, max_new_tokens=frames)
    params.ignore_eos = True
    return LLMInputs(sentences, None, params, [], hidden)


def test_only_the_monitor_asks_whether_a_client_left_and_a_leaver_is_stopped(tmp_path):
    """Triton's is_cancelled() is a round trip to the server process: asked at every output on
    the engine thread, it held up every step (the engine's step was 8.4 ms a frame inside the server at
    32 streams on an H200, 5.4 outside it). The monitor thread asks instead, and a client that
    leaves still has its stream stopped and ended."""
    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    s = Settings(weights=str(ck), device="cpu")
    sent, ended = [], threading.Event()

    def send(sender, outputs, final: bool) -> None:
        sent.append(outputs is not None)
        if final:
            ended.set()

    asked, leave = [], threading.Event()

    def cancelled() -> bool:
        asked.append(threading.current_thread().name)
        return leave.is_set()

    streams = Streams(s, metrics(), send, fail)
    try:
        streams.start(LLMRequest(request([list(range(5, 45))]), None, cancelled))      # runs until its client leaves
        t0 = time.monotonic()
        while not (any(sent) and len(asked) >= 3) and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        assert any(sent), "no chunk came out"
        assert set(asked) == {"llm-monitor"}, set(asked)
        leave.set()
        t1 = time.monotonic()
        assert ended.wait(5), "the stream did not end after its client left"
        assert time.monotonic() - t1 < 1.0
        while (streams.totals.running or streams.totals.kv_used) and time.monotonic() - t1 < 5:
            time.sleep(0.01)
        assert streams.totals.running == 0 and streams.totals.kv_used == 0 and not streams.live
    finally:
        streams.close()


def test_many_quiet_streams_spread_their_probes_within_the_rate(tmp_path):
    """Each probe is a request through Triton's ensemble: 256 quiet streams probing every 0.25 s
    crowded the server (docs/benchmarks.md, "A burst of cancels"). So all streams' probes together
    keep to VELOCITY_CANCEL_PROBES_PER_SECOND, and every quiet stream still probes. Here 40
    streams that the vocoder never answers (nothing is decoded: each pauses at its backlog and is
    quiet), each asked to probe every 0.05 s, at most 100 probes a second in all."""
    from velocity.serving.wire.protocol import STREAM_PROBE
    from velocity.serving.boards.stream_board import StreamBoard

    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    s = Settings(weights=str(ck), device="cpu", cancel_probe_seconds=0.05, cancel_probes_per_second=100.0,
                 max_num_seqs=40)
    probes: list[tuple[float, int]] = []              # (when, the stream's board reference)

    def send(sender, outputs, final: bool) -> None:
        if outputs is not None and int(outputs["CHUNK_INDEX"].ravel()[0]) == STREAM_PROBE:
            probes.append((time.monotonic(), int(outputs["STREAM"].ravel()[0])))

    board = StreamBoard(tmp_path / "streams")
    streams = Streams(s, metrics(), send, fail, board=board)
    try:
        for i in range(40):
            streams.start(LLMRequest(request([list(range(5, 45))]), None, lambda: False, in_ensemble=True))
        time.sleep(0.7)                               # every stream has paused or probed by now
        t0, n0 = time.monotonic(), len(probes)
        time.sleep(2.0)
        window = [ref for t, ref in probes[n0:] if t >= t0]
        rate = len(window) / (time.monotonic() - t0)
        # unbounded, 40 streams every 0.05 s would be 800 a second; the monitor's 20 ms tick and
        # the streams' own timing give the bound its slack
        assert rate <= 130, rate
        assert len(set(window)) == 40, f"{40 - len(set(window))} quiet streams sent no probe in 2 s"
    finally:
        streams.close()
        board.close_file(unlink=True)


def test_no_python_backend_call_on_the_step_path(tmp_path):
    """A python-backend call is a round trip to the server process, and
    the llm counted its frames at every output of every stream on the engine thread (a quarter of
    that thread's samples under 128 streams, py-spy). The engine now steps in a process of its own,
    which imports nothing of Triton's; in the stub the threads count in the process, and only the
    monitor's timer calls the metrics (the responses go out from the response thread), and the
    counts still arrive."""
    import subprocess
    import sys

    probe = ("import sys, velocity.serving.llm.engine_core.core, velocity.serving.llm.engine_core.__main__; "
             "print(sorted(m for m in sys.modules if 'triton' in m))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    s = Settings(weights=str(ck), device="cpu")
    backend, sends, finals = Backend(), [], []

    def send(sender, outputs, final: bool) -> None:
        sends.append(threading.current_thread().name)
        finals.append(final)

    streams = Streams(s, make_metrics(backend, "llm", LLM), send, fail)
    try:
        for i in range(4):
            streams.start(LLMRequest(request([list(range(5, 45)), list(range(5, 30))], i, 60, hidden=True), None,
                                     lambda: False))
        t0 = time.monotonic()
        while sum(finals) < 4 and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        assert sum(finals) == 4, "the streams did not end"
        time.sleep(0.6)                               # the monitor publishes 4 times a second
        assert set(sends) == {"llm-responses"}, set(sends)
        assert {t for t, *_ in backend.calls} == {"llm-monitor"}, {t for t, *_ in backend.calls}
        frames = sum(v for _, name, op, v in backend.calls if name == "velocity_frames_generated_total")
        steps = sum(v for _, name, op, v in backend.calls if name == "velocity_engine_steps_total")
        assert frames == 4 * 2 * 60 and steps > 60, (frames, steps)
        # of the steps' seconds, those in the engine's worker (the host's work around the model: the rest)
        step_s, worker_s = (sum(v for _, name, op, v in backend.calls if name == f"velocity_engine_{n}_seconds_total")
                            for n in ("step", "worker"))
        assert 0 < worker_s < step_s, (worker_s, step_s)
    finally:
        streams.close()


def test_overlapped_steps_send_the_chunks_of_plain_steps(tmp_path):
    """VELOCITY_OVERLAP_STEPS=on (a GPU's default), here on CPU: the core launches each step
    before the last one's outputs go to their streams. Every stream's responses are those of the
    plain loop, each stream ends, and the engine is left with nothing running and its KV free."""
    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)

    def responses(overlap: str) -> dict[int, list]:
        s = Settings(weights=str(ck), device="cpu", overlap_steps=overlap)
        got: dict[int, list] = {i: [] for i in range(4)}
        finals: list[int] = []

        def send(sender, outputs, final: bool) -> None:
            if outputs is not None:
                got[sender].append({k: v.tolist() for k, v in outputs.items()})
            if final:
                finals.append(sender)

        streams = Streams(s, metrics(), send, fail)
        try:
            for i in range(4):
                streams.start(LLMRequest(request([list(range(5, 45)), list(range(5, 30 + i))], i, 40 + 9 * i,
                                                 hidden=True), i, lambda: False))
            t0 = time.monotonic()
            while len(finals) < 4 and time.monotonic() - t0 < 60:
                time.sleep(0.02)
            assert sorted(finals) == [0, 1, 2, 3], "the streams did not each end once"
            while (streams.totals.running or streams.totals.kv_used) and time.monotonic() - t0 < 60:
                time.sleep(0.02)
            assert streams.totals.running == 0 and streams.totals.kv_used == 0 and not streams.live
        finally:
            streams.close()
        return got

    plain, apart = responses("off"), responses("on")
    assert all(len(r) >= 3 for r in plain.values()), {i: len(r) for i, r in plain.items()}
    assert apart == plain


def test_a_scheduling_fault_after_an_overlapped_collect_still_hands_out_its_outputs(tmp_path):
    """Overlapped, a step's outputs are collected before the next batch is scheduled: if that
    scheduling fails (a bug), the collected outputs still reach their streams beside every other
    request's abort, so that a request the collected step finished is not left hanging."""
    import gc
    import socket

    from velocity.serving.llm.engine_core.core import EngineCore
    from velocity.serving.llm.engine_core.wire import Channel

    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    a, b = socket.socketpair()
    core = EngineCore(Settings(weights=str(ck), device="cpu", overlap_steps="on", lend_vocoder_cores=False),
                      Channel(a), str(tmp_path / "board"))

    class Recorder:
        over = False

        def __init__(self) -> None:
            self.outs = []

        def on_output(self, i, out) -> None:
            self.outs.append(out)

    short, long = Recorder(), Recorder()
    for rid, rec, n in (("short", short, 3), ("long", long, 50)):
        core.owner[rid] = (rec, 0)
        p = chattts_params(seed=1, max_new_tokens=n)
        p.ignore_eos = True
        core.engine.add_request(rid, list(range(5, 20)), p)
    while not short.outs or not short.outs[-1].finished:
        assert core._step()
        if len(short.outs) == 2:                  # "short" ends in the batch now launched
            def broken():
                raise RuntimeError("a scheduling bug")
            core.engine.scheduler.schedule = broken
    assert short.outs[-1].finish_reason == "length" and len(short.outs[-1].token_ids) == 3
    assert long.outs[-1].finished and long.outs[-1].finish_reason == "abort"
    assert core.engine.block_manager.num_used_blocks == 0
    core.voicing.shutdown()
    a.close(), b.close()
    gc.unfreeze()                                 # the core froze what this test process had made


def test_held_outputs_cut_the_chunks_of_outputs_every_step(tmp_path, monkeypatch):
    """The engine core holds each request's outputs until they matter (LLMEngine.hold: the spoken
    sentence's until its next chunk can be cut, a sentence ahead's until it is spoken): the
    streams' chunks, hidden rows and ends are those of an output every step, in the same order
    and in the same steps, while the streams' Python runs on a small share of the steps. Over an
    in-process core, three-sentence requests (two sentences ahead), with hidden states."""
    import gc
    import socket

    import numpy as np

    from velocity.serving.llm.engine_core.core import EngineCore
    from velocity.serving.llm.engine_core.stream import CoreStream
    from velocity.serving.llm.engine_core.wire import Channel

    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    calls = {"n": 0}
    on_output = CoreStream.on_output

    def counted(self, i, out):
        calls["n"] += 1
        return on_output(self, i, out)

    monkeypatch.setattr(CoreStream, "on_output", counted)

    def run(held: bool) -> tuple[list, int, int]:
        a, b = socket.socketpair()
        s = Settings(weights=str(ck), device="cpu", lend_vocoder_cores=False, backlog_seconds=600,
                     chunk_rest=6, chunk_growth=1.0, chunk_largest=8, lookahead=4)   # small chunks: many cuts
        core = EngineCore(s, Channel(a), str(tmp_path / "board"))
        if not held:
            core.engine.hold = lambda rid, n: None        # an output every step, as before
        calls["n"], steps, events = 0, 0, []
        for k in range(3):
            core._start(k, k + 1, request([list(range(5, 45)), list(range(5, 30 + k)), list(range(7, 20))],
                                          k, 30 + 11 * k, hidden=True))
        while core.streams:
            assert core._step()
            steps += 1
            events += [(steps,) + (e[:2] + ({n: v.tolist() for n, v in chunk_outputs(e[2]).items()},) + e[3:]
                                   if e[0] == "chunk" else e) for e in core.report.events]
            core.report.events.clear()
        assert core.engine.block_manager.num_used_blocks == 0 and not core.engine.requests
        frames = core.engine.sampled["audio"]
        core.voicing.shutdown()
        a.close(), b.close()
        gc.unfreeze()                                 # the core froze what this test process had made
        return events, calls["n"], frames, steps

    every, every_calls, every_frames, every_steps = run(held=False)
    held, held_calls, held_frames, held_steps = run(held=True)
    chunks = [e for e in every if e[1] == "chunk"]
    assert len(chunks) >= 30 and all(np.asarray(e[3]["HIDDEN"]).shape[-1] > 1 for e in chunks)
    assert sum(1 for e in every if e[1] == "generated") == 3
    assert held == every and held_steps == every_steps
    assert held_frames == every_frames == sum(3 * (30 + 11 * k) for k in range(3))
    assert held_calls * 3 < every_calls, (held_calls, every_calls)

