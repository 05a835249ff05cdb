"""The reference's side of benchmarks/bench_reference.py: run in .refvenv (chattts==0.2.5 is AGPL and
never imported by the project), on the same folder, printing one JSON line of timings.

    .refvenv/bin/python scripts/conformance/reference_bench.py --folder F --texts T.json --threads 2 [--device cuda]

For each call: wall time, the time to its first audio (stream=True yields as frames come), and
the samples of audio each text received. Also resident memory after loading (VmRSS) and at its
peak (VmHWM).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures  # noqa: E402  (reference_chat: the reference's own loader on a demo folder)


def memory_mib() -> dict:
    got = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            got[line.split(":")[0]] = int(line.split()[1]) / 1024
    return got


def run(chat, texts: list[str], frames: int, stream: bool, split: bool) -> dict:
    """One Chat.infer over all texts (text refine skipped, sampled as its defaults), every
    text limited to `frames` frames."""
    import numpy as np
    import torch

    from ChatTTS import Chat

    params = Chat.InferCodeParams(max_new_token=frames, show_tqdm=False, spk_emb=None)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    first = None
    samples = [0] * len(texts)
    out = chat.infer(texts, stream=stream, skip_refine_text=True, split_text=split, params_infer_code=params)
    for wavs in (out if stream else [out]):
        now = time.perf_counter() - t0
        for i, w in enumerate(wavs):
            n = 0 if w is None else int(np.asarray(w).size)
            if n and first is None:
                first = now
            samples[i] += n
    return {"wall_s": time.perf_counter() - t0, "first_audio_s": first, "samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", required=True)
    ap.add_argument("--texts", required=True, help="JSON: {texts: [...], frames: [...]}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    work = json.loads(Path(args.texts).read_text())
    texts, longest = work["texts"], max(work["frames"])
    chat = make_fixtures.reference_chat(Path(args.folder), args.device)
    res = {"memory_after_load_mib": memory_mib()["VmRSS"]}
    run(chat, texts[:1], 8, False, False)                           # warm up
    res["batch"] = run(chat, texts, longest, False, False)          # one padded batch: its best call
    res["memory_after_batch_mib"] = memory_mib()                    # every weight touched by now
    res["batch_stream"] = run(chat, texts, longest, True, False)    # the same, streamed: first audio
    res["one_text_stream"] = run(chat, texts[:1], work["frames"][0], True, False)
    if not work.get("skip_default"):
        res["default"] = run(chat, texts, longest, False, True)     # infer()'s default splitting
    res["memory_peak_mib"] = memory_mib()["VmHWM"]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
