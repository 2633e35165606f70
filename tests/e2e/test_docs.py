"""``/docs`` and ``/openapi.json`` against a real ``corral serve``: the document tells the truth about auth and errors,
the page loads nothing from outside, and Swagger UI's Authorize then "Try it out" answers 200 in headless Chromium."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import ARTIFACTS, TOKEN, Server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ARTIFACTS / "docs"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield path, method, operation


@pytest.fixture(scope="module")
def openapi(server: Server) -> dict[str, Any]:
    """The document, fetched without a token as any visitor would."""
    answer = server.client.get("/openapi.json", headers={"Authorization": ""})
    assert answer.status_code == 200, answer.text
    document: dict[str, Any] = answer.json()
    return document


def test_openapi_applies_the_bearer_scheme_to_every_api_route_and_only_there(openapi: dict[str, Any]) -> None:
    """Every /api operation requires the HTTP bearer scheme (so Swagger's Authorize sends the token); /healthz and
    the E2B routes, which authenticate their own way, do not claim it."""
    scheme = openapi["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    api = [(p, m, op) for p, m, op in _operations(openapi) if p.startswith("/api/")]
    assert len(api) > 30
    for path, method, operation in api:
        assert operation.get("security") == [{"bearerAuth": []}], f"{method.upper()} {path}"
        assert "401" in operation["responses"], f"{method.upper()} {path} does not document 401"
    others = [(p, m) for p, m, op in _operations(openapi) if not p.startswith("/api/") and op.get("security")]
    assert others == []
    assert "security" not in openapi  # no global requirement that would cover /healthz


def test_openapi_documents_the_error_statuses_and_shape_the_server_sends(
    server: Server, openapi: dict[str, Any]
) -> None:
    """A validation error really answers 400 ``{"error": {code, message, details}}``, and that is what the document
    says: no FastAPI ``HTTPValidationError`` anywhere, and a 422 only where a route declares Corral's own."""
    answer = server.client.post("/api/v1/agent/workspaces", json={"resource_limits": 5})
    assert answer.status_code == 400, answer.text
    assert set(answer.json()["error"]) == {"code", "message", "details"}
    assert answer.json()["error"]["code"] == "invalid_request"

    assert "HTTPValidationError" not in json.dumps(openapi)
    error = openapi["components"]["schemas"]["ErrorResponse"]
    body = openapi["components"]["schemas"][error["properties"]["error"]["$ref"].rsplit("/", 1)[1]]
    assert {"code", "message", "details"} <= set(body["properties"])
    create = openapi["paths"]["/api/v1/agent/workspaces"]["post"]["responses"]
    assert create["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    for path, method, operation in _operations(openapi):
        unprocessable = operation["responses"].get("422")
        if unprocessable is not None:
            assert path.startswith("/api/"), f"{method.upper()} {path}: 422 on a route that never sends it"
            assert "resource_limit" in unprocessable["description"] or "checkout" in unprocessable["description"]


def test_docs_page_is_public_and_loads_only_local_urls(server: Server) -> None:
    """``/docs`` answers without a token, every URL it references is on the server itself and answers 200, and the
    asset route serves its allow-list only."""
    page = server.client.get("/docs", headers={"Authorization": ""})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page.text)
    assert len(urls) >= 4, page.text
    assert "cdn" not in page.text.lower() and "//" not in " ".join(urls), urls
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = server.client.get(url, headers={"Authorization": ""})
        assert asset.status_code == 200, f"{url}: {asset.status_code} {asset.text[:200]}"
    init = server.client.get("/docs/swagger-init.js").text
    assert '"url": "/openapi.json"' in init and '"validatorUrl": null' in init
    assert server.client.get("/docs/assets/swagger-ui-bundle.js").headers["content-type"].startswith("text/javascript")
    for name in ("package.json", "..%2Fpackage.json", "index.html", "swagger-ui-bundle.js.map"):
        refused = server.client.get(f"/docs/assets/{name}")
        assert refused.status_code == 404, name
    assert server.client.get("/redoc").status_code == 404  # FastAPI's ReDoc page would load from a CDN


def test_swagger_ui_authorize_and_try_it_out_answers_200_offline(server: Server, chromium: Any) -> None:
    """In headless Chromium, with every request off the loopback server refused, ``/docs`` renders, Authorize takes
    the token, and "Try it out" on ``GET /api/v1/agent/workspaces`` sends it and shows 200."""
    origin = urlsplit(server.url).netloc
    outside: list[str] = []
    api_calls: list[dict[str, str]] = []
    context = chromium.new_context(viewport={"width": 1280, "height": 1000})
    try:
        page = context.new_page()

        def only_loopback(route: Any) -> None:
            url = route.request.url
            if urlsplit(url).scheme in ("data", "blob") or urlsplit(url).netloc == origin:
                route.continue_()
            else:
                outside.append(url)
                route.abort()

        page.route("**/*", only_loopback)
        page.on(
            "request",
            lambda request: (
                api_calls.append(dict(request.headers))
                if urlsplit(request.url).path == "/api/v1/agent/workspaces"
                else None
            ),
        )
        page.goto(f"{server.url}/docs")
        page.locator(".swagger-ui .information-container .title").wait_for(timeout=30_000)
        assert "Corral" in page.locator(".swagger-ui .information-container .title").inner_text()

        page.locator("button.btn.authorize").first.click()
        page.locator("input[aria-label='auth-bearer-value']").fill(TOKEN)
        page.locator(".modal-ux button.modal-btn.auth.authorize").click()
        page.locator(".modal-ux button.btn-done").click()

        operation = page.locator("#operations-workspaces-list_workspaces_api_v1_agent_workspaces_get")
        operation.locator(".opblock-summary").first.click()
        operation.locator("button.try-out__btn").click()
        operation.locator("button.execute").click()
        status = operation.locator(".live-responses-table .response .response-col_status").first
        status.wait_for(timeout=30_000)
        shown = status.inner_text().strip()
        operation.scroll_into_view_if_needed()
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "authorize-try-it-out.png"), full_page=False)
    finally:
        context.close()
    assert shown == "200", shown
    assert api_calls and api_calls[-1].get("authorization") == f"Bearer {TOKEN}"
    assert outside == [], f"/docs tried to load from outside the server: {outside}"
