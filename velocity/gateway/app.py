"""An OpenAI-compatible speech API in front of the Triton server: `POST /v1/audio/speech` streams
the `tts` ensemble's chunks, encoded as they arrive, one gRPC stream per request, many at once.

    velocity-tts-gateway --triton localhost:8001 --port 8080

create_app assembles it from routers by API: speech_api (OpenAI's speech API), socket_api (our
WebSocket and ElevenLabs'), site (the web page, health and metrics), behind guard.Guard (API
keys, the body limit, fair share), all sharing one state.AppState.

Also `GET /v1/models`, `GET /v1/audio/voices` (the server's `voices` model), `GET /health`
(200 only while Triton's `tts` is ready and its server is not draining), the web page at `/`
(page.html) and the API's page at `/docs` (OpenAPI: the speech body's model, speech_schema).

Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400 for what the
request got wrong, 413 for a body over the limit (however it is sent), 415 for a body not sent
as application/json, 503 with Retry-After when the server is busy, draining or unreachable
(restarting after a failure), 504 when the request's timeout passed. An error after the audio
began ends the response abnormally (no last chunk of the chunked body; an `error` event first on
SSE), so that a client can tell cut audio from whole.

The WebSockets refuse a page of another origin than the gateway's own (HTTP 403) unless
VELOCITY_GATEWAY_ORIGINS (or VELOCITY_GATEWAY_CORS_ORIGINS) allows it.

A client that hangs up (before or during its audio) cancels its Triton stream, and the server
stops its work on it within a second (velocity.serving.boards.stream_board); the hang-ups are counted
(velocity_gateway_disconnects_total).
"""
import argparse
import contextlib
import logging
import socket

from fastapi import FastAPI, Request

from velocity.gateway import fair
from velocity.gateway.guard import Guard, api_keys, error_response
from velocity.gateway.site import site_router
from velocity.gateway.socket_api import socket_router
from velocity.gateway.speech_api import speech_router
from velocity.gateway.speech_schema import speech_model
from velocity.gateway.state import AppState, GatewayMetrics
from velocity.gateway.upstream import ApiError, Gateway

log = logging.getLogger("velocity.gateway")


def create_app(triton_url: str, settings=None, retries: int | None = None) -> FastAPI:
    """The ASGI app (FastAPI). triton_url: one gRPC address or several, comma-separated (see
    upstream.Gateway, with `retries`). settings: velocity.serving.settings.Settings (default:
    from the environment)."""
    from velocity.serving.settings import Settings

    settings = settings or Settings.from_env()
    admission = fair.Admission(fair.Limits.of(settings))
    origins = {o.strip().rstrip("/") for o in f"{settings.gateway_origins},{settings.gateway_cors_origins}".split(",")
               if o.strip()}
    gateway = Gateway(triton_url, retries, admission, settings.gateway_health_url, settings.run_dir,
                      settings.triton_key)
    state = AppState(settings, gateway, admission,
                     GatewayMetrics(), origins, api_keys(settings), speech_model(settings))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await state.gw.close()

    # /docs: the API's OpenAPI page (Swagger UI), every body field with its range and help
    app = FastAPI(title="velocity-tts", description=__doc__.split("\n\n")[0], docs_url="/docs", redoc_url=None,
                  lifespan=lifespan)
    app.add_middleware(Guard, keys=state.keys, admission=admission, limit=settings.gateway_max_body_bytes)
    # added after the guard, so outside it: preflights (no key) are answered by CORS
    if settings.gateway_cors_origins:
        from fastapi.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=settings.gateway_cors_origins.split(","),
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return error_response(e)

    for router in (site_router(state), socket_router(state), speech_router(state)):
        app.include_router(router)
    return app


def main(argv: list[str] | None = None) -> None:
    """velocity-tts-gateway: the OpenAI-compatible speech API."""
    import uvicorn

    ap = argparse.ArgumentParser(prog="velocity-tts-gateway", description=main.__doc__)
    ap.add_argument("--triton", default="localhost:8001",
                    help="the Triton server's gRPC address, or several replicas' comma-separated")
    ap.add_argument("--retries", type=int, default=None,
                    help="a request refused before its first chunk (busy, draining, unreachable) is "
                         "tried again on the next address up to this many times (default: each other "
                         "address once; through a balancer give one address and e.g. --retries 2)")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[gateway] %(levelname)s %(message)s")
    from velocity.serving.settings import Settings

    settings = Settings.from_env()
    if settings.gateway_http not in ("httptools", "h11"):
        raise SystemExit(f"VELOCITY_GATEWAY_HTTP={settings.gateway_http!r}: the HTTP parser is httptools or h11")
    # a WebSocket message is held to the body limit once decompressed (permessage-deflate is on);
    # httptools (llhttp, in C) takes less CPU per request than h11, which a flood of refused
    # requests spends on the cores that also speak (docs/benchmarks.md, "Fair share")
    config = uvicorn.Config(create_app(args.triton, settings, retries=args.retries), log_level="warning",
                            timeout_graceful_shutdown=5, ws_max_size=settings.gateway_max_body_bytes,
                            http=settings.gateway_http)
    uvicorn.Server(config).run(sockets=[listen(args.host, args.port, settings.gateway_send_buffer_bytes)])


def listen(host: str, port: int, send_buffer: int) -> socket.socket:
    """The gateway's listening socket; its connections inherit its send buffer (0: the OS's), which
    bounds the audio the kernel holds for a client that does not read."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if send_buffer > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind(addr)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
