"""The options that make `uv pip install` install from where pip would (scripts/setup.sh).

uv reads none of pip's configuration. This reads it as pip resolves it (`pip config list`: the
files, then PIP_* variables, each over the one before) and prints uv's options for it, one a line:
the index URL, extra index URLs, find-links, constraint files and the certificate bundle
(as SSL_CERT_FILE=..., for the caller to export). With extra indexes, uv picks the best version
over all of them, as pip does (its default takes the first index that has the package).

    python scripts/uv_args.py [PIP_PYTHON]     # PIP_PYTHON: the interpreter whose pip to ask
"""
from __future__ import annotations

import subprocess
import sys

# pip's configuration sources, lowest precedence first (pip config list names each line's source)
ORDER = ("global", "user", "site", ":env:")
MULTI = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint"}


def pip_config(python: str) -> dict[str, str]:
    """key -> value, each from the source pip would take it from."""
    # check: a pip that cannot say its configuration must not leave uv on its own defaults
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    ranked: dict[str, tuple[int, str]] = {}
    for line in out.splitlines():
        source_key, sep, value = line.partition("=")
        source, _, key = source_key.rpartition(".")
        if not sep or source not in ORDER:
            continue
        rank = ORDER.index(source)
        if key not in ranked or rank >= ranked[key][0]:
            ranked[key] = (rank, value.strip().strip("'\""))
    return {k: v for k, (_, v) in ranked.items()}


def uv_args(config: dict[str, str]) -> list[str]:
    """uv's options (and SSL_CERT_FILE=...) for pip's configuration."""
    args = []
    if url := config.get("index-url"):
        args += ["--index-url", url]
    for key, flag in MULTI.items():
        for value in config.get(key, "").split():
            args += [flag, value]
    if "extra-index-url" in config:
        args += ["--index-strategy", "unsafe-best-match"]
    if cert := config.get("cert"):
        args.append(f"SSL_CERT_FILE={cert}")
    return args


if __name__ == "__main__":
    print("\n".join(uv_args(pip_config(sys.argv[1] if len(sys.argv) > 1 else sys.executable))))
