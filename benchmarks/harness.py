"""What every benchmark shares: the machine's name, the shipped texts, percentiles and medians of
paired rounds, and the JSON + PNG each writes (the PNG names the hardware it ran on).

    from benchmarks.harness import hardware, save, finish, median_ratio
"""
from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TEXTS = Path(__file__).with_name("texts.txt")


def cpu_model() -> str:
    """This machine's CPU by name and vector ISA ("AMD EPYC (AVX-512, VNNI)"), for benchmark
    records: the class of machine behind a CI-class host varies (int8 and float32 speeds differ by
    ISA: AVX2-only machines are far slower), and platform.processor() says only "x86_64"."""
    name, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not name:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [label for label, flag in (("AVX-512", "avx512f"), ("VNNI", "avx512_vnni"), ("AVX-VNNI", "avx_vnni"))
           if flag in flags] or (["AVX2"] if "avx2" in flags else [])
    name = name or platform.processor() or platform.machine()
    return f"{name} ({', '.join(isa)})" if isa else name


def bench_texts() -> list[str]:
    """The shipped benchmark sentences, one per non-empty line of benchmarks/texts.txt."""
    return [t for t in TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def summary(xs: list[float]) -> dict:
    return {"avg": statistics.fmean(xs) if xs else None, "p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99)}

def median_ratio(rounds: list[dict], arm: str, base: str, key) -> float:
    """The median over paired rounds of arm's value over base's (key(result) -> number): on
    machines whose speed drifts, only ratios within a round compare."""
    return statistics.median(key(r[arm]) / key(r[base]) for r in rounds)


def hardware(**extra) -> dict:
    """The machine a result comes from: CPU by name and ISA, cores, Python and torch if loaded."""
    import sys
    hw = {"cpu": cpu_model(), "cpus": os.cpu_count(), "machine": platform.machine(),
          "python": platform.python_version()}
    if "torch" in sys.modules:
        hw["torch"] = sys.modules["torch"].__version__
    return hw | extra


def where(res: dict) -> str:
    """The hardware a result names: the GPU, else the CPU."""
    hw = res.get("hardware") or {}
    if isinstance(hw, str):
        return hw
    if hw.get("device_name") and hw.get("device") != "cpu":
        return hw["device_name"]
    return hw.get("cpu") or (hw["device"] if isinstance(hw.get("device"), str) else "") or res.get("cpu") or cpu_model()


def finish(fig, path: Path, res: dict, dpi: int = 110) -> None:
    """Lay out and save a benchmark's figure, its hardware named at the foot."""
    fig.tight_layout()
    fig.text(0.99, 0.005, where(res), ha="right", va="bottom", fontsize=7, color="0.4")
    fig.savefig(path, dpi=dpi)


def save(res: dict, out: Path, plot=None) -> Path:
    """out.json (with the hardware, if the result lacks it) and, given plot(res, png_path), out.png."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res.setdefault("hardware", hardware())
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, ensure_ascii=False))
    if plot is not None:
        plot(res, out.with_suffix(".png"))
    return out.with_suffix(".json")
