"""Who the current task works for: the client, as the gateway's caps count it, and the tag that
tells the server's engine who asks (the `tts` input CLIENT, signed: velocity.serving.client_tag).

The tag is a keyed digest: an API key or an address never leaves the gateway, and the key is
made anew at each start, so a tag means nothing outside this process.
"""
from __future__ import annotations

import hashlib
import os
from contextvars import ContextVar

CLIENT: ContextVar[str] = ContextVar("velocity_gateway_client", default="")   # whose work this task does
_KEY = os.urandom(16)


def tag(client: str) -> str:
    """The engine's name for a client ("" for none): 16 hex digits."""
    return hashlib.blake2b(client.encode(), digest_size=8, key=_KEY).hexdigest() if client else ""


def current_tag() -> str:
    """The tag of the client whose work this task does."""
    return tag(CLIENT.get())
