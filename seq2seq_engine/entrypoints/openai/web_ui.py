"""The browser page at / and its files under /ui/ (plain HTML, JS and CSS in ui/, shipped in the package)."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

UI_DIR = Path(__file__).with_name("ui")
# Open without the API key (GET and HEAD only: middleware.ApiKeyMiddleware): they hold no data; every API call the
# page makes sends the key.
PAGE_PATHS = frozenset({"/"})
PAGE_PREFIXES = ("/ui/",)
# The page runs only its own files: no inline script, nothing from another origin, no framing.
_PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class _Assets(StaticFiles):
    """The page's files, revalidated on every load (an upgraded server's page never mixes with cached files)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update({"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
        return response


def add_ui_routes(app: FastAPI) -> None:
    """Serve GET / (the page) and /ui/<file> (its scripts and style sheet); plain routes, outside the API schema."""
    async def page(request: Request) -> Response:
        return FileResponse(UI_DIR / "index.html", headers=_PAGE_HEADERS)

    app.add_route("/", page, methods=["GET", "HEAD"], include_in_schema=False)
    app.mount("/ui", _Assets(directory=UI_DIR), name="ui")
