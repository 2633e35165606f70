"""The OpenAPI document as the API really behaves: bearer auth, one error schema, and the statuses routes send.

Routes declare the errors their own work can end in (:func:`corral.api.errors.error_responses`). The statuses that
app-wide machinery sends are added here, from what each operation takes:

* 400 where input can be invalid (a request body, query parameters): validation errors are answered 400 in the one
  error shape, so FastAPI's automatic 422 ``HTTPValidationError`` is dropped; 422 stays only where a route declares
  it (``resource_limit``, ``checkout_failed``);
* 401 where the operation needs the bearer token (its ``security``);
* 413 where it takes a JSON body, which :class:`~corral.api.guard.RequestGuard` caps (raw-byte uploads stream and
  are not capped).

The E2B routes follow E2B's own contract: their statuses are left as they are, but their validation errors are
answered 400 in E2B's shape (``{"code", "message"}``, see :mod:`corral.api.e2b._errors`), so FastAPI's 422 is
documented as that 400 there too. Nothing in the document names ``HTTPValidationError`` any more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from corral.api.docs import mount_docs
from corral.api.errors import ERROR_DESCRIPTIONS

__all__ = ["install_openapi"]

ERROR_REF = "#/components/schemas/ErrorResponse"
E2B_ERROR_REF = "#/components/schemas/E2BError"
E2B_ERROR_SCHEMA: dict[str, Any] = {
    "title": "E2BError",
    "description": "E2B's error body: an HTTP status on the control plane and envd's HTTP routes, a Connect code "
    "(`invalid_argument`, `not_found`...) on envd's RPCs.",
    "type": "object",
    "required": ["code", "message"],
    "properties": {
        "code": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "message": {"type": "string"},
    },
}
_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")
_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def install_openapi(app: FastAPI, *, docs_assets_dir: Path | None = None, untouched_prefix: str = "/e2b") -> None:
    """Make ``app.openapi()`` (and ``/openapi.json``) serve the corrected document, built once.

    With ``docs_assets_dir`` (a ``node_modules`` holding ``swagger-ui-dist``), Swagger UI is served at ``/docs``
    from there (:func:`corral.api.docs.mount_docs`); the app must be built with ``docs_url=None``.
    """
    if docs_assets_dir is not None:
        mount_docs(app, assets_dir=docs_assets_dir, title=app.title)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for path, item in schema.get("paths", {}).items():
                for method, operation in item.items():
                    if method not in _METHODS:
                        continue
                    if path.startswith(untouched_prefix):
                        _fix_e2b_validation(operation, schema)
                    else:
                        _fix_statuses(operation)
            _drop_unused_validation_schemas(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to replace the generator


def _json_error() -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": ERROR_REF}}}


def _error(status: int) -> dict[str, Any]:
    return {"description": ERROR_DESCRIPTIONS[status], "content": _json_error()}


def _fix_statuses(operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    automatic = responses.get("422")
    if automatic is not None and "HTTPValidationError" in json.dumps(automatic):
        del responses["422"]
    body = operation.get("requestBody", {}).get("content", {})
    for status, response in responses.items():
        # Errors are JSON whatever the route answers on success (FastAPI files them under the route's media type).
        if status.isdigit() and int(status) >= 400 and ERROR_REF in json.dumps(response.get("content", {})):
            response["content"] = _json_error()
    # A str path parameter cannot fail validation; a body or a query parameter can.
    if body or any(p.get("in") != "path" for p in operation.get("parameters", [])):
        responses.setdefault("400", _error(400))
    if operation.get("security"):
        responses.setdefault("401", _error(401))
    if "application/json" in body:
        responses.setdefault("413", _error(413))
    operation["responses"] = dict(sorted(responses.items()))


def _fix_e2b_validation(operation: dict[str, Any], schema: dict[str, Any]) -> None:
    """FastAPI's automatic 422 on an E2B route becomes the 400 that route really sends (E2B's error shape)."""
    responses: dict[str, Any] = operation.get("responses", {})
    automatic = responses.get("422")
    if automatic is None or "HTTPValidationError" not in json.dumps(automatic):
        return
    del responses["422"]
    responses.setdefault(
        "400",
        {
            "description": "Invalid input (`validation error: ...`), in E2B's error shape.",
            "content": {"application/json": {"schema": {"$ref": E2B_ERROR_REF}}},
        },
    )
    schema.setdefault("components", {}).setdefault("schemas", {}).setdefault("E2BError", E2B_ERROR_SCHEMA)
    operation["responses"] = dict(sorted(responses.items()))


def _drop_unused_validation_schemas(schema: dict[str, Any]) -> None:
    components = schema.get("components", {}).get("schemas", {})
    for name in _VALIDATION_SCHEMAS:
        remaining = {k: v for k, v in schema.items() if k != "components"}
        others = {k: v for k, v in components.items() if k != name}
        if f"#/components/schemas/{name}" not in json.dumps([remaining, others]):
            components.pop(name, None)
