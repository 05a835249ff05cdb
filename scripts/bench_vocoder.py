#!/usr/bin/env python
"""Vocoder benchmark: seconds of audio decoded (DVAE + Vocos) per second at batch 1 and 8, and the
streaming seam error against lookahead. Release-size DVAE/Vocos with seeded random weights.
Writes docs/benchmarks/vocoder_cpu.{json,png}.

    .venv/bin/python scripts/bench_vocoder.py
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from velocity.tts.audio_models import load_dvae, load_vocos
from velocity.tts.checkpoint import write_checkpoint
from velocity.tts.streaming import AudioDecoder, ChunkSchedule, StreamingDecoder

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench_vocoder")


def ser_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum().clamp_min(1e-30)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=240, help="GPT frames per utterance (46.875 = 1 s)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "vocoder_cpu"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint(Path(tmp) / "ck", "tiny", seed=0)   # DVAE/Vocos are release-size in every size
        dec = AudioDecoder(load_dvae(ckpt), load_vocos(ckpt))
    T, secs = args.frames, args.frames / 46.875
    res = {"hardware": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                        "torch": torch.__version__}, "frames": T, "audio_seconds_per_utterance": secs,
           "throughput": {}, "lookahead": {}}
    for b in (1, 8):
        codes = torch.randint(0, 625, (b, 4, T))
        dec.decode(codes)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            dec.decode(codes)
            times.append(time.perf_counter() - t)
        res["throughput"][f"batch{b}"] = b * secs / statistics.median(times)
        log.info("batch %d: %.1f s of audio per s", b, res["throughput"][f"batch{b}"])
    frames = [tuple(torch.randint(0, 625, (4,)).tolist()) for _ in range(T)]
    whole = dec.decode(torch.tensor(frames).T[None])[0]
    for la in (0, 2, 4, 8, 16, 32, dec.exact_context):
        sd = StreamingDecoder(dec, ChunkSchedule(12, 36), lookahead=la)
        chunks = sd.push(frames) + sd.push([], final=True)
        audio = torch.cat([c[1] for c in chunks])
        res["lookahead"][str(la)] = ser_db(whole, audio)
        log.info("lookahead %2d frames: SER %.1f dB", la, res["lookahead"][str(la)])
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(list(res["throughput"]), list(res["throughput"].values()), color="#1f77b4")
    a.set_ylabel("seconds of audio / second")
    a.set_title("DVAE + Vocos decode (CPU)")
    la = [int(k) for k in res["lookahead"]]
    b.plot(la, [min(v, 150) for v in res["lookahead"].values()], "o-")
    b.axhline(40, color="grey", ls="--", label="40 dB")
    b.set_xlabel("lookahead (GPT frames; 46.875 = 1 s)")
    b.set_ylabel("SER vs whole decode (dB, capped at 150)")
    b.set_title("Streaming seams vs lookahead")
    b.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
