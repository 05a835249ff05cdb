"""scripts/uv_args.py: uv installs from where this venv's real pip would (its config files and PIP_*
variables, the variable over the file)."""
from __future__ import annotations

import os
import subprocess
import sys

from triton_server import ROOT


def uv_args(tmp_path, conf: str | None, **env: str) -> list[str]:
    """uv's options from pip's config file conf (None: pip reads no file at all) and env."""
    path = tmp_path / "pip.conf"
    path.write_text(conf or "")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # PIP_CONFIG_FILE: pip reads this file last, over the machine's and the user's
    clean.update(PIP_CONFIG_FILE=os.devnull if conf is None else str(path), HOME=str(tmp_path),
                 XDG_CONFIG_HOME=str(tmp_path), **env)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "uv_args.py"), sys.executable], env=clean,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_pips_files_and_variables_become_uvs_options(tmp_path):
    conf = ("[global]\nindex-url = https://file.example/simple\nfind-links = /wheels/a /wheels/b\n"
            "constraint = /c.txt\ncert = /ca.pem\n")
    args = uv_args(tmp_path, conf, PIP_INDEX_URL="https://env.example/simple",
                   PIP_EXTRA_INDEX_URL="https://extra.example/simple")
    assert args == ["--index-url", "https://env.example/simple", "--extra-index-url", "https://extra.example/simple",
                    "--find-links", "/wheels/a", "--find-links", "/wheels/b", "--constraint", "/c.txt",
                    "--index-strategy", "unsafe-best-match", "SSL_CERT_FILE=/ca.pem"]


def test_no_configuration_is_no_options(tmp_path):
    assert uv_args(tmp_path, None) == []
    assert uv_args(tmp_path, None, PIP_FIND_LINKS="/w") == ["--find-links", "/w"]
