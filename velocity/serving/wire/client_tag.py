"""The `CLIENT` input's value: a tag naming a client (a keyed digest of its API key or address,
which so never leave the gateway) and its signature, both made with the run's client key, so
that only the server's own gateway and Wyoming server can name clients for the engine's fair
share. A value that does not verify (a direct Triton caller's, or none) is the one client "",
which every such caller shares. serve.sh writes the key to its run folder (mode 600) at each start.

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


def _digest(data: str, key: bytes, person: bytes) -> str:
    return hashlib.blake2b(data.encode(), digest_size=8, key=key[:64], person=person).hexdigest()


def sign(client: str, key: bytes | None) -> str:
    """The CLIENT value for a client (the gateway's name for it: "key:..." or "address:..."):
    tag.signature ("" without a client or a key)."""
    if not (client and key):
        return ""
    tag = _digest(client, key, b"velocity-tag")
    return f"{tag}.{_digest(tag, key, b'velocity-client')}"


def verify(value: str, key: bytes | None) -> str:
    """The tag of a value that `sign` made with this key; "" for anything else."""
    tag, _, mac = (value or "").rpartition(".")
    return tag if tag and key and hmac.compare_digest(mac, _digest(tag, key, b"velocity-client")) else ""
