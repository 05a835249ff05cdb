"""The benchmarks' harness (benchmarks/harness.py), without a server: every benchmark saves its
figure through it, and what it writes names the hardware."""
from __future__ import annotations

import json
import re

from triton_server import ROOT


def test_every_benchmark_saves_through_the_harness():
    """No benchmark writes a figure of its own: harness.finish names the hardware on each."""
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(scripts) > 10
    for path in scripts:
        text = path.read_text()
        if path.name == "harness.py":
            continue
        assert "savefig(" not in text, f"{path.name} saves a figure itself: use benchmarks.harness.finish"
        if re.search(r"^def plot\(", text, re.M) or "plt.subplots" in text:
            assert "finish(fig" in text, path.name


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
