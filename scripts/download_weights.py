#!/usr/bin/env python
"""Download the ChatTTS release's weights (the asset/ files this project loads) from Hugging Face,
and check each against the SHA-256 the reference pins. Needs internet; nothing else in this
project downloads anything.

    .venv/bin/python scripts/download_weights.py                    # -> checkpoints/chattts
    .venv/bin/python scripts/download_weights.py --out DIR --dry-run
    make serve WEIGHTS=checkpoints/chattts

Only safetensors and JSON are fetched, plus asset/spk_stat.pt (the speaker statistics; read as
raw bytes, never unpickled). Files already present with the right hash are kept.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from velocity.release import OPTIONAL_FILES, SHA256, sha256_file  # noqa: E402

REPO = "2Noise/ChatTTS"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "checkpoints" / "chattts"), help="folder to write asset/ into")
    ap.add_argument("--repo", default=REPO, help=f"Hugging Face model repository (default {REPO})")
    ap.add_argument("--revision", default="main")
    ap.add_argument("--dry-run", action="store_true", help="list what would be fetched, fetch nothing")
    args = ap.parse_args(argv)
    out = Path(args.out)
    todo = [f for f in SHA256 if not ((out / f).is_file() and sha256_file(out / f) == SHA256[f])]
    todo += [f for f in OPTIONAL_FILES if not (out / f).is_file()]
    if args.dry_run:
        print("\n".join(f"would fetch {args.repo}/{f} -> {out / f}" for f in todo) or "nothing to fetch")
        return 0
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        print("error: huggingface_hub is not installed: .venv/bin/pip install huggingface_hub", file=sys.stderr)
        return 1
    for f in todo:
        try:
            # straight into out/ (no second copy in the cache); shows its own progress bar
            got = Path(hf_hub_download(args.repo, f, revision=args.revision, local_dir=out))
        except Exception as e:
            print(f"error: cannot fetch {args.repo}/{f}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        if f in SHA256 and (h := sha256_file(got)) != SHA256[f]:
            got.unlink()
            print(f"error: {f} has SHA-256 {h}, the release's is {SHA256[f]}: not the release this project "
                  "matches (chattts==0.2.5); try --revision", file=sys.stderr)
            return 1
        print(f"ok {f}")
    print(f"{out} holds the release; serve it with: make serve WEIGHTS={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
