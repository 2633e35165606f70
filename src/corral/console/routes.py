"""The console's routes: its page, its own static files, and the few npm files it needs, each by an allow-list.

* ``GET /``: the console's single page (``static/index.html``).
* ``GET /console/static/{name}``: one of the files shipped in ``static/`` (looked up by exact name in a table made
  when the router is built; a request's path is never joined onto a directory).
* ``GET /console/vendor/{name}``: one of :data:`VENDOR_FILES`, read from ``CORRAL_WEB_ASSETS_DIR`` (the
  ``web/node_modules`` that ``make bootstrap`` fills with ``npm ci``). A missing one answers 404 saying to run
  ``make bootstrap``; nothing is ever fetched from elsewhere.
* ``GET /console/assets``: which vendor files are missing, so the page can say so up front instead of failing later.

Every answer carries a strict Content-Security-Policy (scripts and connections from this origin only, no inline
script; inline styles, which xterm.js needs and which cannot run code, are allowed), so a string from the API that
slipped into markup still could not run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response

from corral.settings import Settings

__all__ = ["CONTENT_SECURITY_POLICY", "VENDOR_FILES", "console_router"]

log = logging.getLogger(__name__)

STATIC_DIR: Final = Path(__file__).resolve().parent / "static"

VENDOR_FILES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "xterm.mjs": "@xterm/xterm/lib/xterm.mjs",
        "xterm.css": "@xterm/xterm/css/xterm.css",
        "addon-fit.mjs": "@xterm/addon-fit/lib/addon-fit.mjs",
    }
)
"""The npm files the console loads: the name it asks for, and the path under ``CORRAL_WEB_ASSETS_DIR``."""

CONTENT_TYPES: Final[Mapping[str, str]] = MappingProxyType(
    {
        ".html": "text/html; charset=utf-8",
        ".css": "text/css; charset=utf-8",
        ".js": "text/javascript; charset=utf-8",
        ".mjs": "text/javascript; charset=utf-8",
        ".svg": "image/svg+xml",
    }
)

CONTENT_SECURITY_POLICY: Final = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        # Inline styles are allowed: xterm.js writes its theme into <style> elements and truecolour cells into style
        # attributes. Styles cannot run code, and the console renders API data only as text, never as markup.
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self'",
        "font-src 'self'",
        # 'self' covers ws:// and wss:// to this host too (CSP Level 3): the terminal's WebSocket.
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)

_HEADERS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        # Revalidate every time (FileResponse sends ETag and Last-Modified, so it is a 304 when unchanged): an
        # upgraded server never runs against yesterday's scripts.
        "Cache-Control": "no-cache",
    }
)

BOOTSTRAP_HINT: Final = (
    "run `make bootstrap` (it installs web/node_modules from web/package-lock.json with npm ci), or point "
    "CORRAL_WEB_ASSETS_DIR at a node_modules directory holding @xterm/xterm and @xterm/addon-fit"
)


def _static_files() -> dict[str, Path]:
    """The console's own files by name: the regular files of ``static/`` with a known type."""
    return {p.name: p for p in STATIC_DIR.iterdir() if p.is_file() and p.suffix in CONTENT_TYPES}


def _file(path: Path) -> FileResponse:
    return FileResponse(path, media_type=CONTENT_TYPES[path.suffix], headers=dict(_HEADERS))


def _not_found(message: str) -> Response:
    return PlainTextResponse(message, status_code=404, headers=dict(_HEADERS))


def console_router(settings: Settings) -> APIRouter:
    """The console's routes, serving vendor files from ``settings.web_assets_dir``."""
    static = _static_files()
    assets_dir = settings.web_assets_dir
    vendor = {name: assets_dir / relative for name, relative in VENDOR_FILES.items()}
    missing_at_start = sorted(name for name, path in vendor.items() if not path.is_file())
    if missing_at_start:
        log.warning(
            "web console: %s missing from %s; the terminal will not load until you %s",
            ", ".join(missing_at_start),
            assets_dir,
            BOOTSTRAP_HINT,
        )
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def console_page() -> Response:
        """The console's page."""
        return _file(static["index.html"])

    @router.get("/console/static/{name}")
    async def console_static(name: str) -> Response:
        """One of the console's own files."""
        path = static.get(name)
        return _not_found(f"no console file named {name!r}") if path is None else _file(path)

    @router.get("/console/vendor/{name}")
    async def console_vendor(name: str) -> Response:
        """One allow-listed file of an npm package installed by ``make bootstrap``."""
        path = vendor.get(name)
        if path is None:
            return _not_found(f"no console asset named {name!r}; the console serves {', '.join(VENDOR_FILES)}")
        if not path.is_file():
            return _not_found(f"the web console's asset {name} is not installed: {BOOTSTRAP_HINT}")
        return _file(path)

    @router.get("/console/assets")
    async def console_assets() -> Response:
        """Which vendor files are missing (checked now: ``make bootstrap`` may have run since the start)."""
        missing = sorted(name for name, path in vendor.items() if not path.is_file())
        return JSONResponse({"missing": missing, "hint": BOOTSTRAP_HINT if missing else None}, headers=dict(_HEADERS))

    return router
