"""Direct Triton callers' share of the llm's requests in flight: a request whose CLIENT this
server's gateway or Wyoming server did not sign (velocity.serving.wire.client_tag) is a direct
caller's (tritonclient, perf_analyzer, curl), and they hold at most VELOCITY_MAX_DIRECT_REQUESTS
together, so that they cannot take the slots the gateway's clients need."""
from __future__ import annotations

from velocity.serving.wire.client_tag import load_key, verify
from velocity.serving.llm.llm_inputs import LLMInputs
from velocity.serving.wire.protocol import STREAM_DIRECT_BUSY
from velocity.serving.settings import Settings


class DirectCallers:
    """The keys of the streams of direct callers (set and discarded from any thread)."""

    def __init__(self, settings: Settings) -> None:
        self.limit = settings.direct_limit()
        self.client_key = load_key(settings.run_dir)     # which CLIENT values this server's gateway signed
        self.keys: set[int] = set()

    def is_direct(self, inputs: LLMInputs) -> bool:
        return not verify(inputs.client, self.client_key)

    def refusal(self) -> int | None:
        """STREAM_DIRECT_BUSY while direct callers hold their cap, else None."""
        return STREAM_DIRECT_BUSY if self.limit and len(self.keys) >= self.limit else None
