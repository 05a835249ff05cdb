"""The benchmarks' harness (benchmarks/harness.py), without a server: every benchmark saves its
figure through it, and what it writes names the hardware."""
from __future__ import annotations

import json
import os
import re

from triton_server import ROOT


def test_every_benchmark_saves_through_the_harness():
    """No benchmark writes a figure of its own: harness.finish names the hardware on each (its
    arms_plot and rounds_panels call it)."""
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(scripts) > 10
    for path in scripts:
        text = path.read_text()
        if path.name == "harness.py":
            continue
        assert "savefig(" not in text, f"{path.name} saves a figure itself: use benchmarks.harness.finish"
        if re.search(r"^def plot\(", text, re.M) or "plt.subplots" in text:
            assert any(f in text for f in ("finish(fig", "arms_plot(res", "rounds_panels(res")), path.name


def test_save_writes_json_with_the_hardware_and_a_png_that_names_it(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.harness import cpu_model, finish, median_ratio, save

    drawn = []

    def plot(res: dict, path):
        fig, ax = plt.subplots()
        ax.plot([1, 2], [res["x"], res["x"]])
        finish(fig, path, res)
        drawn.append([t.get_text() for t in fig.texts])
        plt.close(fig)

    out = save({"x": 3}, tmp_path / "sub" / "run", plot)
    res = json.loads(out.read_text())
    assert res["x"] == 3 and res["hardware"]["cpu"] == cpu_model() and res["hardware"]["cpus"] >= 1
    assert (tmp_path / "sub" / "run.png").stat().st_size > 1000
    assert drawn == [[cpu_model()]]
    from benchmarks.harness import where
    assert where({"hardware": "CPU, 2 cores, both replicas on it"}) == "CPU, 2 cores, both replicas on it"
    assert where({"hardware": {"device": "cuda", "device_name": "NVIDIA H100"}}) == "NVIDIA H100"
    rounds = [{"a": 2.0, "b": 1.0}, {"a": 9.0, "b": 3.0}, {"a": 1.0, "b": 1.0}]
    assert median_ratio(rounds, "a", "b", float) == 2.0


def test_every_benchmark_with_rounds_alternates_them_through_the_harness():
    """Arms alternate in ABBA order in one place (harness.alternating / paired_rounds)."""
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.name != "harness.py":
            assert "[::-1]" not in path.read_text(), f"{path.name} orders its rounds itself: use the harness"


def test_paired_rounds_alternate_the_arms_and_keep_their_order():
    from benchmarks.harness import alternating, by_arm, paired_rounds

    assert [a for _, a in alternating("AB", 4)] == list("ABBAABBA")
    ran = []

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    rounds = paired_rounds(["base", "new", "other"], 3, lambda arm: ran.append(arm) or f"{arm}{len(ran)}", bar)
    assert ran == ["base", "new", "other", "other", "new", "base", "base", "new", "other"] and bar.n == 9
    assert [list(rd) for rd in rounds] == [["base", "new", "other"]] * 3      # arm order, whoever ran first
    assert rounds[1] == {"base": "base6", "new": "new5", "other": "other4"}
    assert by_arm(rounds) == {"base": ["base1", "base6", "base7"], "new": ["new2", "new5", "new8"],
                              "other": ["other3", "other4", "other9"]}


def test_baseline_tree_checks_out_a_revision_and_removes_it():
    """A baseline revision runs from a git worktree of its own, gone (and unregistered) after."""
    import subprocess

    import pytest

    from benchmarks.harness import baseline_tree, revision

    def worktrees() -> str:
        return subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert revision(), "this checkout's revision has a name"
    with baseline_tree("HEAD") as tree:
        assert (tree / "velocity" / "__init__.py").is_file() and str(tree) in worktrees()
        got = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert got.stdout.strip() == head
    assert not tree.exists() and str(tree) not in worktrees()
    with pytest.raises(SystemExit, match="no-such-rev"):
        with baseline_tree("no-such-rev"):
            pass


def test_a_benchmark_stopped_with_sigterm_runs_its_finally_blocks():
    """harness.exit_on_sigterm: the servers a benchmark started are stopped when it is."""
    import signal
    import subprocess
    import sys

    code = ("import sys, time\nsys.path.insert(0, %r)\nfrom benchmarks.harness import exit_on_sigterm\n"
            "exit_on_sigterm()\ntry:\n    print('started', flush=True)\n    time.sleep(60)\n"
            "finally:\n    print('servers stopped', flush=True)\n" % str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 143 and p.stdout.read().strip() == "servers stopped"


def test_streams_in_real_time_is_the_largest_level_within_both_bounds():
    from benchmarks.sweep import realtime_streams

    def level(c, rtf99, fa99, errors=0):
        return {"concurrency": c, "errors": errors, "rtf": {"p99": rtf99}, "first_audio_s": {"p99": fa99}}

    levels = [level(1, 0.1, 0.08), level(64, 0.5, 0.3), level(128, 0.9, 0.6), level(256, 1.2, 0.4),
              level(32, 0.4, 0.2, errors=1)]
    assert realtime_streams(levels) == 64                    # 128: first audio; 256: RTF; 32: an error
    assert realtime_streams(levels, first_audio_s=1.0) == 128
    assert realtime_streams([level(1, 1.5, 0.1)]) == 0


def test_bench_step_profile_counts_every_frame_and_the_host_time(tmp_path):
    """bench_step --profile: the profiler's summary is per decoded frame, over the steps it ran (a
    multi-step step counts K frames), and on CPU the host's operations are all there is (no
    kernels, no GPU time: the whole wall time is host). In a child process, as bench_step runs
    its rounds: the torch profiler's objects stay out of the test process; its KV blocks
    scattered (--scattered), as a long-running server's are."""
    import subprocess
    import sys

    from checkpoints import tiny_checkpoint

    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_step.py"), "--child", "--weights", str(ck),
                          "--device", "cpu", "--batches", "2", "--steps", "4", "--profile", "3", "--scattered"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    pr = json.loads(run.stdout.splitlines()[-1])["2"]["profile"]
    assert pr["frames"] == 3                      # one frame a step
    assert pr["kernels"] == 0 and pr["gpu_busy_ms"] == 0 and pr["runtime_calls"] == {}
    assert pr["host_gap_ms"] == pr["wall_ms"] > 0
    names = [name for name, _ in pr["top_host_ops"]]
    assert len(names) == 8 and all(ms >= 0 for _, ms in pr["top_host_ops"])
    assert any(n.startswith(("aten::", "mkldnn::")) for n in names), names


def test_bench_host_runs_the_engine_alone_as_bench_step_does(tmp_path):
    """bench_host's engine-alone arm calls bench_step's child with bench_step's own options: a
    step time for every batch it asks for (an option bench_step reads and bench_host lacked once
    crashed it at its first level)."""
    import sys

    from checkpoints import tiny_checkpoint

    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_host import engine_alone

    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    got = engine_alone(None, str(ck), [1, 2], 3)
    assert sorted(got) == [1, 2] and all(r["step_ms"] > 0 for r in got.values()), got
    # the step outside the worker (LLMEngine.worker_seconds), which the server's counter matches
    assert all(0 < r["outside_worker_ms"] < r["step_ms"] for r in got.values()), got


def test_bench_host_runs_the_engine_alone_on_the_threads_the_server_s_engine_had(tmp_path):
    """On CPU the server's llm gives the vocoder its threads while it decodes: bench_step's child
    runs on the threads it is given, and bench_host weighs its steps on the llm's own threads and
    on every core by the share of the server's steps on each."""
    import argparse
    import sys

    from checkpoints import tiny_checkpoint

    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_host import engine_alone_as_served, engine_threads
    from benchmarks.bench_step import child

    ck = tiny_checkpoint(tmp_path / "tiny", seed=0)
    args = argparse.Namespace(weights=str(ck), device="cpu", batches="2", steps=3, profile=0, scattered=False)
    assert child(args, None, "none", threads=1)["threads"] == 1
    own, lent = engine_threads()
    assert lent == min(os.cpu_count(), own + 1) and own == max(1, os.cpu_count() - 1)
    got = engine_alone_as_served(None, str(ck), 2, 3, lent_share=0.25)
    mix = 0.25 * got["bench_step_all_cores_ms"] + 0.75 * got["bench_step_own_threads_ms"]
    assert got["bench_step_ms"] == mix > 0, got
    every = engine_alone_as_served(None, str(ck), 2, 3, lent_share=1.0)
    assert every["bench_step_ms"] == every["bench_step_all_cores_ms"] == every["bench_step_own_threads_ms"], every
    assert 0 < got["bench_step_outside_worker_ms"] < got["bench_step_ms"], got


def test_bench_first_audio_splits_the_first_audio_at_the_chunk_it_waits_for(tmp_path):
    """bench_first_audio, in process (no server), on the tiny checkpoint (small audio models): the
    first chunk waits for exactly its frames and its lookahead (the prefill makes the first frame,
    a decode step each of the others), and its parts add up to the first audio, none below zero."""
    import subprocess
    import sys

    from checkpoints import tiny_checkpoint

    ck = tiny_checkpoint(tmp_path / "tiny", seed=0, small_audio=True)
    env = {**os.environ, "VELOCITY_CHUNK_FIRST": "6", "VELOCITY_LOOKAHEAD": "5"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_first_audio.py"), "--weights", str(ck),
                          "--no-triton", "--rounds", "1", "--out", str(tmp_path / "fa")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads((tmp_path / "fa.json").read_text())
    assert (tmp_path / "fa.png").stat().st_size > 0
    for arm, first in (("in-process, first 6", 6),):
        r = res["rounds"][0][arm]
        assert r["decode_steps"] == first + 5 - 1, (arm, r)
        assert all(v >= 0 for v in r["parts_s"].values()) and abs(sum(r["parts_s"].values()) - r["first_audio_s"]) < 1e-6


def test_bench_linears_int8_times_both_ops_on_the_same_linears(tmp_path):
    """bench_linears --kind int8: fbgemm's op and the C++ int8_gemm (where it is built for this
    CPU's row width: AVX-512 VNNI or AVX2) on the same random linears, each arm's multiply-adds a
    second from its own time."""
    import subprocess
    import sys

    out = tmp_path / "int8"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_linears.py"), "--kind", "int8", "--sets", "gpt",
                          "--rows", "1,8", "--rounds", "1", "--passes", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["kind"] == "int8" and res["arms"] == ["fbgemm", "int8_gemm"] and res["linears"]["gpt"] == 80
    macs = sum(i * o for i, o in [(768, 2304), (768, 768), (768, 6144), (3072, 768)] * 20)
    for rows, s in res["sets"]["gpt"].items():
        for arm in res["arms"]:
            assert s[arm] > 0 and abs(s["gmacs"][arm] - int(rows) * macs / s[arm] / 1e6) < 1e-6 * s["gmacs"][arm]
        assert s["ratio"] > 0
    assert out.with_suffix(".png").stat().st_size > 0
