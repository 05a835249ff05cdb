#!/usr/bin/env python
"""The vocoder's stateful decoders (velocity.tts.stateful_decoder) of many streams: chunks a
second, one stream's chunk a call against every stream's next chunk through each layer at once
(decode_together), at 1 to 128 streams, in paired rounds.

    .venv/bin/python benchmarks/bench_vocoder_streams.py --streams 1,4,16,64,128 --rounds 3

Release-size DVAE, Decoder (768-wide hidden states) and Vocos with seeded random weights, the
Decoder path (the default). Each stream has had its first chunk (4 frames); what is timed is each
stream's next chunk of `--frames` (36: the second chunk of the GPU schedule, the rest of the
CPU's), with 16 frames of lookahead. Writes JSON and a PNG.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from benchmarks.harness import ROOT, by_arm, finish, hardware, paired_rounds, save  # noqa: E402

log = logging.getLogger("bench_vocoder_streams")
FIRST, LOOKAHEAD = 4, 16


def decoders():
    from velocity.demo.audio_weights import random_decoder_tensors
    from velocity.demo.checkpoint import write_checkpoint
    from velocity.model.loading.audio_models import load_decoder, load_dvae, load_vocos
    from velocity.tts.audio_decoder import AudioDecoder

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint(Path(tmp) / "ck", "tiny", seed=0)   # DVAE and Vocos are release-size in every size
        save_file(random_decoder_tensors(torch.Generator().manual_seed(0), 768), str(ckpt / "asset" / "Decoder.safetensors"))
        return AudioDecoder(load_dvae(ckpt), load_vocos(ckpt), load_decoder(ckpt))


def streams(shared, n: int, frames: int) -> tuple[list, list]:
    """n streams past their first chunk, and each one's next chunk as decode_together takes it."""
    from velocity.tts.stateful_decoder import StatefulDecoder, decode_together

    g = torch.Generator().manual_seed(n)
    decs, nxt = [], []
    for _ in range(n):
        h = torch.randn(1, FIRST + frames + LOOKAHEAD, 768, generator=g)
        dec = StatefulDecoder(shared)
        decode_together([(dec, h[:, :FIRST + LOOKAHEAD], 0, FIRST, False, 0)])
        decs.append(dec)
        nxt.append((dec, h, FIRST, frames, False, FIRST))
    return decs, nxt


def run(shared, arm: str, n: int, frames: int) -> float:
    """Chunks a second: n streams' next chunk, one a call (`alone`) or all in one (`together`)."""
    from velocity.tts.stateful_decoder import decode_together

    _, nxt = streams(shared, n, frames)
    t = time.perf_counter()
    with torch.inference_mode():
        if arm == "together":
            decode_together(nxt)
        else:
            for args in nxt:
                decode_together([args])
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--frames", type=int, default=36, help="frames of each stream's timed chunk")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "vocoder" / "streams"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from velocity.tts.stateful_decoder import StatefulDecoder

    shared = StatefulDecoder(decoders())
    run(shared, "together", 2, args.frames)                                  # warm up
    res = {"hardware": hardware(threads=torch.get_num_threads()), "frames": args.frames, "rounds": args.rounds,
           "chunks_per_s": {}}
    for n in (int(x) for x in args.streams.split(",")):
        got = by_arm(paired_rounds(["alone", "together"], args.rounds, lambda arm: run(shared, arm, n, args.frames)))
        res["chunks_per_s"][str(n)] = m = {arm: statistics.median(xs) for arm, xs in got.items()}
        m["together_over_alone"] = statistics.median(t / a for a, t in zip(got["alone"], got["together"]))
        log.info("%3d streams: %.1f chunks/s one a call, %.1f together (%.2fx); %.1f s of audio per s together", n,
                 m["alone"], m["together"], m["together_over_alone"], m["together"] * args.frames / 46.875)
    log.info("wrote %s and its .png", save(res, Path(args.out), plot))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted(res["chunks_per_s"], key=int)
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, style in (("alone", "o--"), ("together", "s-")):
        ax.plot([int(n) for n in ns], [res["chunks_per_s"][n][arm] for n in ns], style,
                label="one stream's chunk a call" if arm == "alone" else "every stream's chunk at once")
    ax.set(xscale="log", xlabel="streams", ylabel=f"chunks of {res['frames']} frames a second",
           title="The vocoder's stateful decoders, release-size, CPU", ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend()
    finish(fig, path, res)


if __name__ == "__main__":
    main()
