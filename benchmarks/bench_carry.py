"""What voice carry-over costs (VOICE_CARRY_OVER, velocity.tts.carry_over): the same seeded
three-sentence requests with and without it, in paired rounds (ABBA), one at a time against a
running server. Reports the first audio, the whole request and the audio seconds, per arm.
Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_carry.py --url localhost:8001 --rounds 3 --out docs/benchmarks/carry/tiny
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, bench_texts, finish, median_ratio, medians, paired_rounds, save  # noqa: E402
from client.triton import stream_grpc  # noqa: E402

log = logging.getLogger("bench_carry")
ARMS = ("plain", "carry")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="localhost:8001")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "carry" / "carry"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    english = [t for t in bench_texts() if t.isascii()]
    text = " ".join(english[:3])                      # three sentences: carry-over applies

    def run(arm: str) -> dict:
        values = {"TEXT": text, "SEED": 1, "MAX_NEW_TOKENS": args.max_new_tokens, "VOICE_CARRY_OVER": arm == "carry"}
        t0, first, samples = time.perf_counter(), None, 0
        for _, audio in stream_grpc(args.url, values):
            first = first or time.perf_counter() - t0
            samples += len(audio)
        got = {"first_audio_s": first, "seconds": time.perf_counter() - t0, "audio_s": samples / 24000}
        log.info("%s: %s", arm, json.dumps({k: round(v, 3) for k, v in got.items()}))
        return got

    rounds = paired_rounds(ARMS, args.rounds, run)
    res = {"label": args.label, "text": text, "arms": list(ARMS), "rounds": rounds,
           "median": medians(rounds, ("first_audio_s", "seconds", "audio_s")),
           "carry_over_plain": {k: median_ratio(rounds, "carry", "plain", lambda x, k=k: x[k])
                                for k in ("first_audio_s", "seconds")}}
    out = Path(args.out)
    save(res, out, plot)
    log.info("median: %s; carry over plain: %s; wrote %s and .png", json.dumps(res["median"]),
             json.dumps(res["carry_over_plain"]), out.with_suffix(".json"))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, key, title in zip(axes, ("first_audio_s", "seconds"), ("first audio", "the whole request")):
        for k, arm in enumerate(res["arms"]):
            xs = [rd[arm][key] for rd in res["rounds"]]
            ax.scatter([k] * len(xs), xs, color="tab:blue" if arm == "plain" else "tab:orange")
            ax.bar(k, statistics.median(xs), alpha=0.3, color="tab:blue" if arm == "plain" else "tab:orange")
        ax.set_xticks(range(len(res["arms"])), ["without carry-over", "with carry-over"])
        ax.set(ylabel="seconds", title=title, ylim=(0, None))
    finish(fig, path, res)


if __name__ == "__main__":
    main()
