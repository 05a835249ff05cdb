"""The gateway's front door, before any route: API keys on /v1, the body limit, whose request it
is, and a speech request past its client's cap refused before its body is read (Guard); the one
API-key check that the HTTP API and both sockets use (api_key); which pages may open a socket
(origin_allowed); errors in OpenAI's shape (error_response)."""
from pathlib import Path
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse

from velocity.gateway import caller, fair
from velocity.gateway.upstream import ApiError


def api_key(headers, keys: set[str], xi: bool = False) -> str | None:
    """The valid key a request bears, "" when no keys are set (the API is open), else None.
    Authorization: Bearer <key>; with `xi` (ElevenLabs' socket), its xi-api-key header first, or
    an Authorization header with the bare key."""
    if not keys:
        return ""
    if xi:
        key = headers.get("xi-api-key") or headers.get("authorization", "").removeprefix("Bearer ").strip()
    else:
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth.startswith("Bearer ") else None
    return key if key in keys else None


def api_keys(settings) -> set[str]:
    """The keys a request may bear (VELOCITY_GATEWAY_API_KEYS and _FILE); none: the API is open."""
    keys = {k.strip() for k in settings.gateway_api_keys.split(",") if k.strip()}
    if settings.gateway_api_keys_file:
        keys |= {k.strip() for k in Path(settings.gateway_api_keys_file).read_text().splitlines() if k.strip()}
    return keys


class Guard:
    """API keys (Authorization: Bearer) on /v1, the body size limit, and whose request it is
    (caller.CLIENT: its streams count against its cap). Plain ASGI, not Starlette's
    BaseHTTPMiddleware, which relays a streamed body through a response of its own and ends it
    cleanly when the stream fails: a client would take cut audio for whole."""

    def __init__(self, app, keys: set[str], admission: fair.Admission, limit: int) -> None:
        self.app, self.keys, self.admission, self.limit = app, keys, admission, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        key = None
        if self.keys and request.url.path.startswith("/v1/"):
            if (key := api_key(request.headers, self.keys)) is None:
                await JSONResponse(ApiError(401, "a valid API key is required: Authorization: Bearer <key>",
                                            code="invalid_api_key").body(), status_code=401)(scope, receive, send)
                return
        client = self.admission.client(key, request.client.host if request.client else None)
        caller.CLIENT.set(client)
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.limit:
            await JSONResponse(ApiError(413, f"the request body is {size} bytes; the limit is {self.limit} "
                                             "(VELOCITY_GATEWAY_MAX_BODY_BYTES)").body(), status_code=413)(scope, receive, send)
            return
        if scope["method"] == "POST" and scope["path"] == "/v1/audio/speech" and (e := self.admission.full(client)):
            # refused before its body is read or parsed: a flood of refusals costs the gateway little
            await self.admission.refuse(client, "a speech request", e)
            await error_response(e)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def error_response(e: ApiError) -> JSONResponse:
    """An ApiError as OpenAI's error body; a 503 with Retry-After."""
    headers = {"Retry-After": str(fair.RETRY_AFTER_S)} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def origin_allowed(headers, allowed: set[str]) -> bool:
    """A WebSocket's handshake may go on: no Origin (not a browser: the API keys are its check), the
    gateway's own page (the Origin's host is the request's Host), or an allowed origin ("*": any).
    A browser sends the page's origin with every WebSocket, and no CORS check guards one."""
    origin = headers.get("origin")
    if origin is None or "*" in allowed or origin.rstrip("/") in allowed:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == headers.get("host", "").lower()
