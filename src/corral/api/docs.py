"""``/docs``: Swagger UI served by Corral itself, so the API's documentation works with no network.

FastAPI's own docs page loads Swagger UI from a CDN, which leaves ``/docs`` blank offline. Here the page, its start
script and the few files of the ``swagger-ui-dist`` npm package it needs are served by the app:

* ``GET /docs``: the page; no inline script, so a strict Content-Security-Policy holds (scripts, connections and
  images from this origin only): even Swagger UI's online validator cannot be reached.
* ``GET /docs/swagger-init.js``: starts Swagger UI on ``/openapi.json`` (validator off, "Authorize" kept per tab).
* ``GET /docs/assets/{name}``: one of :data:`DOCS_FILES`, read from ``CORRAL_WEB_ASSETS_DIR`` (the
  ``web/node_modules`` that ``make bootstrap`` installs from ``web/package-lock.json``); a request's path is never
  joined onto a directory. A missing file answers 404 saying to run ``make bootstrap``.

``/docs`` and ``/openapi.json`` are public, like ``/healthz``: they describe the API and hold no data; every call
made from the page still needs the bearer token (the "Authorize" button).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, Response

__all__ = ["DOCS_CONTENT_SECURITY_POLICY", "DOCS_FILES", "mount_docs"]

log = logging.getLogger(__name__)

DOCS_FILES: Final[Mapping[str, tuple[str, str]]] = MappingProxyType(
    {
        "swagger-ui-bundle.js": ("swagger-ui-dist/swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
        "swagger-ui.css": ("swagger-ui-dist/swagger-ui.css", "text/css; charset=utf-8"),
        "favicon-32x32.png": ("swagger-ui-dist/favicon-32x32.png", "image/png"),
    }
)
"""The files ``/docs`` loads: the name it asks for -> (the path under ``CORRAL_WEB_ASSETS_DIR``, its media type)."""

DOCS_CONTENT_SECURITY_POLICY: Final = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        # Swagger UI (React) sets style attributes, and its CSS draws icons as data: SVGs.
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)

_HEADERS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "Content-Security-Policy": DOCS_CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",  # revalidated (ETag): an upgraded server never runs yesterday's bundle
    }
)

BOOTSTRAP_HINT: Final = (
    "run `make bootstrap` (it installs web/node_modules from web/package-lock.json with npm ci), or point "
    "CORRAL_WEB_ASSETS_DIR at a node_modules directory holding swagger-ui-dist"
)

_PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title} - API documentation</title>
<link rel="icon" type="image/png" href="/docs/assets/favicon-32x32.png">
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/swagger-init.js"></script>
</body>
</html>
"""

_CONFIG: Final[Mapping[str, object]] = MappingProxyType(
    {
        "url": "/openapi.json",
        "dom_id": "#swagger-ui",
        "deepLinking": True,
        "showExtensions": True,
        "showCommonExtensions": True,
        "validatorUrl": None,  # Swagger UI would otherwise send the document to validator.swagger.io
        "persistAuthorization": False,  # the token stays in the page, never in localStorage
    }
)


def mount_docs(app: FastAPI, *, assets_dir: Path, title: str) -> None:
    """Serve ``/docs`` from ``assets_dir`` (a ``node_modules`` directory holding ``swagger-ui-dist``).

    The app must be built with ``docs_url=None`` and ``redoc_url=None`` (FastAPI's pages load from a CDN).

    Args:
        app: The application; its ``/openapi.json`` is what the page shows.
        assets_dir: Where the npm packages are (``CORRAL_WEB_ASSETS_DIR``).
        title: The page's title.
    """
    files = {name: (assets_dir / relative, media) for name, (relative, media) in DOCS_FILES.items()}
    missing = sorted(name for name, (path, _) in files.items() if not path.is_file())
    if missing:
        log.warning("/docs: %s missing from %s; %s", ", ".join(missing), assets_dir, BOOTSTRAP_HINT)
    page = _PAGE.format(title=title)
    init = f"window.ui = SwaggerUIBundle({json.dumps(dict(_CONFIG))});\n"

    @app.get("/docs", include_in_schema=False)
    async def docs_page() -> Response:
        """Swagger UI's page."""
        return HTMLResponse(page, headers=dict(_HEADERS))

    @app.get("/docs/swagger-init.js", include_in_schema=False)
    async def docs_init() -> Response:
        """The script that starts Swagger UI (kept out of the page so no inline script is allowed)."""
        return Response(init, media_type="text/javascript; charset=utf-8", headers=dict(_HEADERS))

    @app.get("/docs/assets/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        """One allow-listed file of ``swagger-ui-dist``."""
        found = files.get(name)
        if found is None:
            return _not_found(f"no docs asset named {name!r}; /docs serves {', '.join(DOCS_FILES)}")
        path, media = found
        if not path.is_file():
            return _not_found(f"Swagger UI's {name} is not installed in {assets_dir}: {BOOTSTRAP_HINT}")
        return FileResponse(path, media_type=media, headers=dict(_HEADERS))


def _not_found(message: str) -> Response:
    return PlainTextResponse(message, status_code=404, headers=dict(_HEADERS))
