"""Where one stream's first audio goes (profile first).

In this process, on the server's chunking and quantization settings, one request's first audio
is split into its parts, timed around the calls that make them:
- front end: the text to token ids (TextFrontend.encode) and the request's setup;
- prefill: the engine's first step (the prompt);
- first chunk's steps: the decode steps until the first chunk can be cut (its frames and its
  lookahead: VELOCITY_CHUNK_FIRST + VELOCITY_LOOKAHEAD steps);
- vocoder: the first chunk's decode (DVAE or Decoder, then Vocos);
- the rest: what none of these holds (Python between them).
Through Triton (a server this script starts with the same settings), the same request's first
audio as velocity-tts-client gets it; its excess over the in-process total is Triton's hops and
the handoffs between the llm and vocoder processes. Arms alternate within each round (the
machine's speed drifts). `--first` adds in-process arms with other first-chunk sizes, to weigh
that lever: their steps and the decode of their second chunk (the gap after the first audio).

    .venv/bin/python benchmarks/bench_first_audio.py --weights checkpoints/demo-full --quantize int8 \\
        --rounds 5 --first 12 --out docs/benchmarks/first_audio/int8

Writes JSON and a PNG (the parts of each arm's median first audio, stacked).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, exit_on_sigterm, finish, hardware, paired_rounds, save  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank this morning."
PARTS = ("front end", "prefill", "first chunk's steps", "vocoder", "the rest")


class Timed:
    """Wraps obj.name so that each call's (start, end, its first argument's length or None) is
    recorded in .calls."""

    def __init__(self, obj, name: str) -> None:
        self.calls: list[tuple[float, float, int | None]] = []
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.append((t, time.perf_counter(), len(args[0]) if args and hasattr(args[0], "__len__") else None))

        setattr(obj, name, timed)


class InProcess:
    """TTSPipeline with the server's settings, first chunk of `first` frames; profile() splits one
    request's first audio."""

    def __init__(self, weights: str, first: int) -> None:
        from dataclasses import replace

        from velocity.serving.settings import Settings
        from velocity.tts.pipeline import TTSPipeline, chattts_params

        s = Settings.from_env()
        self.params = chattts_params
        self.pipe = TTSPipeline(weights, device="cpu", schedule=replace(s.schedule(gpu=False), first=first),
                                lookahead=s.lookahead, kv_cache_bytes=s.kv_cache_bytes, quantize=s.quantize,
                                vocoder_quantize=s.vocoder_quantize, stateful_decode=s.vocoder_stateful)
        self.steps = Timed(self.pipe.engine, "step")
        self.decodes = Timed(self.pipe, "_decode")                     # each step's ready chunks
        self.front = Timed(self.pipe.frontend, "encode")
        list(self.pipe.stream("Warm up.", params=chattts_params(max_new_tokens=8)))

    def profile(self, seed: int) -> dict:
        for t in (self.steps, self.decodes, self.front):
            t.calls.clear()
        t0 = time.perf_counter()
        chunks = self.pipe.stream(TEXT, speaker=seed, params=self.params(seed=seed))
        next(chunks)
        t_first = time.perf_counter()
        next(chunks, None)                            # the second chunk: the gap after the first audio
        t_second = time.perf_counter()
        chunks.close()
        decode0 = next(c for c in self.decodes.calls if c[2])          # the first call with a chunk
        steps = [c for c in self.steps.calls if c[1] <= decode0[0]]
        parts = {"front end": steps[0][0] - t0, "prefill": steps[0][1] - steps[0][0],
                 "first chunk's steps": sum(b - a for a, b, _ in steps[1:]), "vocoder": decode0[1] - decode0[0]}
        total = t_first - t0
        parts["the rest"] = total - sum(parts.values())
        return {"first_audio_s": total, "parts_s": parts, "decode_steps": len(steps) - 1,
                "step_s": statistics.median(b - a for a, b, _ in steps[1:]), "gap_s": t_second - t_first}


class ThroughTriton:
    """A server on this checkout with the same settings; the request's first audio over gRPC."""

    def __init__(self, weights: str, log_dir: Path) -> None:
        from benchmarks.server import TritonServer

        self.server = TritonServer(repo=ROOT / "model_repository", log_path=log_dir / "server.log",
                                   env={"VELOCITY_WEIGHTS": weights, "GATEWAY_PORT": "0"})
        self.server.start(timeout=600)
        self.profile(0)                               # warm up

    def profile(self, seed: int) -> dict:
        from client.triton import stream_grpc

        t0, first = time.perf_counter(), None
        # 240 frames at most: the stream is read to its end (below), and random weights seldom end it
        for _ in stream_grpc(self.server.grpc_url, {"TEXT": TEXT, "SPEAKER_SEED": seed, "SEED": seed,
                                                    "MAX_NEW_TOKENS": 240}):
            first = first or time.perf_counter() - t0
        # read to its end: a stream left at its first audio runs on in the server until it sees the
        # cancel (a fraction of a second), on the cores the next arm's request would be timed on
        if first is None:
            raise RuntimeError("the stream gave no audio")
        return {"first_audio_s": first}


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    arms = res["arms"]
    for k, arm in enumerate(arms):
        med = res["medians"][arm]
        bottom = 0.0
        for j, part in enumerate(PARTS):
            v = med.get("parts_s", {}).get(part)
            if v is None:
                continue
            ax.bar(k, v, bottom=bottom, color=f"C{j}", label=part if k == 0 else None)
            bottom += v
        if "parts_s" not in med:
            ax.bar(k, med["first_audio_s"], color="0.6", label="through Triton")
    ax.set_xticks(range(len(arms)), arms)
    ax.set(ylabel="first audio, median (s)", title="One stream's first audio, by part")
    ax.legend(fontsize=8)
    finish(fig, path, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default=str(ROOT / "checkpoints" / "demo-full"))
    ap.add_argument("--quantize", choices=("none", "int8"), default="none",
                    help="the GPT's and the vocoder's (VELOCITY_QUANTIZE, VELOCITY_VOCODER_QUANTIZE)")
    ap.add_argument("--first", default="", help="comma-separated first-chunk sizes for more in-process arms")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-triton", action="store_true", help="in-process arms only")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "first_audio" / "run"))
    args = ap.parse_args()
    exit_on_sigterm()
    os.environ["VELOCITY_QUANTIZE"] = os.environ["VELOCITY_VOCODER_QUANTIZE"] = args.quantize
    import torch

    from velocity.serving.settings import Settings

    s = Settings.from_env()
    torch.set_num_threads(os.cpu_count() or 1)
    first = s.schedule(gpu=False).first
    arms = {f"in-process, first {first}": InProcess(args.weights, first)}
    for n in (int(x) for x in args.first.split(",") if x.strip()):
        if n != first:
            arms[f"in-process, first {n}"] = InProcess(args.weights, n)
    with contextlib.ExitStack() as stack:
        if not args.no_triton:
            triton = ThroughTriton(args.weights, Path(stack.enter_context(tempfile.TemporaryDirectory())))
            stack.callback(triton.server.stop)
            arms["Triton"] = triton
        seeds = iter(range(1, 10**6))
        rounds = paired_rounds(list(arms), args.rounds, lambda arm: arms[arm].profile(next(seeds)))
    medians = {}
    for arm in arms:
        runs = [r[arm] for r in rounds]
        med = {"first_audio_s": statistics.median(r["first_audio_s"] for r in runs)}
        if "parts_s" in runs[0]:
            med["parts_s"] = {p: statistics.median(r["parts_s"][p] for r in runs) for p in PARTS}
            med |= {k: statistics.median(r[k] for r in runs) for k in ("decode_steps", "step_s", "gap_s")}
        medians[arm] = med
    sched = s.schedule(gpu=False)                                   # the in-process arms' (but --first)
    res = {"weights": args.weights, "quantize": args.quantize, "text": TEXT, "arms": list(arms), "rounds": rounds,
           "medians": medians, "settings": {"chunk_first": sched.first, "chunk_rest": sched.rest,
                                            "chunk_growth": sched.growth, "lookahead": s.lookahead},
           "hardware": hardware(threads=torch.get_num_threads())}
    out = save(res, Path(args.out), plot)
    for arm, med in medians.items():
        parts = ", ".join(f"{p} {v * 1000:.0f}" for p, v in med.get("parts_s", {}).items())
        print(f"{arm}: first audio {med['first_audio_s'] * 1000:.0f} ms" + (f" ({parts} ms; {med['decode_steps']} "
              f"steps of {med['step_s'] * 1000:.1f} ms; the next chunk {med['gap_s'] * 1000:.0f} ms later)"
              if parts else ""))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
