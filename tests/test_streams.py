"""velocity.serving.stream's Streams without a server: which thread asks whether a client left."""
from __future__ import annotations

import threading
import time
from collections import defaultdict

from velocity import AsyncLLMEngine
from checkpoints import tiny_checkpoint
from velocity.serving.settings import Settings
from velocity.serving.stream_host import Streams
from velocity.tts.pipeline import chattts_params


class Meter:
    """Stands in for the llm's Triton metrics, which exist only inside a python stub."""

    def increment(self, n) -> None: ...
    def set(self, v) -> None: ...
    def observe(self, v) -> None: ...
    def __getitem__(self, key) -> "Meter": return self


def test_only_the_monitor_asks_whether_a_client_left_and_a_leaver_is_stopped(tmp_path):
    """Triton's is_cancelled() is a round trip to the server process: asked at every output on
    the engine thread, it held up every step (the engine's step was 8.4 ms a frame inside the server at
    32 streams on an H200, 5.4 outside it). The monitor thread asks instead, and a client that
    leaves still has its stream stopped and ended."""
    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    s = Settings(weights=str(ck), device="cpu")
    engine = AsyncLLMEngine(s.engine_config())
    sent, ended = [], threading.Event()

    def send(sender, outputs, final: bool) -> None:
        sent.append(outputs is not None)
        if final:
            ended.set()

    asked, leave = [], threading.Event()

    def cancelled() -> bool:
        asked.append(threading.current_thread().name)
        return leave.is_set()

    streams = Streams(engine, s, defaultdict(Meter), send)
    try:
        params = chattts_params(seed=0, max_new_tokens=5000)
        params.ignore_eos = True                      # runs until its client leaves
        streams.start(None, cancelled, [list(range(5, 45))], None, params, hidden=False)
        t0 = time.monotonic()
        while not (any(sent) and len(asked) >= 3) and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        assert any(sent), "no chunk came out"
        assert set(asked) == {"llm-monitor"}, set(asked)
        leave.set()
        t1 = time.monotonic()
        assert ended.wait(5), "the stream did not end after its client left"
        assert time.monotonic() - t1 < 1.0
        while engine.engine.stats().running and time.monotonic() - t1 < 5:
            time.sleep(0.01)
        assert engine.engine.stats().running == 0 and not streams.live
    finally:
        streams.close()


def test_many_quiet_streams_spread_their_probes_within_the_rate(tmp_path):
    """Each probe is a request through Triton's ensemble: 256 quiet streams probing every 0.25 s
    crowded the server (docs/benchmarks.md, "A burst of cancels"). So all streams' probes together
    keep to VELOCITY_CANCEL_PROBES_PER_SECOND, and every quiet stream still probes. Here 40
    streams that the vocoder never answers (nothing is decoded: each pauses at its backlog and is
    quiet), each asked to probe every 0.05 s, at most 100 probes a second in all."""
    from velocity.serving.protocol import STREAM_PROBE
    from velocity.serving.stream_board import StreamBoard

    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    s = Settings(weights=str(ck), device="cpu", cancel_probe_seconds=0.05, cancel_probes_per_second=100.0,
                 max_num_seqs=40)
    engine = AsyncLLMEngine(s.engine_config())
    probes: list[tuple[float, int]] = []              # (when, the stream's board reference)

    def send(sender, outputs, final: bool) -> None:
        if outputs is not None and int(outputs["CHUNK_INDEX"].ravel()[0]) == STREAM_PROBE:
            probes.append((time.monotonic(), int(outputs["STREAM"].ravel()[0])))

    board = StreamBoard(tmp_path / "streams")
    streams = Streams(engine, s, defaultdict(Meter), send, board=board)
    try:
        params = chattts_params(seed=0, max_new_tokens=5000)
        params.ignore_eos = True
        for i in range(40):
            streams.start(None, lambda: False, [list(range(5, 45))], None, params, hidden=False, in_ensemble=True)
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
