"""Fair share: what one client may hold of the gateway, so that one cannot take it from the others.

A client is its API key where keys are set, else its address. Each has a cap on the Triton streams
it runs at once (a POST's, each generating sentence of a WebSocket) and on its WebSockets; all of
them together have a cap on WebSockets; a WebSocket with no message and no speech for the idle
timeout is closed. Past a cap: 503 with Retry-After (a WebSocket's handshake too), sent after the
refusal delay, so that a client that ignores Retry-After and asks again at once spends its own time
waiting, not the gateway's CPU on refusals. The counts live in the gateway's one event loop: no locks.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass

from velocity.gateway.caller import CLIENT
from velocity.gateway.upstream import ApiError

log = logging.getLogger("velocity.gateway")
RETRY_AFTER_S = 2


@dataclass(slots=True)
class Limits:
    """VELOCITY_GATEWAY_MAX_STREAMS_PER_CLIENT, _MAX_SOCKETS_PER_CLIENT, _MAX_SOCKETS, _IDLE_TIMEOUT
    (0: no cap), _REFUSAL_DELAY (seconds)."""
    streams_per_client: int
    sockets_per_client: int
    sockets: int
    idle_timeout: float
    refusal_delay: float = 0.0

    @classmethod
    def of(cls, settings) -> "Limits":
        return cls(settings.gateway_max_streams_per_client, settings.gateway_max_sockets_per_client,
                   settings.gateway_max_sockets, settings.gateway_idle_timeout, settings.gateway_refusal_delay)


def busy(message: str) -> ApiError:
    return ApiError(503, message, code="client_busy")


class Admission:
    """The counts of streams and sockets, per client."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.streams: Counter[str] = Counter()
        self.sockets: Counter[str] = Counter()
        self.held: Counter[str] = Counter()        # refusals waiting out the delay, per client
        self.logged: dict[str, float] = {}          # when each client's last refusal was logged


    @staticmethod
    def client(key: str | None, host: str | None) -> str:
        """Who a request is: its API key (keys set), else its address."""
        return f"key:{key}" if key else f"address:{host or '?'}"

    def open_socket(self, client: str) -> None:
        """Count one more WebSocket of the client (close_socket when it closes); ApiError 503 past a cap."""
        lim = self.limits
        if lim.sockets and sum(self.sockets.values()) >= lim.sockets:
            raise busy(f"the server holds {lim.sockets} WebSockets, the most it takes (VELOCITY_GATEWAY_MAX_SOCKETS): "
                       "try again later")
        if lim.sockets_per_client and self.sockets[client] >= lim.sockets_per_client:
            raise busy(f"this client has {self.sockets[client]} WebSockets open, the most one client may "
                       "(VELOCITY_GATEWAY_MAX_SOCKETS_PER_CLIENT): close one first")
        self.sockets[client] += 1

    def close_socket(self, client: str) -> None:
        self._drop(self.sockets, client)

    def full(self, client: str) -> ApiError | None:
        """The refusal of the client's next stream, if it runs as many as it may; else None."""
        cap = self.limits.streams_per_client
        if not (cap and client and self.streams[client] >= cap):
            return None
        return busy(f"this client has {self.streams[client]} streams running, the most one client may "
                    "(VELOCITY_GATEWAY_MAX_STREAMS_PER_CLIENT): try again when one ends")

    def note(self, client: str, what: str, e: ApiError) -> None:
        """Log a refusal, once a second per client: a flood of them must not flood the log."""
        now = time.monotonic()
        if now - self.logged.get(client, 0.0) >= 1.0:
            if len(self.logged) > 4096:             # bounded: clients quiet for a second are forgotten
                self.logged = {c: t for c, t in self.logged.items() if now - t < 1.0}
            self.logged[client] = now
            log.info("%s from %s refused: %s", what, client, e.message)

    async def refuse(self, client: str, what: str, e: ApiError) -> None:
        """Log a refusal (note) and wait the refusal delay before it is sent. At most
        streams_per_client + sockets_per_client refusals of a client wait at once; past that, they
        go at once (the count stays bounded)."""
        self.note(client, what, e)
        lim = self.limits
        if lim.refusal_delay <= 0 or self.held[client] >= lim.streams_per_client + lim.sockets_per_client:
            return
        self.held[client] += 1
        try:
            await asyncio.sleep(lim.refusal_delay)
        finally:
            self._drop(self.held, client)

    @contextlib.contextmanager
    def stream(self):
        """Hold one of the current client's (CLIENT) streams while it runs; ApiError 503 past its cap."""
        client = CLIENT.get()
        if (refused := self.full(client)) is not None:
            self.note(client, "a stream", refused)
            raise refused
        self.streams[client] += 1
        try:
            yield
        finally:
            self._drop(self.streams, client)

    @staticmethod
    def _drop(counts: Counter, client: str) -> None:
        counts[client] -= 1
        if counts[client] <= 0:
            del counts[client]                      # the table holds the clients with something open
