"""The stateful streaming decode against the chunked one, on the server's
chunking: the same chunks, a FrameChunker's, through AudioDecoder.decode_cut (each chunk with its
left context and lookahead) and through StatefulDecoder (each layer's positions once, the
speculative tail again), in alternating rounds on one thread (the vocoder's). Per workload: the
decode's seconds per second of audio, the frames each feeds per audio frame (the stateful one's
positions weighted by each layer's cost), and the SER between the two (float rounding). The
decoders are the full-size demo folder's (release-size), prepacked as the server loads them.

    .venv/bin/python benchmarks/bench_stateful_vocoder.py --weights checkpoints/demo-full --rounds 4 \\
        --out docs/benchmarks/stateful_vocoder/cpu

Writes JSON and a PNG.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, finish, hardware, paired_rounds, save  # noqa: E402

# (name, frames per sentence, sentences): one short, one typical and one long sentence, and a
# stream of several (whose later chunks are the largest)
WORKLOADS = (("1 x 60", 60, 1), ("1 x 150", 150, 1), ("1 x 400", 400, 1), ("4 x 150", 150, 4))


def chunks_of(decoder, frames: list, n: int, per: int, hidden: torch.Tensor | None):
    """The FrameChunker's chunks of `n` sentences of `per` frames, fed 4 frames at a time."""
    from velocity.serving.settings import Settings
    from velocity.tts.audio_decoder import StreamingDecoder

    s = Settings.from_env()
    sd = StreamingDecoder(decoder, s.schedule(gpu=False), left=s.left_context, lookahead=s.lookahead)
    out = []
    for u in range(n):
        for i in range(u * per, (u + 1) * per, 4):
            j = min(i + 4, (u + 1) * per)
            out += sd.cut(frames[i:j], final=j == (u + 1) * per, hidden=None if hidden is None else hidden[i:j].numpy())
    return out


def run(decoder, chunks, stateful: bool) -> tuple[float, torch.Tensor, float]:
    """(seconds, the audio, frames fed per audio frame)."""
    from velocity.tts.stateful_decoder import StatefulDecoder

    t = time.perf_counter()
    if stateful:
        st = StatefulDecoder(decoder)
        audio = torch.cat([st.decode_cut(c)[0] for c in chunks])
        ratio = st.cost_ratio()
    else:
        audio = torch.cat([decoder.decode_cut([c])[0][0] for c in chunks])
        ratio = sum(len(c.codes) for c in chunks) / sum(c.length for c in chunks)
    return time.perf_counter() - t, audio, ratio


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [w["name"] for w in res["workloads"]]
    for k, arm in enumerate(("chunked", "stateful")):
        ax.bar([i + 0.4 * k for i in range(len(names))], [w[arm]["s_per_audio_s"] for w in res["workloads"]],
               width=0.4, label=arm)
    ax.set_xticks([i + 0.2 for i in range(len(names))], [f"{n}\n({res['path']})" for n in names])
    ax.set(ylabel="decode seconds per audio second (median)", title="Chunked vs stateful streaming decode, 1 thread")
    ax.legend()
    finish(fig, path, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default=str(ROOT / "checkpoints" / "demo-full"))
    ap.add_argument("--path", choices=("hidden", "codes"), default="hidden", help="the Decoder's (default) or the DVAE's")
    ap.add_argument("--quantize", choices=("none", "int8"), default="none", help="VELOCITY_VOCODER_QUANTIZE")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "stateful_vocoder" / "run"))
    args = ap.parse_args()
    from velocity.tts.audio_decoder import AudioDecoder

    torch.set_num_threads(args.threads)
    decoder = AudioDecoder.load(args.weights, quantize=args.quantize)
    g = torch.Generator().manual_seed(0)
    out = []
    for name, per, n in WORKLOADS:
        total = per * n
        frames = [tuple(torch.randint(0, decoder.num_codes, (decoder.num_vq,), generator=g).tolist()) for _ in range(total)]
        hidden = torch.randn(total, decoder.hidden_size, generator=g) if args.path == "hidden" else None
        chunks = chunks_of(decoder, frames, n, per, hidden)
        run(decoder, chunks[:2], False)                               # warm up
        rounds = paired_rounds(["chunked", "stateful"], args.rounds, lambda arm: run(decoder, chunks, arm == "stateful"))
        audio_s = (total * 512 - n * 256) / decoder.sample_rate
        a, b = rounds[0]["chunked"][1], rounds[0]["stateful"][1]
        ser = float(10 * torch.log10(a.pow(2).sum() / (a - b).pow(2).sum().clamp_min(1e-30)))
        w = {"name": name, "frames": per, "sentences": n, "chunks": len(chunks), "ser_db": ser,
             "speedup": statistics.median(r["chunked"][0] / r["stateful"][0] for r in rounds)}
        for arm in ("chunked", "stateful"):
            w[arm] = {"s_per_audio_s": statistics.median(r[arm][0] for r in rounds) / audio_s,
                      "frames_per_audio_frame": rounds[0][arm][2], "seconds": [r[arm][0] for r in rounds]}
        out.append(w)
        print(f"{name}: chunked {w['chunked']['s_per_audio_s']:.3f} s/s ({w['chunked']['frames_per_audio_frame']:.2f} "
              f"frames/frame), stateful {w['stateful']['s_per_audio_s']:.3f} s/s "
              f"({w['stateful']['frames_per_audio_frame']:.2f}), {w['speedup']:.2f}x, SER {ser:.1f} dB")
    from velocity.serving.settings import Settings

    s = Settings.from_env()
    sched = s.schedule(gpu=False)                                   # the one chunks_of cut by
    res = {"weights": args.weights, "path": args.path, "quantize": args.quantize, "rounds": args.rounds,
           "schedule": {"first": sched.first, "rest": sched.rest, "largest": sched.largest, "growth": sched.growth,
                        "lookahead": s.lookahead, "left": s.left_context},
           "workloads": out, "hardware": hardware(threads=args.threads)}
    print(f"wrote {save(res, Path(args.out), plot)}")


if __name__ == "__main__":
    main()
