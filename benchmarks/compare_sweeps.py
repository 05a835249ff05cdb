"""Plot several `benchmarks.sweep` sweeps side by side (first audio and throughput against concurrency).

    python benchmarks/compare_sweeps.py docs/benchmarks/chunk_growth/{A,B,A2,B2}.json \\
        --labels "36 (a)" "144 (a)" "36 (b)" "144 (b)" --title "largest chunk, frames" \\
        -o docs/benchmarks/chunk_growth/compare.png
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a file: the repository's packages

from benchmarks.harness import finish  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path, help="JSON files written by benchmarks.sweep")
    ap.add_argument("--labels", nargs="+", help="one per sweep (default: file names)")
    ap.add_argument("--title", default="")
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    labels = args.labels or [p.stem for p in args.sweeps]
    if len(labels) != len(args.sweeps):
        raise SystemExit(f"{len(args.sweeps)} sweeps but {len(labels)} labels")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for path, label in zip(args.sweeps, labels):
        levels = json.loads(path.read_text())["levels"]
        c = [x["concurrency"] for x in levels]
        a.plot(c, [x["first_audio_s"]["p50"] for x in levels], "o-", label=label)
        b.plot(c, [x["audio_s_per_s"] for x in levels], "o-", label=label)
    for ax, ylabel, title in [(a, "first audio p50 (s)", "Latency"), (b, "audio seconds / second", "Throughput")]:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(title=args.title or None, fontsize=8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    finish(fig, args.out, json.loads(args.sweeps[0].read_text()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
