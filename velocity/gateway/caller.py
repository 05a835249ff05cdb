"""Who the current task works for: the client, as the gateway's caps count it ("key:..." or
"address:..."), which the stream also names to the server's engine (the `tts` input CLIENT,
signed: velocity.serving.wire.client_tag). A module of its own: fair and upstream both read it.
"""
from __future__ import annotations

from contextvars import ContextVar

CLIENT: ContextVar[str] = ContextVar("velocity_gateway_client", default="")   # whose work this task does
