"""What the text front end's additions cost per request (in-process, velocity.tts.frontend): the
shipped texts encoded as a request's text is (normalised, split, tokenized) with no lexicon, with
a server lexicon of --entries entries (VELOCITY_LEXICON: built once), with the same as a
request lexicon (parsed and built each time, as a new LEXICON is; the same one again is kept), and the same texts with their Chinese written in traditional characters (OpenCC s2t: every one
replaced before the GPT, velocity.tts.homophones), in paired rounds (ABBA). Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_frontend.py --weights checkpoints/demo-full --out docs/benchmarks/frontend/full
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, arms_plot, bench_texts, median_ratio, medians, paired_rounds, save  # noqa: E402

log = logging.getLogger("bench_frontend")
ARMS = ("plain", "server-lexicon", "request-lexicon", "traditional")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", default=str(ROOT / "checkpoints" / "demo-full"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--entries", type=int, default=1000, help="the request lexicon's entries")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "frontend" / "frontend"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import opencc

    from velocity.tts.frontend import TextFrontend
    from velocity.tts.lexicon import Lexicon

    fe = TextFrontend(args.weights)
    texts = bench_texts()
    traditional = [opencc.OpenCC("s2t").convert(t) for t in texts]
    words = {f"Brand{n}": f"brand number {n}" for n in range(args.entries)} | {"SQL": "sequel", "GIF": "jif"}
    lexicon = json.dumps(words)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(lexicon)
    served = TextFrontend(args.weights, f.name)
    Path(f.name).unlink()
    for t in traditional:                                  # warm: the homophone caches, the tokenizer
        fe.encode(t, speaker=True)

    def run(arm: str) -> dict:
        t0 = time.perf_counter()
        for text, old in zip(texts, traditional):
            if arm == "request-lexicon":
                fe.encode(text, speaker=True, lexicon=Lexicon._parse(lexicon, "LEXICON"))   # not the kept one
            elif arm == "server-lexicon":
                served.encode(text, speaker=True)
            else:
                fe.encode(old if arm == "traditional" else text, speaker=True)
        ms = 1000 * (time.perf_counter() - t0) / len(texts)
        log.info("%s: %.3f ms a text", arm, ms)
        return {"ms_per_text": ms}

    rounds = paired_rounds(ARMS, args.rounds, run)
    res = {"label": args.label, "texts": len(texts), "lexicon_entries": len(words), "arms": list(ARMS),
           "rounds": rounds, "median": medians(rounds, ("ms_per_text",)),
           "over_plain": {a: median_ratio(rounds, a, "plain", lambda x: x["ms_per_text"]) for a in ARMS[1:]}}
    out = Path(args.out)
    save(res, out, plot)
    log.info("median: %s; over plain: %s; wrote %s and .png", json.dumps(res["median"]),
             json.dumps(res["over_plain"]), out.with_suffix(".json"))


def plot(res: dict, path: Path) -> None:
    n = res["lexicon_entries"]
    names = {"server-lexicon": f"server lexicon\n({n} entries)", "request-lexicon": f"request lexicon\n({n} entries)",
             "traditional": "traditional\ncharacters"}
    arms_plot(res, path, "ms_per_text", names, "ms per text", f"the text front end, {res['texts']} shipped texts")


if __name__ == "__main__":
    main()
