"""The HTTP API keeps the promises of its own OpenAPI document.

Schemathesis reads ``/openapi.json`` from the real app (in process, over fake providers named like real backends),
generates requests for every operation but the E2B ones (which follow E2B's contract, not ours), sends them with
the real bearer token, and checks each answer: never a 5xx, only documented status codes, content types and
headers, bodies that match the documented schemas, 405 with ``Allow`` for undeclared methods, rejected invalid
input, and enforced authentication. A fixed seed and derandomized generation make the run the same every time.

``positive_data_acceptance`` is left out on purpose: some rules cannot be written as JSON Schema (a path must stay
inside /workspace, agent type names are unique), so a schema-valid request can rightly be refused with 400.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import strategies as st
from schemathesis.engine import events, from_schema
from schemathesis.python import asgi

from corral.api.app import create_app
from corral.providers.fake import FakeProvider
from corral.settings import Settings

ISOLATION = {"docker": "container", "gvisor": "gvisor", "firecracker": "microvm"}
"""What each real provider reports, for the fakes that stand in for them."""

pytestmark = pytest.mark.unit

# `corral workspaces cp` uploads tar archives; schemathesis has no generator for the type, so it gets arbitrary bytes
# (mostly not a tar at all: the route must answer those with a documented error, never a 5xx).
schemathesis.openapi.media_type("application/x-tar", st.binary(max_size=4096))

TOKEN = "contract-test-token"
SEED = 20240601
MAX_EXAMPLES = 100  # per operation and phase: about a minute on two cores
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "unsupported_method",
    "negative_data_rejection",
    "ignored_auth",
)


def build_app(data_dir: Path) -> FastAPI:
    """The real app over in-memory providers: gVisor and Firecracker for auto, plain docker present but not allowed."""
    providers = {
        name: FakeProvider(name, isolation=ISOLATION.get(name, "none")) for name in ("firecracker", "gvisor", "docker")
    }
    settings = Settings(
        data_dir=data_dir,
        api_token=TOKEN,
        providers=",".join(providers),
        allow_docker_fallback=False,
        warm_pool_size=0,
        e2b_warm_pool_size=0,
        health_interval_s=3600,
    )
    return create_app(settings, providers=dict(providers))


@dataclass(frozen=True, slots=True)
class Finding:
    """One failed check with the request that caused it."""

    operation: str
    check: str
    title: str
    request: str
    response: str

    def __str__(self) -> str:
        return f"{self.operation} [{self.check}] {self.title}\n    {self.request}\n    -> {self.response}"


@dataclass(frozen=True, slots=True)
class Run:
    """What one schemathesis run saw."""

    findings: list[Finding]
    errors: list[str]
    operations: set[str]
    cases: int


def _describe(interaction: Any) -> tuple[str, str]:
    if interaction is None:
        return "(no request recorded)", "(no response)"
    request = interaction.request
    body = (request.body or b"")[:200]
    sent = f"{request.method} {request.uri} {body!r}" if body else f"{request.method} {request.uri}"
    response = interaction.response
    if response is None:
        return sent, "(no response)"
    return sent, f"{response.status_code} {(response.content or b'')[:300]!r}"


def run_schemathesis(app: FastAPI) -> Run:
    """Run every phase (examples, coverage, fuzzing, stateful) over the non-E2B operations and collect findings."""
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "headers": {"Authorization": f"Bearer {TOKEN}"},
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True},
            "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
            "workers": 1,
        }
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config).exclude(path_regex="^/e2b")
    findings: list[Finding] = []
    errors: list[str] = []
    operations: set[str] = set()
    cases = 0
    try:
        for event in from_schema(schema).execute():
            if isinstance(event, events.ScenarioFinished):
                operations.add(event.recorder.label)
                cases += len(event.recorder.cases)
                for case_id, checks in event.recorder.checks.items():
                    for check in checks:
                        if check.failure_info is not None:
                            sent, got = _describe(event.recorder.interactions.get(case_id))
                            failure = check.failure_info.failure
                            findings.append(Finding(event.recorder.label, check.name, failure.title, sent, got))
            elif isinstance(event, events.NonFatalError):
                errors.append(f"{event.label}: {event.info.format()}")
            elif isinstance(event, events.FatalError):
                errors.append(f"fatal: {event.exception!r}")
            elif isinstance(event, events.EngineFinished):
                errors += [f"after run: {failure.title}: {failure.message}" for failure in event.failures]
    finally:
        asgi.shutdown_lifespans()  # the app's lifespan ran in schemathesis's event loop thread
    return Run(findings, errors, operations, cases)


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    """A fresh app whose data lives in this test's temporary directory."""
    return build_app(tmp_path)


@pytest.fixture
def openapi(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document."""
    return app.openapi()


@pytest.fixture
async def client(app: FastAPI) -> Iterator[httpx.AsyncClient]:
    """An HTTP client talking to the started app in process, with the bearer token."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://corral", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as http:
            yield http


def _operations(openapi: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in openapi["paths"].items():
        if not path.startswith("/e2b"):
            for method, operation in item.items():
                yield path, method, operation


def test_schemathesis_finds_no_contract_violation(tmp_path: Path) -> None:
    """Generated requests to every non-E2B operation get no 5xx, no undocumented status, type or header, and no
    answer that breaks its documented schema."""
    app = build_app(tmp_path)
    documented = {f"{method.upper()} {path}" for path, method, _ in _operations(app.openapi())}
    run = run_schemathesis(app)
    assert not run.errors, "\n".join(run.errors)
    assert not run.findings, f"{len(run.findings)} findings:\n" + "\n".join(str(f) for f in run.findings[:40])
    assert documented <= run.operations, f"operations never exercised: {sorted(documented - run.operations)}"
    assert run.cases > 20 * len(documented), f"only {run.cases} cases for {len(documented)} operations"


def test_openapi_declares_bearer_auth_everywhere_but_healthz(openapi: dict[str, Any]) -> None:
    """A bearer scheme is declared (Swagger's Authorize works) and every operation needs it except /healthz."""
    schemes = openapi["components"]["securitySchemes"]
    [(name, scheme)] = schemes.items()
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, method, operation in _operations(openapi):
        if path == "/healthz":
            assert "security" not in operation
        else:
            assert operation.get("security") == [{name: []}], f"{method.upper()} {path}"
            assert "401" in operation["responses"], f"{method.upper()} {path}"


def test_openapi_errors_use_the_one_error_schema_and_never_fastapis_422(openapi: dict[str, Any]) -> None:
    """Every documented error answer is the named {"error": {code, message, details}} schema in JSON; FastAPI's
    validation 422 is gone (validation answers 400) and 422 stays only where resource limits can be refused."""
    error = openapi["components"]["schemas"]["ErrorResponse"]
    assert error["required"] == ["error"]
    body = openapi["components"]["schemas"]["ErrorBody"]
    assert set(body["required"]) == {"code", "message", "details"}
    for path, method, operation in _operations(openapi):
        assert "HTTPValidationError" not in json.dumps(operation), f"{method.upper()} {path}"
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                assert response["content"] == {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
                }, f"{method.upper()} {path} {status}"
    create = openapi["paths"]["/api/v1/agent/workspaces"]["post"]["responses"]
    assert {"201", "400", "401", "403", "413", "422", "503"} <= set(create)


def test_openapi_file_routes_are_raw_bytes(openapi: dict[str, Any]) -> None:
    """Reading a file answers application/octet-stream and writing one takes it, both documented as binary."""
    files = openapi["paths"]["/api/v1/agent/workspaces/{workspace_id}/files"]
    binary = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    assert files["get"]["responses"]["200"]["content"] == binary
    assert files["put"]["requestBody"]["content"] == binary
    assert "413" not in files["put"]["responses"]  # uploads stream and are not capped


async def test_trace_gets_405_with_every_allowed_method(client: httpx.AsyncClient) -> None:
    """An undeclared method answers 405 with an Allow header naming every method of the path (RFC 9110)."""
    for path, allowed in [
        ("/healthz", "GET"),
        ("/api/v1/agent/workspaces", "GET, POST"),
        ("/api/v1/agent/workspaces/abc", "DELETE, GET"),
        ("/api/v1/agent/workspaces/abc/files", "DELETE, GET, PUT"),
    ]:
        resp = await client.request("TRACE", path)
        assert resp.status_code == 405, path
        assert resp.headers["allow"] == allowed, path
        assert resp.json()["error"]["code"] == "method_not_allowed"


async def test_validation_errors_name_a_field_called_path(client: httpx.AsyncClient) -> None:
    """A missing query parameter named ``path`` is reported as ``path``, not as the request body."""
    resp = await client.get("/api/v1/agent/workspaces/abc/files/stat")
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("path: ")
