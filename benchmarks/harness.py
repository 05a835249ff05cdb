"""What every benchmark shares: the machine's name, the shipped texts, paired rounds (ABBA) and
their medians, a baseline revision to compare with, percentiles, and the JSON + PNG each writes
(the PNG names the hardware it ran on).

    from benchmarks.harness import paired_rounds, median_ratio, baseline_tree, save, finish
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TEXTS = Path(__file__).with_name("texts.txt")


def cpu_model() -> str:
    """This machine's CPU by name and the vector ISA this process runs ("AMD EPYC (AVX-512, VNNI)",
    "AMD EPYC (AVX2 (capped; the CPU has AVX-512, VNNI))" under ATEN_CPU_CAPABILITY=avx2), for
    benchmark records: the class of machine behind a CI-class host varies (int8 and float32 speeds
    differ by ISA: AVX2-only machines are far slower), and platform.processor() says only "x86_64"."""
    from velocity.model.kernels.cpu_isa import describe

    name = ""
    try:
        name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), "")
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    isa = describe()
    return f"{name} ({isa})" if isa else name


def bench_texts() -> list[str]:
    """The shipped benchmark sentences, one per non-empty line of benchmarks/texts.txt."""
    return [t for t in TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def summary(xs: list[float]) -> dict:
    return {"avg": statistics.fmean(xs) if xs else None, "p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99)}

A = TypeVar("A")
R = TypeVar("R")


def alternating(arms: Sequence[A], rounds: int) -> Iterator[tuple[int, A]]:
    """(round, arm) for `rounds` rounds of every arm, odd rounds in reverse order (ABBA): a drift
    in the machine's speed then falls on every arm alike, and no arm always goes first."""
    for r in range(rounds):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            yield r, arm


def paired_rounds(arms: Sequence[A], rounds: int, run: Callable[[A], R], bar=None) -> list[dict[A, R]]:
    """run(arm) for every arm in each of `rounds` rounds, in ABBA order: [{arm: result}, ...] with
    the arms in their given order. bar (a tqdm) advances once per run."""
    got: list[dict[A, R]] = [{} for _ in range(rounds)]
    for r, arm in alternating(arms, rounds):
        got[r][arm] = run(arm)
        if bar is not None:
            bar.update(1)
    return [{arm: rd[arm] for arm in arms} for rd in got]


def by_arm(rounds: list[dict[A, R]]) -> dict[A, list[R]]:
    """Paired rounds regrouped per arm: {arm: [round 1's result, round 2's, ...]}."""
    return {arm: [rd[arm] for rd in rounds] for arm in (rounds[0] if rounds else {})}


def exit_on_sigterm() -> None:
    """SIGTERM ends the script as an exception would, so that its `finally` blocks run (the servers
    it started are stopped); Python's default ends it on the spot and leaves them running."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def setting_pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    """NAME=VALUE arguments (a repeated flag, e.g. --baseline-env) as a dict; one without `=` stops
    the benchmark, naming the flag."""
    bad = [i for i in items or [] if "=" not in i]
    if bad:
        raise SystemExit(f"{flag} {bad[0]!r}: want NAME=VALUE")
    return dict(i.split("=", 1) for i in items or [])


def revision(root: Path = None) -> str:
    """This checkout's revision as `git describe --always --dirty` names it ("" outside git)."""
    got = subprocess.run(["git", "-C", str(root or ROOT), "describe", "--always", "--dirty"],
                         capture_output=True, text=True)
    return got.stdout.strip()


@contextlib.contextmanager
def baseline_tree(rev: str) -> Iterator[Path]:
    """The repository at git revision `rev`, checked out in a temporary worktree and removed
    after: a baseline's code runs from it (its folder first on sys.path; a server:
    benchmarks.server.TritonServer(root=tree))."""
    with tempfile.TemporaryDirectory(prefix="baseline-") as tmp:
        tree = Path(tmp) / "tree"
        got = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev],
                             capture_output=True, text=True)
        if got.returncode != 0:
            raise SystemExit(f"baseline revision {rev!r}: {got.stderr.strip()}")
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def trees(stack: contextlib.ExitStack, baseline_rev: str | None) -> tuple[dict[str, Path], dict[str, str]]:
    """The arms' trees ("this": this checkout; "baseline": baseline_rev's worktree, if given, kept
    while the stack is open) and their labels (the revisions)."""
    roots, labels = {"this": ROOT}, {"this": revision() or "this"}
    if baseline_rev:
        roots["baseline"], labels["baseline"] = Path(stack.enter_context(baseline_tree(baseline_rev))), baseline_rev
    return roots, labels


def medians(rounds: list[dict[A, dict]], keys: Sequence[str]) -> dict[str, dict[str, float]]:
    """Each arm's median of each key over the rounds: {str(arm): {key: median}}."""
    return {str(a): {k: statistics.median(x[k] for x in xs) for k in keys} for a, xs in by_arm(rounds).items()}


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
    """Lay out and save a benchmark's figure, its hardware named at the foot and, if the result
    has one, its label (what the server ran) at the top."""
    if res.get("label"):
        fig.suptitle(res["label"])
    fig.tight_layout()
    fig.text(0.99, 0.005, where(res), ha="right", va="bottom", fontsize=7, color="0.4")
    fig.savefig(path, dpi=dpi)


def arms_plot(res: dict, path: Path, key: str, names: dict[str, str], ylabel: str, title: str) -> None:
    """The PNG of a result with arms and rounds: each round's `key` per arm, a point each."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, arm in enumerate(res["arms"]):
        xs = [rd[arm][key] for rd in res["rounds"]]
        ax.scatter([k] * len(xs), xs, color="tab:blue")
    ax.set_xticks(range(len(res["arms"])), [names.get(a, a) for a in res["arms"]])
    ax.set(ylabel=ylabel, title=title, ylim=(0, None))
    finish(fig, path, res)


def rounds_panels(res: dict, path: Path, panels: Sequence[tuple[str, str, float | None]], title: str) -> None:
    """The PNG of a result with rounds over the arms of res["summary"] (named by res["labels"]):
    a panel per (key, ylabel, a line at that value or None), each round's value a point per arm."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    names = list(res["summary"])
    for ax, (key, label, line), color in zip(axes[0], panels, ("tab:blue", "tab:orange", "tab:purple")):
        for k, name in enumerate(names):
            xs = [rd[name][key] or 0 for rd in res["rounds"]]
            ax.scatter([k] * len(xs), xs, color=color)
        if line is not None:
            ax.axhline(line, color="tab:green", lw=0.8, ls=":")
        ax.set_xticks(range(len(names)), [res["labels"][n] for n in names])
        ax.set(ylabel=label, ylim=(0, None))
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    finish(fig, path, res)


def save(res: dict, out: Path, plot=None) -> Path:
    """out.json (with the hardware, if the result lacks it) and, given plot(res, png_path), out.png."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res.setdefault("hardware", hardware())
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, ensure_ascii=False))
    if plot is not None:
        plot(res, out.with_suffix(".png"))
    return out.with_suffix(".json")
