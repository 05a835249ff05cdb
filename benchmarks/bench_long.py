"""A long text through velocity-tts-client's pipeline (client/long_text.py) against one request at
a time: a 20-paragraph text, its pieces `--in-flight` at once or one by one, in paired rounds
(ABBA). Reports audio seconds per second and the stalls a listener who starts at the first audio
would hear (the `stall` measure), per arm. Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_long.py --url localhost:8001 --arms 1,2,4 --rounds 2 \\
        --out docs/benchmarks/long/tiny
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, bench_texts, finish, median_ratio, medians, paired_rounds, save  # noqa: E402
from client.long_text import speak_long  # noqa: E402
from client.triton import stream_grpc  # noqa: E402
from velocity.tts.text_pieces import split_long  # noqa: E402

log = logging.getLogger("bench_long")


def book(paragraphs: int) -> str:
    """`paragraphs` paragraphs of three shipped sentences each."""
    texts = [t for t in bench_texts() if t.isascii()]
    return "\n\n".join(" ".join(texts[(3 * p + k) % len(texts)] for k in range(3)) for p in range(paragraphs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="localhost:8001")
    ap.add_argument("--arms", default="1,2", help="pieces in flight, comma-separated; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--paragraphs", type=int, default=20)
    ap.add_argument("--max-chars", type=int, default=2000, help="the pieces' limit (the server's default)")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "long" / "long"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    text = book(args.paragraphs)
    pieces = split_long(text, args.max_chars)
    values = {"TEXT": text, "SEED": 1, "MAX_NEW_TOKENS": args.max_new_tokens}
    arms = [int(a) for a in args.arms.split(",")]

    def run(n: int) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            got = speak_long(lambda v: stream_grpc(args.url, v), values, pieces, str(Path(tmp) / "book.wav"),
                             "PCM_16", in_flight=n)
        got["audio_s_per_s"] = got["audio_s"] / got["seconds"]
        log.info("%d in flight: %s", n, json.dumps({k: round(v, 3) for k, v in got.items() if v is not None}))
        return got

    rounds = paired_rounds(arms, args.rounds, run)
    res = {"label": args.label, "paragraphs": args.paragraphs, "pieces": len(pieces), "characters": len(text),
           "arms": arms, "rounds": [{str(k): v for k, v in rd.items()} for rd in rounds],
           "median": medians(rounds, ("audio_s_per_s", "stall_s", "first_audio_s")),
           "throughput_over_baseline": {str(a): median_ratio(rounds, a, arms[0], lambda x: x["audio_s_per_s"])
                                        for a in arms[1:]}}
    out = Path(args.out)
    save(res, out, plot)
    log.info("median: %s; throughput over %d in flight: %s; wrote %s and .png", json.dumps(res["median"]),
             arms[0], json.dumps(res["throughput_over_baseline"]), out.with_suffix(".json"))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{n} in flight" for n in res["arms"]]
    for k, arm in enumerate(res["arms"]):
        xs = [rd[str(arm)] for rd in res["rounds"]]
        a.scatter([k] * len(xs), [x["audio_s_per_s"] for x in xs], color="tab:blue")
        b.scatter([k] * len(xs), [x["stall_s"] for x in xs], color="tab:red")
    a.set_xticks(range(len(labels)), labels)
    b.set_xticks(range(len(labels)), labels)
    a.set(ylabel="audio seconds per second", title=f"{res['paragraphs']} paragraphs, {res['pieces']} pieces",
          ylim=(0, None))
    b.set(ylabel="seconds of silence heard", title="stalls after the first audio", ylim=(0, None))
    finish(fig, path, res)


if __name__ == "__main__":
    main()
