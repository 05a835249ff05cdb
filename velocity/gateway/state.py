"""What the gateway's routers share: its settings, the Triton side, the caps, its metrics, the
pages that may open a socket, the API keys and the speech body's model (AppState, made once by
create_app)."""
from dataclasses import dataclass

from velocity.gateway import fair
from velocity.gateway.speech_request import triton_values
from velocity.gateway.upstream import Gateway


class GatewayMetrics:
    """The gateway's Prometheus series (its own registry): time to the first audio byte, requests
    by format and HTTP status, and clients that hung up before their audio was complete."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.first_byte = Histogram("velocity_gateway_time_to_first_byte_seconds",
                                    "Request arrival to its first audio chunk from Triton", ["format"],
                                    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5, 10), registry=self.registry)
        self.requests = Counter("velocity_gateway_requests", "Speech requests, by format and HTTP status",
                                ["format", "status"], registry=self.registry)
        self.disconnects = Counter("velocity_gateway_disconnects", "Clients that hung up before their audio "
                                   "was complete (their Triton stream is cancelled)", registry=self.registry)

    def render(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.registry)


@dataclass(slots=True)
class AppState:
    """One gateway's shared parts."""
    settings: object                  # velocity.serving.settings.Settings
    gw: Gateway
    admission: fair.Admission
    metrics: GatewayMetrics
    origins: set[str]                 # VELOCITY_GATEWAY_ORIGINS and _CORS_ORIGINS
    keys: set[str]                    # the API keys (none: open)
    body_model: type                  # the speech body's Pydantic model (speech_schema.speech_model)

    def speech_values(self, body: dict, voices: dict[str, str]) -> tuple[dict, object]:
        """A speech body -> (its `tts` inputs, the body as its model): speech_request.triton_values,
        with VELOCITY_GATEWAY_DEFAULT_SEED for a request that names no seed."""
        values, req = triton_values(self.body_model, body, voices, self.settings)
        if self.settings.gateway_default_seed >= 0 and values.get("SEED") is None:
            values |= {"SEED": self.settings.gateway_default_seed}
        return values, req
