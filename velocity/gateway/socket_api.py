"""The gateway's two WebSockets: ours (streamed text in, audio and sentence marks out:
velocity/gateway/speech_socket.py) and ElevenLabs' multi-context socket, as Pipecat speaks it
(velocity/gateway/elevenlabs.py). Both refuse a page of another origin than the gateway's own
(HTTP 403) unless VELOCITY_GATEWAY_ORIGINS allows it, check the API key (guard.api_key), and
count against their client's and the gateway's caps (velocity.gateway.fair)."""
import json
import logging

from fastapi import APIRouter, WebSocket

from velocity.gateway import caller, elevenlabs, fair
from velocity.gateway.guard import api_key, error_response, origin_allowed
from velocity.gateway.speech_socket import PATH, SpeechSocket
from velocity.gateway.state import AppState
from velocity.gateway.upstream import ApiError

log = logging.getLogger("velocity.gateway")


def socket_router(state: AppState) -> APIRouter:
    router = APIRouter()
    settings, gw, admission = state.settings, state.gw, state.admission

    async def admit(ws: WebSocket, xi: bool = False) -> str | None:
        """The socket's client if it may go on: its page's origin allowed, its API key valid (xi:
        ElevenLabs' header too), its socket counted against its and the gateway's caps (close with
        admission.close_socket) and its streams as its own (caller.CLIENT). None when refused: the
        handshake answered (403, 1008, or 503 with Retry-After past a cap)."""
        if not origin_allowed(ws.headers, state.origins):
            log.warning("websocket %s: refused the page at %r (not this gateway's, not in VELOCITY_GATEWAY_ORIGINS)",
                        ws.url.path, ws.headers.get("origin"))
            await ws.close(code=1008, reason="this page's origin may not use this server: VELOCITY_GATEWAY_ORIGINS")
            return None
        if (key := api_key(ws.headers, state.keys, xi)) is None:
            await ws.close(code=1008, reason="a valid API key is required: " +
                           ("the xi-api-key header" if xi else "Authorization: Bearer <key>"))
            return None
        client = admission.client(key, ws.client.host if ws.client else None)
        try:
            admission.open_socket(client)
        except ApiError as e:
            await admission.refuse(client, f"websocket {ws.url.path}", e)
            try:
                await ws.send_denial_response(error_response(e))
            except RuntimeError:                    # a server without the denial-response extension
                await ws.close(code=1013, reason=e.message[:120])
            return None
        caller.CLIENT.set(client)
        return client

    @router.websocket(PATH)
    async def speech_stream(ws: WebSocket):
        """Streamed text in, audio and sentence marks out (velocity/gateway/speech_socket.py)."""
        if (client := await admit(ws)) is None:
            return
        try:
            await ws.accept()
            names = await gw.voice_names(fresh=True)
            await SpeechSocket(ws, gw, lambda body: state.speech_values(body, names)[0],
                               state.metrics.disconnects.inc, settings.gateway_send_timeout,
                               settings.gateway_idle_timeout).run()
        finally:
            admission.close_socket(client)

    @router.websocket(elevenlabs.PATH)
    async def elevenlabs_stream(ws: WebSocket, voice_id: str):
        """ElevenLabs' multi-context WebSocket, as Pipecat speaks it (velocity/gateway/elevenlabs.py)."""
        if (client := await admit(ws, xi=True)) is None:
            return
        try:
            await elevenlabs_session(ws, voice_id)
        finally:
            admission.close_socket(client)

    async def elevenlabs_session(ws: WebSocket, voice_id: str) -> None:
        """An admitted ElevenLabs socket, from its accept to its end."""
        await ws.accept()
        names = await gw.voice_names(fresh=True)

        def values_of(text: str, speed: float) -> dict:
            body = {"model": "tts-1", "voice": voice_id, "input": text, "response_format": "pcm", "speed": speed}
            return state.speech_values(body, names)[0]

        try:
            rate = elevenlabs.output_rate(ws.query_params.get("output_format"))
            await gw.check(values_of("Hi.", 1.0))           # the voice, checked by the server now
        except ApiError as e:
            await ws.send_text(json.dumps({"error": "invalid_request", "message": e.message}))
            await ws.close(code=1008, reason=e.message[:120])
            return
        sync, ssml = (ws.query_params.get(k, "false").lower() == "true" for k in ("sync_alignment", "enable_ssml_parsing"))
        await elevenlabs.ElevenLabsSocket(ws, gw, values_of, rate, state.metrics.disconnects.inc,
                                          settings.gateway_send_timeout, settings.gateway_idle_timeout, sync, ssml).run()

    return router
