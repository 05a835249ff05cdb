#!/usr/bin/env python
"""velocity against the reference (chattts==0.2.5) on the same folder, the same texts, 2 threads.

    scripts/conformance/setup_venv.sh                   # once: the reference's side venv, .refvenv
    .venv/bin/python benchmarks/bench_reference.py --weights checkpoints/reference-full
    .venv/bin/python benchmarks/bench_reference.py --equal-frames 120 --served-chunks --quantize int8 --rounds 1

Workload: the first --texts shipped sentences. With trained weights each sentence ends at its own
end token and a padded batch runs to its longest; random weights rarely sample the end token, so
this emulates it: each text gets frames proportional to its length (3.1 per character, about
15 characters a second; 24 to 300), velocity generates exactly that many (min = max), and the
reference's batch is limited to the longest. Throughput counts those frames' audio for both.
--equal-frames N gives every text exactly N frames instead, as a new user's test would: the
padded batch then wastes nothing, and the reference's default splitting is skipped.

Arms, each in a fresh process, in alternating rounds (ABAB...): the reference's best call (one
padded batch, `infer(texts, split_text=False)`, text refine skipped), streamed for its first audio,
and its default splitting (`infer(texts)`); velocity in-process (`TTSPipeline.stream_many`, all
texts at once), float32 and with --quantize int8 also int8 (GPT and decoders), and with
--baseline-rev REV velocity float32 at that git revision too (its ratio: the median of each
round's). Resident memory is compared after the 16 texts (the reference maps its weights lazily:
after loading it has not read them all); velocity's KV budget is --kv-mib, allocated up front.
Writes JSON and a PNG.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import baseline_tree, bench_texts, by_arm, finish, hardware, paired_rounds, save  # noqa: E402
FPS = 24000 / 512                     # GPT frames per second of audio


def frames_for(text: str) -> int:
    return max(24, min(300, round(3.1 * len(text))))


def memory_mib(field: str = "VmRSS") -> float:
    """This process's resident memory (VmRSS), or its peak (VmHWM), in MiB."""
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return 0.0


def velocity_child(args: argparse.Namespace, work: dict) -> dict:
    """velocity in this (fresh) process: all texts at once, then the first text alone; with
    --tree, the velocity package of that checkout (a baseline's)."""
    if args.tree:
        assert "velocity" not in sys.modules
        sys.path.insert(0, args.tree)
    import torch

    from velocity.serving.settings import Settings
    from velocity.tts.pipeline import TTSPipeline, chattts_params

    torch.set_num_threads(args.threads)
    q = args.child_quantize
    chunks = {}
    if args.served_chunks:              # the server's chunk schedule and lookahead, as a server runs
        s = Settings(quantize=q)
        chunks = {"schedule": s.schedule(gpu=args.device.startswith("cuda")), "lookahead": s.lookahead}
    pipe = TTSPipeline(args.weights, device=args.device, kv_cache_bytes=args.kv_mib << 20, quantize=q,
                       vocoder_quantize=q, **chunks)
    res = {"memory_after_load_mib": memory_mib()}

    def params(i: int):
        p = chattts_params(seed=i, max_new_tokens=work["frames"][i])
        p.min_new_tokens = work["frames"][i]
        return p

    list(pipe.stream(work["texts"][0], params=chattts_params(max_new_tokens=8)))         # warm up

    def run(texts: list[str]) -> dict:
        first, samples = {}, [0] * len(texts)
        t0 = time.perf_counter()
        for ev in pipe.stream_many(texts, params=params, concurrency=len(texts)):
            now = time.perf_counter() - t0
            if ev.kind == "chunk":
                first.setdefault(ev.text, now)
                samples[ev.text] += len(ev.chunk.audio)
        # each text's listener waits for its own first chunk: the mean over texts
        return {"wall_s": time.perf_counter() - t0, "first_audio_s": statistics.mean(first.values()),
                "first_audio_each_s": [first[i] for i in range(len(texts))], "samples": samples}

    res["all"] = run(work["texts"])
    res["memory_after_all_mib"] = memory_mib()
    res["one_text"] = run(work["texts"][:1])
    res["memory_peak_mib"] = memory_mib("VmHWM")
    return res


def arm(name: str, args: argparse.Namespace, texts_file: Path, baseline: Path | None = None) -> dict:
    """One arm's round in a fresh process: "reference", "velocity-float32", "velocity-int8" or
    "baseline-float32" (velocity float32 from the `baseline` tree)."""
    path = [str(ROOT)]
    if name == "reference":
        py = Path(args.ref_python or Path(args.ref_venv) / "bin" / "python")
        if not args.ref_python and not py.exists():
            raise SystemExit(f"{py} missing: run scripts/conformance/setup_venv.sh first")
        cmd = [str(py), str(ROOT / "scripts" / "conformance" / "reference_bench.py"), "--folder", args.weights,
               "--texts", str(texts_file), "--threads", str(args.threads), "--device", args.device]
        path = args.ref_path + path
    else:
        cmd = [sys.executable, __file__, "--child", name.split("-")[1], "--weights", args.weights,
               "--texts-file", str(texts_file), "--threads", str(args.threads), "--kv-mib", str(args.kv_mib),
               "--device", args.device] + (["--served-chunks"] if args.served_chunks else []) \
            + (["--tree", str(baseline)] if name.startswith("baseline") else [])
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)))
    if p.returncode != 0:
        raise SystemExit(f"{name} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def summarize(res: dict, useful_s: float) -> dict:
    """Per arm, median over rounds: useful audio seconds per second and first audio."""
    out = {}
    for name, rounds in res["rounds"].items():
        med = lambda f: statistics.median(f(r) for r in rounds)  # noqa: E731
        if name == "reference":
            out[name] = {"batch_audio_s_per_s": med(lambda r: useful_s / r["batch"]["wall_s"]),
                         "default_audio_s_per_s": med(lambda r: useful_s / r["default"]["wall_s"])
                         if all("default" in r for r in rounds) else None,
                         "first_audio_all_s": med(lambda r: r["batch_stream"]["first_audio_s"]),
                         "first_audio_one_s": med(lambda r: r["one_text_stream"]["first_audio_s"]),
                         "memory_after_load_mib": med(lambda r: r["memory_after_load_mib"]),
                         "memory_after_batch_mib": med(lambda r: r["memory_after_batch_mib"]["VmRSS"]),
                         "memory_peak_after_batch_mib": med(lambda r: r["memory_after_batch_mib"]["VmHWM"])}
        else:
            out[name] = {"audio_s_per_s": med(lambda r: useful_s / r["all"]["wall_s"]),
                         "first_audio_all_s": med(lambda r: r["all"]["first_audio_s"]),
                         "first_audio_one_s": med(lambda r: r["one_text"]["first_audio_s"]),
                         "memory_after_load_mib": med(lambda r: r["memory_after_load_mib"]),
                         "memory_after_all_mib": med(lambda r: r["memory_after_all_mib"]),
                         "memory_peak_mib": med(lambda r: r["memory_peak_mib"])}
    ref = out["reference"]
    if "baseline-float32" in res["rounds"]:            # paired: each round's ratio, then their median
        pairs = zip(res["rounds"]["velocity-float32"], res["rounds"]["baseline-float32"])
        out["velocity-float32"]["vs_baseline"] = {
            "throughput": statistics.median(b["all"]["wall_s"] / a["all"]["wall_s"] for a, b in pairs),
            "rev": res["baseline_rev"]}
    for name, m in out.items():
        if name != "reference":
            m["vs_reference"] = {"throughput_vs_batch": m["audio_s_per_s"] / ref["batch_audio_s_per_s"],
                                 "throughput_vs_default": m["audio_s_per_s"] / ref["default_audio_s_per_s"]
                                 if ref["default_audio_s_per_s"] else None,
                                 "first_audio_earlier_all": ref["first_audio_all_s"] / m["first_audio_all_s"],
                                 "first_audio_earlier_one": ref["first_audio_one_s"] / m["first_audio_one_s"],
                                 # after the 16 texts, when every weight has been read in both
                                 "memory_minus_reference_mib": m["memory_after_all_mib"] - ref["memory_after_batch_mib"],
                                 "peak_memory_minus_reference_mib": m["memory_peak_mib"] - ref["memory_peak_after_batch_mib"]}
    return out


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = res["summary"]
    names = [n for n in s if n != "reference"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ref = [("reference\npadded batch", s["reference"]["batch_audio_s_per_s"])]
    if s["reference"]["default_audio_s_per_s"]:
        ref.append(("reference\ndefault", s["reference"]["default_audio_s_per_s"]))
    a.bar([r[0] for r in ref] + names, [r[1] for r in ref] + [s[n]["audio_s_per_s"] for n in names],
          color=["tab:gray"] * len(ref) + ["tab:blue"] * len(names))
    lengths = f"{res['equal_frames']} frames each" if res.get("equal_frames") else "frames as the text"
    a.set(ylabel="audio seconds per second", title=f"{len(res['texts'])} texts at once ({lengths}), 2 threads")
    x = range(2)
    for j, n in enumerate(["reference"] + names):
        b.bar([i + (j - len(names) / 2) * 0.25 for i in x],
              [s[n]["first_audio_one_s"], s[n]["first_audio_all_s"]], 0.25, label=n)
    b.set_xticks(list(x), ["one text", f"{len(res['texts'])} texts"])
    b.set(ylabel="first audio (s)", title="time to first audio")
    b.legend()
    for ax in (a, b):
        ax.grid(alpha=0.3, axis="y")
    finish(fig, path, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default=str(ROOT / "checkpoints" / "reference-full"))
    ap.add_argument("--ref-venv", default=str(ROOT / ".refvenv"))
    ap.add_argument("--ref-python", help="the reference's interpreter instead of --ref-venv's (a device machine's python3)")
    ap.add_argument("--ref-path", action="append", default=[],
                    help="a folder put first on the reference's path (its wheels unpacked there); may repeat")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: both arms run there")
    ap.add_argument("--hardware", help="the GPU's name, for the record (--device cuda)")
    ap.add_argument("--texts", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-mib", type=int, default=768, help="velocity's KV budget (16 texts of up to 300 frames: ~700 MiB)")
    ap.add_argument("--quantize", choices=("none", "int8"), default="none", help="int8: also an int8 velocity arm")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--equal-frames", type=int, help="every text exactly this many frames (default: in proportion to the text)")
    ap.add_argument("--served-chunks", action="store_true",
                    help="velocity with the server's chunk schedule and lookahead (default: TTSPipeline's, exact audio)")
    ap.add_argument("--baseline-rev", help="also velocity float32 at this git revision, in the same rounds")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "reference" / "reference"))
    ap.add_argument("--child", choices=("float32", "int8"), help=argparse.SUPPRESS)
    ap.add_argument("--texts-file", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.child_quantize = "int8" if args.child == "int8" else "none"
        print(json.dumps(velocity_child(args, json.loads(Path(args.texts_file).read_text()))))
        return
    from tqdm.auto import tqdm


    texts = bench_texts()[:args.texts]
    work = {"texts": texts, "frames": [args.equal_frames or frames_for(t) for t in texts],
            "skip_default": bool(args.equal_frames)}
    useful_s = sum(work["frames"]) / FPS
    arms = ["reference", "velocity-float32"] + (["velocity-int8"] if args.quantize == "int8" else []) \
        + (["baseline-float32"] if args.baseline_rev else [])
    with tempfile.TemporaryDirectory() as tmp, \
            (baseline_tree(args.baseline_rev) if args.baseline_rev else contextlib.nullcontext()) as base:
        tf = Path(tmp) / "texts.json"
        tf.write_text(json.dumps(work))
        with tqdm(total=args.rounds * len(arms), desc="arms") as bar:
            rounds = by_arm(paired_rounds(arms, args.rounds, lambda a: arm(a, args, tf, base), bar))
    gpu = {"device": args.device, "device_name": args.hardware} if args.hardware else {}
    res = {"hardware": hardware(threads=args.threads, **gpu), "device": args.device,
           "weights": args.weights, "texts": texts, "frames": work["frames"], "useful_audio_s": useful_s,
           "kv_budget_mib": args.kv_mib, "equal_frames": args.equal_frames, "served_chunks": args.served_chunks, "baseline_rev": args.baseline_rev, "rounds": rounds}
    res["summary"] = summarize(res, useful_s)
    out = Path(args.out)
    save(res, out, plot)
    print(json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
