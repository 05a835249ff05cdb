"""A WebSocket client that stops reading or stops talking: a send that waits longer than the
gateway's send timeout (VELOCITY_GATEWAY_SEND_TIMEOUT) means the client is gone, and its speech
is stopped (its audio would only pile up: in the kernel's buffers, then in the gateway); a socket
with no message and nothing to say for the idle timeout (VELOCITY_GATEWAY_IDLE_TIMEOUT) is closed."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

POLICY = 1008                # WebSocket close codes: a client that broke the rules (took nothing)
SERVICE_RESTART = 1012       # the server restarts after a part died: try again in a few seconds


class ClientGone(Exception):
    """The client is gone: it took none of its audio for the send timeout, or it closed the
    connection before a send."""


def once(f: Callable[[], None]) -> Callable[[], None]:
    """f, run at its first call only (a hang-up is counted once, whichever path sees it first)."""
    done = False

    def first() -> None:
        nonlocal done
        if not done:
            done = True
            f()
    return first


def _closed_errors() -> tuple[type[BaseException], ...]:
    """What a send to a client that has closed its connection raises: starlette's
    WebSocketDisconnect and WebSocketDisconnected (a send after the close), the server's OSError."""
    from starlette import websockets
    return tuple(filter(None, (websockets.WebSocketDisconnect, getattr(websockets, "WebSocketDisconnected", None),
                               OSError)))


async def send_within(send: Awaitable, timeout: float) -> None:
    """Await a send; ClientGone once it has waited `timeout` seconds (0: no limit), or when the
    client has closed the connection (a client that leaves is not the server's fault)."""
    try:
        await (send if timeout <= 0 else asyncio.wait_for(send, timeout))
    except asyncio.TimeoutError as e:
        raise ClientGone(f"the client took none of its audio for {timeout:g} s") from e
    except _closed_errors() as e:
        raise ClientGone("the client closed the connection") from e


async def close_socket(ws, code: int, reason: str) -> None:
    """Close a WebSocket within a second, whatever state its client is in."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ws.close(code=code, reason=reason[:120]), 1)


def server_failed(e: Exception) -> bool:
    """The error is the server's failure (unreachable, a part died), not the sentence's."""
    return getattr(e, "code", None) == "server_unavailable"


async def receive_unless_idle(ws, timeout: float, quiet: Callable[[], bool]) -> dict | None:
    """The socket's next message; None once `timeout` seconds passed with no message and quiet()
    (nothing being spoken) all along (0: wait for ever)."""
    if timeout <= 0:
        return await ws.receive()
    loop = asyncio.get_running_loop()
    last = loop.time()                               # the last moment it was not idle
    receive = asyncio.ensure_future(ws.receive())
    try:
        while True:
            done, _ = await asyncio.wait({receive}, timeout=min(timeout, 1.0))
            if done:
                return receive.result()
            now = loop.time()
            if not quiet():
                last = now
            elif now - last >= timeout:
                return None
    finally:
        if not receive.done():
            receive.cancel()
