"""Sending to a client that may have stopped reading: a send that waits longer than the gateway's
send timeout (VELOCITY_GATEWAY_SEND_TIMEOUT) means the client is gone, and its speech is stopped
(its audio would only pile up: in the kernel's buffers, then in the gateway)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable


class ClientGone(Exception):
    """The client took none of its audio for the send timeout."""


async def send_within(send: Awaitable, timeout: float) -> None:
    """Await a send; ClientGone once it has waited `timeout` seconds (0: no limit)."""
    if timeout <= 0:
        await send
        return
    try:
        await asyncio.wait_for(send, timeout)
    except asyncio.TimeoutError as e:
        raise ClientGone(f"the client took none of its audio for {timeout:g} s") from e
