"""Which part of the server failed, for the gateways' clients: serve.sh's health port
(velocity.serving.lifecycle.health), whose watchdog names the part that died in its readiness reason, is
asked when a stream fails as unavailable, and its answer goes into the client's error. serve.sh
gives the gateways its address (VELOCITY_GATEWAY_HEALTH_URL); without one the errors are as Triton
left them."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

from velocity.serving.lifecycle.watchdog import DIED

ASK_TIMEOUT_S = 0.3        # the health process is local: an answer slower than this is no answer
AGAIN_AFTER_S = 0.3        # a stream can fail before the watchdog's next look names the part
FRESH_S = 1.0              # every stream of a failed server fails at once: one question serves them


class HealthReason:
    """The health port's readiness reason, asked once for all the streams that fail together."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._asked_at = float("-inf")
        self._task: asyncio.Future | None = None

    async def why(self) -> str | None:
        """The reason the server is not ready, naming the part where one died; None when it is
        ready, no health URL is set, or the health port does not answer."""
        if not self.url:
            return None
        if self._task is None or (self._task.done() and time.monotonic() - self._asked_at > FRESH_S):
            self._asked_at = time.monotonic()
            self._task = asyncio.ensure_future(asyncio.to_thread(self._ask))
        return await asyncio.shield(self._task)

    def _ask(self) -> str | None:
        why = None
        for attempt in range(2):                    # asked because a stream failed: if the part is not
            try:                                    # named yet, the watchdog's next look will name it
                with urllib.request.urlopen(self.url + "/v2/health/ready", timeout=ASK_TIMEOUT_S):
                    why = None                      # ready (so far)
            except urllib.error.HTTPError as e:
                try:
                    why = json.loads(e.read()).get("reason")
                except ValueError:
                    return None
                if why and DIED in why:
                    return why
            except OSError:
                return why                          # no health process: nothing to add
            if not attempt:
                time.sleep(AGAIN_AFTER_S)
        return why
