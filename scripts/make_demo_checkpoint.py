#!/usr/bin/env python
"""Write a demo checkpoint in the ChatTTS release's layout (seeded random weights: noise, not speech).

    .venv/bin/python scripts/make_demo_checkpoint.py --size tiny --out checkpoints/demo-tiny

--unless-current (what serve.sh uses) writes only when the folder does not already hold this
velocity's demo for that size and seed: missing, or written by an older velocity. It writes beside
the folder and renames it into place, so two servers started at once never read a half-written demo.
"""
import argparse
import logging
import os
import shutil
import tempfile
from pathlib import Path

from velocity.demo.checkpoint import SIZES, is_current, write_checkpoint

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--unless-current", action="store_true", help="keep a demo this velocity wrote")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.unless_current:
        if is_current(args.out, args.size, args.seed):
            raise SystemExit(0)
        out = Path(args.out)
        why = "written by an older velocity" if out.exists() else "first use"
        print(f"building the demo checkpoint {out} ({why}; random weights: noise, not speech)", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            write_checkpoint(fresh, args.size, args.seed)
            if not is_current(out, args.size, args.seed):      # else another start wrote it meanwhile
                shutil.rmtree(out, ignore_errors=True)
                try:
                    os.rename(fresh, out)
                except OSError:                                 # another start renamed its own first
                    if not is_current(out, args.size, args.seed):
                        raise
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
    else:
        write_checkpoint(args.out, args.size, args.seed)
