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


# The release's files and their SHA-256 as the reference pins them (chattts==0.2.5,
# ChatTTS/res/sha256_map.json): facts about the published weights, for scripts/check_weights.py.
SHA256 = {
    "asset/Decoder.safetensors": "77aa55e0a977949c4733df3c6f876fa85860d3298cba63295a7bc6901729d4e0",
    "asset/DVAE.safetensors": "1d0b044a8368c0513100a2eca98456b289e6be6a18b7a63be1bcaa315ea874d9",
    "asset/Embed.safetensors": "2ff0be7134934155741b643b74e32fb6bf3eec41257984459b2ed60cdb4c48b0",
    "asset/Vocos.safetensors": "07e5561491cce41f7f90cfdb94b2ff263ff5742c3d89339db99b17ad82cc3f44",
    "asset/gpt/config.json": "0aaa1ecd96c49ad4f473459eb1982fa7ad79fa5de08cde2781bf6ad1f9a0c236",
    "asset/gpt/model.safetensors": "cd0806fd971f52f6a22c923ec64982b305e817bcc41ca83417fcf9141b984a0f",
    "asset/tokenizer/special_tokens_map.json": "bd0ac9d9bb1657996b5c5fbcaa7d80f8de530d01a283da97f89deae5b1b8d011",
    "asset/tokenizer/tokenizer_config.json": "43e9d658b554fa5ee8d8e1d763349323bfef1ed7a89c0794220ab8861387d421",
    "asset/tokenizer/tokenizer.json": "843838a64e121e23e774cc75874c6fe862198d9f7dd43747914633a8fd89c20e",
}
OPTIONAL_FILES = ("asset/spk_stat.pt",)    # the speaker statistics (random speakers); no hash pinned


def sha256_file(path: Path, chunk: int = 1 << 20, progress=None) -> str:
    """SHA-256 of a file, read in chunks; progress(n) is called with each chunk's size."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            if progress is not None:
                progress(len(block))
    return h.hexdigest()


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
