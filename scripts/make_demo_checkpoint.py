#!/usr/bin/env python
"""Write a demo checkpoint in the ChatTTS release's layout (seeded random weights: noise, not speech).

    .venv/bin/python scripts/make_demo_checkpoint.py --size tiny --out checkpoints/demo-tiny
"""
import argparse
import logging

from velocity.demo.checkpoint import SIZES, write_checkpoint

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_checkpoint(args.out, args.size, args.seed)
