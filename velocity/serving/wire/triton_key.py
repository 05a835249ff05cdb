"""The Triton key: what a caller of Triton's own gRPC and HTTP ports shows, in the header
`velocity-key` (gRPC: the metadata `triton-grpc-protocol-velocity-key`, Triton's name for it).

serve.sh writes it to its run folder (`triton_key`, mode 600) at each start. With API keys set
(VELOCITY_GATEWAY_API_KEYS or _FILE) or VELOCITY_TRITON_KEY given, it is that key or a random one,
and Triton's inference, metadata and model config need it on both ports. Without keys it is the
word `local`, and only HTTP inference asks for it: a web page cannot send a header of its own
without a CORS preflight, which Triton refuses, so no page can make the server speak.

Numpy-free and torch-free: the gateway and the client import it.
"""
from __future__ import annotations

from pathlib import Path

HEADER = "velocity-key"
GRPC_HEADER = "triton-grpc-protocol-" + HEADER
OPEN = "local"                   # the key where no keys are set (HTTP inference alone asks for it)
KEY_FILE = "triton_key"


def load(given: str = "", run_dir: str = "") -> str:
    """The key to show: `given` (VELOCITY_TRITON_KEY, --api-key), else the run folder's, else OPEN."""
    if given:
        return given
    try:
        return (Path(run_dir) / KEY_FILE).read_text().strip() or OPEN if run_dir else OPEN
    except OSError:
        return OPEN


def grpc_headers(key: str) -> dict[str, str] | None:
    """tritonclient's `headers=` for a gRPC call (None where no key is asked for there)."""
    return {GRPC_HEADER: key} if key and key != OPEN else None


def http_headers(key: str) -> dict[str, str]:
    """The header for an HTTP call to Triton (always: inference asks for it, keys or not)."""
    return {HEADER: key or OPEN}
