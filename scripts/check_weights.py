#!/usr/bin/env python
"""Check a ChatTTS release folder: every file against the SHA-256 the reference pins, then load
every model and synthesize one sentence.

    .venv/bin/python scripts/check_weights.py checkpoints/chattts            # writes check.wav
    .venv/bin/python scripts/check_weights.py DIR --out hello.wav --text "Hello."

Exit 0 when all holds; 1 with one line per problem otherwise. --skip-hashes loads and speaks
a folder that is not the release (a demo folder, your own fine-tune).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from velocity.release import OPTIONAL_FILES, SHA256, problem, sha256_file  # noqa: E402


def check_hashes(folder: Path, table: dict[str, str]) -> list[str]:
    """One line per file that is missing or whose SHA-256 differs from the table."""
    from tqdm.auto import tqdm

    files = [(name, folder / name) for name in table]
    lines = [f"{name}: missing" for name, p in files if not p.is_file()]
    present = [(n, p) for n, p in files if p.is_file()]
    with tqdm(total=sum(p.stat().st_size for _, p in present), unit="B", unit_scale=True, desc="SHA-256") as bar:
        for name, p in present:
            if (got := sha256_file(p, progress=bar.update)) != table[name]:
                lines.append(f"{name}: SHA-256 {got}, the release's is {table[name]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", help="the folder that holds asset/")
    ap.add_argument("--out", default="check.wav", help="WAV to write (default check.wav)")
    ap.add_argument("--text", default="Hello, this is a check of the weights. 你好。")
    ap.add_argument("--max-new-tokens", type=int, default=600, help="frames per sentence at most (default 600: 12.8 s)")
    ap.add_argument("--skip-hashes", action="store_true", help="load and speak without checking SHA-256")
    ap.add_argument("--sha256", help="a JSON {file: sha256} to check against instead of the release's")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    if msg := problem(folder):
        print(f"error: {msg}", file=sys.stderr)
        return 1
    if not args.skip_hashes:
        table = json.loads(Path(args.sha256).read_text()) if args.sha256 else SHA256
        if bad := check_hashes(folder, table):
            print("\n".join(f"error: {b}" for b in bad), file=sys.stderr)
            print("the folder is not the ChatTTS release this project matches (chattts==0.2.5); "
                  "scripts/download_weights.py fetches it", file=sys.stderr)
            return 1
        print(f"SHA-256: all {len(table)} files are the release's")
    for name in OPTIONAL_FILES:
        if not (folder / name).is_file():
            print(f"note: no {name}: random speakers (SPEAKER_SEED) will not use the release's statistics")
    import numpy as np
    import soundfile as sf

    from velocity.tts.pipeline import TTSPipeline, chattts_params

    t = time.monotonic()
    pipe = TTSPipeline(folder, device="auto")
    loaded = time.monotonic() - t
    t = time.monotonic()
    audio = pipe.synthesize(args.text, speaker=0, params=chattts_params(seed=0, max_new_tokens=args.max_new_tokens))
    took = time.monotonic() - t
    if not (audio.size and np.isfinite(audio).all()):
        print("error: the synthesized audio is empty or not finite", file=sys.stderr)
        return 1
    sf.write(args.out, audio, pipe.sample_rate, subtype="PCM_16")
    print(f"loaded every model in {loaded:.1f} s ({pipe.engine.worker.device}); spoke {len(audio) / pipe.sample_rate:.2f} s "
          f"of audio in {took:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
