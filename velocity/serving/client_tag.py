"""The `CLIENT` input's value: a client's tag signed with the run's client key, so that only the
server's own gateway and Wyoming server can name clients for the engine's fair share. A value
that does not verify (a direct Triton caller's, or none) is the one client "", which every such
caller shares. serve.sh writes the key to its run folder (mode 600) at each start.

Numpy-free and torch-free: the gateway imports it.
"""
from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

KEY_FILE = "client_key"


def load_key(run_dir: str) -> bytes | None:
    """The run's client key (None: no run folder, or none in it)."""
    try:
        return (Path(run_dir) / KEY_FILE).read_bytes().strip() or None if run_dir else None
    except OSError:
        return None


def _mac(tag: str, key: bytes) -> str:
    return hashlib.blake2b(tag.encode(), digest_size=8, key=key[:64], person=b"velocity-client").hexdigest()


def sign(tag: str, key: bytes | None) -> str:
    """tag.mac ("" without a tag or a key)."""
    return f"{tag}.{_mac(tag, key)}" if tag and key else ""


def verify(value: str, key: bytes | None) -> str:
    """The tag of a value that `sign` made with this key; "" for anything else."""
    tag, _, mac = (value or "").rpartition(".")
    return tag if tag and key and hmac.compare_digest(mac, _mac(tag, key)) else ""
