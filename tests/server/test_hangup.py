"""A client that leaves costs nothing: for each way a Triton client leaves a `tts` (or `llm`)
stream, the server's work on it stops within 2 s (no request active, no KV block used, the
frames counter and the vocoder still), and the llm counts the abort by its reason. The gateway's
and Wyoming's ways are in their own tests (test_gateway.py, test_wyoming.py).

Triton 2.51 does not tell the running llm of a cancel through the ensemble: the vocoder sees it
on the stream's next chunk or probe and tells the llm (velocity.serving.boards.stream_board)."""
from __future__ import annotations

import asyncio
import queue
import signal
import subprocess
import sys
import time

import pytest
import tritonclient.grpc as grpcclient

from client.triton import ServerError, make_inputs, stream_grpc
from benchmarks.server import default_sigint
from triton_server import ROOT, assert_same_pcm, assert_work_stops, llm_inputs, long_text, settle, wait_for
from velocity.tts.chunking import FRAMES_PER_SECOND

pytestmark = pytest.mark.server
# long enough that what generates before a client can leave (its first chunk, the sentences ahead,
# the cancel's notice) stays well under half of the whole, on a quick machine too
LONG = {"TEXT": long_text(16), "SEED": 4}


def aborted(server, reason: str) -> float:
    return server.metric(f'velocity_aborted_requests_total{{model="llm",reason="{reason}"}}')


def frames(server) -> float:
    return server.metric("velocity_frames_generated_total")


@pytest.fixture(scope="module")
def full_frames(tts_server) -> float:
    """The frames of the whole LONG request when nobody leaves: what each hang-up below must cut
    well short of, so that its idle server proves a stop, not an end (however fast the machine)."""
    assert wait_for(lambda: tts_server.metric("velocity_active_requests") == 0, 60)
    f0 = frames(tts_server)
    audio = sum(len(a) for _, a in stream_grpc(tts_server.grpc_url, LONG, timeout=120))
    assert audio / 24000 > 10, audio / 24000
    return frames(tts_server) - f0


@pytest.fixture
def server(tts_server, full_frames):
    """The shared server, idle; after the test, the frames its request made are under half the
    whole request's (checked at teardown)."""
    settle(tts_server)
    f0 = frames(tts_server)
    yield tts_server
    made = frames(tts_server) - f0
    assert made < full_frames / 2, f"{made} frames made after the client left early; the whole request makes {full_frames}"


def test_the_long_request_runs_to_its_end_when_nobody_leaves(full_frames):
    """What the hang-up tests stop: more than 10 s of audio (FRAMES_PER_SECOND frames a second)."""
    assert full_frames > 10 * FRAMES_PER_SECOND, full_frames


def test_stop_stream_with_cancel_stops_the_work(server):
    before = aborted(server, "cancelled")
    g = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    g.start_stream(callback=lambda result, error: got.put((result, error)))
    g.async_stream_infer("tts", make_inputs(grpcclient, LONG), enable_empty_final_response=True)
    result, error = got.get(timeout=120)
    assert error is None and result.as_numpy("WAVEFORM").size
    g.stop_stream(cancel_requests=True)
    left = time.monotonic()
    g.close()
    assert_work_stops(server, left)
    assert aborted(server, "cancelled") == before + 1


def test_a_client_that_leaves_during_voice_carry_over_stops_the_work(server):
    """VOICE_CARRY_OVER: no audio goes out while the first sentence is generated alone and its
    voice sample made (off the engine's thread); a cancel then still stops the work (the
    fixture: well under half the request's frames)."""
    g = grpcclient.InferenceServerClient(server.grpc_url)
    g.start_stream(callback=lambda result, error: None)
    g.async_stream_infer("tts", make_inputs(grpcclient, {**LONG, "VOICE_CARRY_OVER": True}),
                         enable_empty_final_response=True)
    assert wait_for(lambda: server.metric("velocity_running_sequences") >= 1, 60)
    g.stop_stream(cancel_requests=True)
    left = time.monotonic()
    g.close()
    assert_work_stops(server, left)


def test_the_aio_streams_cancel_stops_the_work(server):
    import tritonclient.grpc.aio as aio

    async def leave_after_first_chunk() -> float:
        c = aio.InferenceServerClient(server.grpc_url)

        async def requests():
            yield {"model_name": "tts", "inputs": make_inputs(aio, LONG), "enable_empty_final_response": True}
        stream = c.stream_infer(requests())
        async for result, error in stream:
            assert error is None and result.as_numpy("WAVEFORM").size
            break
        stream.cancel()
        left = time.monotonic()
        await c.close()
        return left

    assert_work_stops(server, asyncio.run(leave_after_first_chunk()))


def test_a_killed_client_process_stops_the_work(server):
    """No cancel at all: the process dies and its connection drops."""
    p = subprocess.Popen([sys.executable, "-c", HANG_UP, server.grpc_url], stdout=subprocess.PIPE, text=True,
                         cwd=str(ROOT))
    try:
        assert p.stdout.readline().strip() == "first"
    finally:
        p.kill()
        p.wait()
    assert_work_stops(server, time.monotonic())


HANG_UP = f"""
import sys, time
from client.triton import stream_grpc
for _ in stream_grpc(sys.argv[1], {LONG!r}, timeout=120):
    print("first", flush=True)
    time.sleep(600)
"""


def test_ctrl_c_in_the_client_cli_stops_the_work(server, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "client.tts_client", LONG["TEXT"], "-o", str(tmp_path / "x.wav"),
                          "--url", server.grpc_url, "--seed", "4"], cwd=str(ROOT), stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_sigint)          # Ctrl-C works even under `make test &`
    try:
        assert wait_for(lambda: (tmp_path / "x.wav").exists() and (tmp_path / "x.wav").stat().st_size > 44, 120)
        p.send_signal(signal.SIGINT)
        left = time.monotonic()
        assert p.wait(timeout=30) == 130
    finally:
        p.kill()
    assert "interrupted: the request is cancelled" in p.stderr.read()
    assert_work_stops(server, left)


def test_a_closed_pipe_after_the_client_cli_stops_the_work(server):
    """velocity-tts-client -o - | (read the header and a little audio, then exit)."""
    reader = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read(2000)"],
                              stdin=subprocess.PIPE)
    p = subprocess.Popen([sys.executable, "-m", "client.tts_client", LONG["TEXT"], "-o", "-", "--url", server.grpc_url,
                          "--seed", "4"], cwd=str(ROOT), stdout=reader.stdin, stderr=subprocess.PIPE, text=True)
    reader.stdin.close()
    try:
        assert reader.wait(timeout=120) == 0
        left = time.monotonic()
        assert p.wait(timeout=60) == 141
    finally:
        p.kill()
    assert "stdout was closed: the request is cancelled" in p.stderr.read()
    assert_work_stops(server, left, within=2.0 + 0.5)   # + the client noticing on its next chunk


def test_the_client_cli_streams_a_wav_to_stdout(server, tmp_path):
    """-o - writes a WAV stream (sizes unknown) that decodes to what -o FILE writes."""
    import io

    import soundfile as sf

    args = ["Hello there. Second sentence.", "--url", server.grpc_url, "--seed", "9", "--max-new-tokens", "40"]
    out = subprocess.run([sys.executable, "-m", "client.tts_client", *args, "-o", "-"], cwd=str(ROOT),
                         capture_output=True, timeout=120, check=True).stdout
    subprocess.run([sys.executable, "-m", "client.tts_client", *args, "-o", str(tmp_path / "f.wav")], cwd=str(ROOT),
                   capture_output=True, timeout=120, check=True)
    piped, rate = sf.read(io.BytesIO(out), dtype="int16")
    written, _ = sf.read(tmp_path / "f.wav", dtype="int16")
    assert rate == 24000
    assert_same_pcm(piped.tobytes(), written.tobytes())      # two requests: the vocoder's float rounding


def test_a_request_timeout_ends_the_stream_with_an_error_and_frees_it(server):
    """Triton's request timeout over gRPC (tritonclient's `timeout`, velocity-tts-client
    --timeout): past it the llm ends the stream, the client gets the error, nothing is left."""
    before = aborted(server, "deadline")
    t0 = time.monotonic()
    # a tenth of a second: well short of the whole request (the fixture's check) on a machine
    # that generates it in 0.7 s too
    with pytest.raises(ServerError, match="deadline exceeded"):
        for _ in stream_grpc(server.grpc_url, LONG, timeout=120, deadline=0.1):
            pass
    assert time.monotonic() - t0 < 0.1 + 1.5
    assert_work_stops(server, t0 + 0.1)
    assert aborted(server, "deadline") == before + 1


def test_cancelling_a_direct_llm_stream_stops_the_work(server):
    """A stream straight to the llm (no vocoder after it) is cancelled as Triton documents:
    is_cancelled() in the llm itself."""
    g = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    g.start_stream(callback=lambda result, error: got.put((result, error)))
    g.async_stream_infer("llm", llm_inputs(server.grpc_url, {"TEXT": "A long one. " * 8, "MAX_NEW_TOKENS": 200}),
                         enable_empty_final_response=True)
    first, err = got.get(timeout=120)
    assert err is None and first.as_numpy("CODES") is not None
    assert first.as_numpy("STREAM").reshape(-1)[0] == 0          # a direct caller has no board slot
    g.stop_stream(cancel_requests=True)
    assert_work_stops(server, time.monotonic())
