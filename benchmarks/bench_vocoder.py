#!/usr/bin/env python
"""Vocoder benchmark, both decode paths in the same run: seconds of audio decoded per second at
batch 1 and 8 for codes -> DVAE -> Vocos and for GPT hidden states -> Decoder -> Vocos (the
reference's default), measured in alternating rounds (this machine's speed drifts), the
streaming seam error against lookahead for each, and, for the default path, the seam error and
the stream's decode time against left context (what a shorter left context would save), and
the seam error of a smaller first chunk (VELOCITY_CHUNK_FIRST, which sets first audio).
Release-size DVAE, Decoder (768-wide hidden states) and Vocos with seeded random weights.
Writes docs/benchmarks/vocoder_cpu.{json,png}.

    .venv/bin/python benchmarks/bench_vocoder.py
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a file: the repository's packages

import torch
from safetensors.torch import save_file

from benchmarks.harness import alternating, finish, hardware, save
from velocity.demo.audio_weights import random_decoder_tensors
from velocity.model.loading.audio_models import load_decoder, load_dvae, load_vocos
from velocity.demo.checkpoint import write_checkpoint
from velocity.tts.audio_decoder import AudioDecoder, StreamingDecoder
from velocity.tts.chunking import ChunkSchedule

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench_vocoder")
PATHS = ("codes", "hidden")


def ser_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum().clamp_min(1e-30)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=240, help="GPT frames per utterance (46.875 = 1 s)")
    ap.add_argument("--rounds", type=int, default=4, help="alternating timed rounds per path and batch")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "vocoder_cpu"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint(Path(tmp) / "ck", "tiny", seed=0)   # DVAE/Vocos are release-size in every size
        # the release's Decoder reads 768-wide hidden states (the tiny demo GPT's are 64)
        save_file(random_decoder_tensors(torch.Generator().manual_seed(0), 768), str(ckpt / "asset" / "Decoder.safetensors"))
        dec = AudioDecoder(load_dvae(ckpt), load_vocos(ckpt), load_decoder(ckpt))
    T, secs = args.frames, args.frames / 46.875
    res = {"hardware": hardware(threads=torch.get_num_threads()), "frames": T, "audio_seconds_per_utterance": secs,
           "rounds": args.rounds, "throughput": {p: {} for p in PATHS}, "lookahead": {p: {} for p in PATHS},
           "left": {}}

    def inputs(path: str, b: int) -> torch.Tensor:
        return torch.randint(0, 625, (b, 4, T)) if path == "codes" else torch.randn(b, T, dec.hidden_size)

    for b in (1, 8):
        x = {p: inputs(p, b) for p in PATHS}
        times: dict[str, list[float]] = {p: [] for p in PATHS}
        for p in PATHS:
            dec.decode(x[p])                                   # warm up
        for _, p in alternating(PATHS, args.rounds):
            t = time.perf_counter()
            dec.decode(x[p])
            times[p].append(time.perf_counter() - t)
        for p in PATHS:
            res["throughput"][p][f"batch{b}"] = b * secs / statistics.median(times[p])
            log.info("%-6s batch %d: %.1f s of audio per s", p, b, res["throughput"][p][f"batch{b}"])
    frames = [tuple(torch.randint(0, 625, (4,)).tolist()) for _ in range(T)]
    hidden = torch.randn(T, dec.hidden_size)
    for p in PATHS:
        whole = dec.decode(torch.tensor(frames).T[None] if p == "codes" else hidden[None])[0]
        for la in (0, 2, 4, 8, 16, 32, dec.exact_context):
            sd = StreamingDecoder(dec, ChunkSchedule(12, 36), lookahead=la)
            h = None if p == "codes" else hidden.numpy()
            chunks = sd.push(frames, hidden=h) + sd.push([], final=True)
            audio = torch.cat([c[1] for c in chunks])
            res["lookahead"][p][str(la)] = ser_db(whole, audio)
            log.info("%-6s lookahead %2d frames: SER %.1f dB", p, la, res["lookahead"][p][str(la)])
    # the first chunk's size, which sets first audio (fewer frames to generate before it), with
    # a short and the default lookahead: SER of the whole stream and of its first second, where
    # that chunk's seam is (the default path)
    whole = dec.decode(hidden[None])[0]
    sec = int(dec.sample_rate)
    res["first_chunk"] = {}
    for first in (4, 8, 12):
        for la in (4, 16):
            sd = StreamingDecoder(dec, ChunkSchedule(first, 36), lookahead=la)
            audio = torch.cat([c[1] for c in sd.push(frames, hidden=hidden.numpy()) + sd.push([], final=True)])
            res["first_chunk"][f"{first}/{la}"] = r = {"ser_db": ser_db(whole, audio),
                                                       "first_second_ser_db": ser_db(whole[:sec], audio[:sec])}
            log.info("hidden first chunk %2d frames, lookahead %2d: SER %.1f dB (first second %.1f dB)",
                     first, la, r["ser_db"], r["first_second_ser_db"])
    # left context, the default path: SER with full lookahead, and the whole stream's decode time
    # (median of alternating rounds: the left frames are decoded again for every chunk)
    lefts = (4, 8, 16, 32, dec.exact_context)
    times = {n: [] for n in lefts}
    for r, n in alternating(lefts, args.rounds + 1):  # round 0 warms up and measures the error
        sd = StreamingDecoder(dec, ChunkSchedule(12, 36), left=n)
        t = time.perf_counter()
        chunks = sd.push(frames, hidden=hidden.numpy()) + sd.push([], final=True)
        if r:
            times[n].append(time.perf_counter() - t)
        else:
            res["left"][str(n)] = {"ser_db": ser_db(whole, torch.cat([c[1] for c in chunks]))}
    for n in lefts:
        res["left"][str(n)]["stream_decode_s"] = statistics.median(times[n])
        log.info("hidden left %2d frames: SER %.1f dB, stream decoded in %.3f s", n, res["left"][str(n)]["ser_db"],
                 res["left"][str(n)]["stream_decode_s"])
    log.info("wrote %s and its .png", save(res, Path(args.out), plot))


def plot(res: dict, path: Path) -> None:
    T = res["frames"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    width = 0.38
    for i, p in enumerate(PATHS):
        vals = res["throughput"][p]
        a.bar([j + (i - 0.5) * width for j in range(len(vals))], list(vals.values()), width,
              label={"codes": "codes -> DVAE", "hidden": "hidden -> Decoder (default)"}[p])
    a.set_xticks(range(len(res["throughput"]["codes"])), list(res["throughput"]["codes"]))
    a.set_ylabel("seconds of audio / second")
    a.set_title("decode + Vocos (CPU)")
    a.legend()
    for p in PATHS:
        la = [int(k) for k in res["lookahead"][p]]
        b.plot(la, [min(v, 150) for v in res["lookahead"][p].values()], "o-", label=p)
    b.axhline(40, color="grey", ls="--", label="40 dB")
    b.set_xlabel("lookahead (GPT frames; 46.875 = 1 s)")
    b.set_ylabel("SER vs whole decode (dB, capped at 150)")
    b.set_title("Streaming seams vs lookahead")
    b.legend()
    lefts = [int(k) for k in res["left"]]
    c.plot(lefts, [min(v["ser_db"], 150) for v in res["left"].values()], "o-", color="tab:orange", label="SER (left axis)")
    c.set_xlabel("left context (GPT frames)")
    c.set_ylabel("SER vs whole decode (dB, capped at 150)")
    c.set_title(f"Left context, hidden path ({T} frames, full lookahead)")
    t = c.twinx()
    t.plot(lefts, [v["stream_decode_s"] for v in res["left"].values()], "s--", color="tab:blue", label="decode time")
    t.set_ylabel("whole stream's decode time (s)")
    t.set_ylim(bottom=0)
    c.legend(loc="lower right")
    t.legend(loc="center right")
    finish(fig, path, res)


if __name__ == "__main__":
    main()
