"""The gateway's own pages: the web page at `/`, `/health` (200 only while Triton's `tts` is
ready and its server is not draining) and `/metrics` (Prometheus)."""
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response

from velocity.gateway.state import AppState


def site_router(state: AppState) -> APIRouter:
    router = APIRouter()
    page_html = (Path(__file__).parent / "page.html").read_text()       # read once, served as is

    @router.get("/", include_in_schema=False)
    async def page():
        """The web page: one HTML file with its own script and styles."""
        return HTMLResponse(page_html)

    @router.get("/health")
    async def health():
        ok = await state.gw.ready()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    @router.get("/metrics")
    async def prometheus():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return router
