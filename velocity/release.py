"""The files of a ChatTTS release folder (the folder that holds asset/), checked without torch.

    python -m velocity.release DIR     # exit 0 when DIR looks like a release, else one line on stderr

scripts/serve.sh runs this before it starts Triton, so a wrong --weights path fails at once
with the reason instead of a server that is never ready. The loaders read the files' contents.
"""
from __future__ import annotations

import sys
from pathlib import Path

RELEASE_FILES = (
    "asset/gpt/config.json",
    "asset/gpt/model.safetensors",
    "asset/Embed.safetensors",
    "asset/DVAE.safetensors",
    "asset/Decoder.safetensors",
    "asset/Vocos.safetensors",
    "asset/tokenizer/tokenizer.json",
)


def missing_files(folder: str | Path) -> list[str]:
    """The release files that folder lacks (relative paths); empty when all are there."""
    root = Path(folder)
    return [f for f in RELEASE_FILES if not (root / f).is_file()]


def problem(folder: str | Path) -> str | None:
    """One line saying what is wrong with folder as a weights folder, or None."""
    root = Path(folder)
    if not root.is_dir():
        return f"weights folder {root} does not exist"
    lost = missing_files(root)
    if len(lost) == len(RELEASE_FILES):
        return (f"{root} is not a ChatTTS release folder: it has no {RELEASE_FILES[0]} (give the folder "
                "that holds asset/, or build a demo with scripts/make_demo_checkpoint.py)")
    if lost:
        return f"{root} lacks {', '.join(lost)} of the ChatTTS release"
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m velocity.release DIR", file=sys.stderr)
        return 2
    msg = problem(args[0])
    if msg:
        print(msg, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
