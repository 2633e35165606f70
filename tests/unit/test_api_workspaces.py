"""The workspaces HTTP API over the fake provider: routing, auth, JSON errors, validation and selection records."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from corral.api.app import create_app
from corral.providers.base import Capabilities
from corral.providers.fake import FakeProvider
from corral.settings import Settings

pytestmark = pytest.mark.unit

TOKEN = "unit-test-token"
ISOLATION = {"gvisor": "gvisor", "docker": "container", "firecracker": "microvm", "e2b": "remote"}


class IsolatedFake(FakeProvider):
    """A fake that reports the isolation of the backend it is named after (the plain fake reports "none")."""

    async def capabilities(self) -> Capabilities:
        """The fake's capabilities with the named backend's isolation."""
        caps = await super().capabilities()
        return dataclasses.replace(caps, isolation=ISOLATION.get(self.name, "none"))  # type: ignore[arg-type]


@pytest.fixture
def providers() -> dict[str, FakeProvider]:
    # Named like real backends so auto selection considers them; they are in-memory fakes (4 CPUs, 16 GiB).
    return {"gvisor": IsolatedFake("gvisor"), "docker": IsolatedFake("docker")}


@asynccontextmanager
async def serve(
    tmp_path: Path, providers: dict[str, FakeProvider], **settings: object
) -> AsyncIterator[httpx.AsyncClient]:
    """The app over ``providers``, started, with an authenticated client."""
    config = Settings(
        data_dir=tmp_path,
        api_token=TOKEN,
        providers=",".join(providers),
        warm_pool_size=0,
        e2b_warm_pool_size=0,
        **settings,
    )  # type: ignore[arg-type]
    app = create_app(config, providers=dict(providers))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://corral", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as http:
            yield http


@pytest.fixture
async def client(tmp_path: Path, providers: dict[str, FakeProvider]) -> AsyncIterator[httpx.AsyncClient]:
    """Plain docker allowed, as several tests here fall back to it."""
    async with serve(tmp_path, providers, allow_docker_fallback=True) as http:
        yield http


@pytest.fixture
async def strict_client(tmp_path: Path, providers: dict[str, FakeProvider]) -> AsyncIterator[httpx.AsyncClient]:
    """The default settings: plain docker is not allowed."""
    async with serve(tmp_path, providers) as http:
        yield http


def create_calls(providers: dict[str, FakeProvider]) -> list[tuple[str, str]]:
    """(provider, workspace id) of every create call on any of the providers."""
    return [(name, wid) for name, p in providers.items() for method, wid in p.calls if method == "create"]


async def _create(client: httpx.AsyncClient, **body: object) -> dict[str, object]:
    resp = await client.post("/api/v1/agent/workspaces", json=body)
    assert resp.status_code == 201, resp.text
    data: dict[str, object] = resp.json()
    return data


async def test_healthz_needs_no_token_and_everything_else_does(client: httpx.AsyncClient) -> None:
    """/healthz answers anonymously; API routes answer 401 with a JSON error without the right token."""
    assert (await client.get("/healthz", headers={"Authorization": ""})).status_code == 200
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
        resp = await client.get("/api/v1/agent/workspaces", headers=headers)
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "unauthorized"


async def test_create_defaults_to_auto_and_gvisor(client: httpx.AsyncClient) -> None:
    """No provider means auto: gVisor is chosen, limits default to 2 CPU / 4G / 10G, network isolated."""
    ws = await _create(client)
    assert ws["requested_provider"] == "auto"
    assert ws["provider"] == "gvisor"
    assert ws["status"] == "ready"
    assert ws["resource_limits"] == {"cpu": "2", "memory": "4G", "disk": "10G"}
    assert ws["network"] == "isolated"
    assert ws["from_warm_pool"] is False
    assert ws["provider_attempts"] == []
    assert ws["idle_timeout_s"] == 3600.0 and isinstance(ws["expires_at"], str)  # stopped when idle an hour


async def test_auto_falls_back_and_records_every_attempt(
    client: httpx.AsyncClient, providers: dict[str, FakeProvider]
) -> None:
    """When gVisor fails to create, auto falls back to docker and records gVisor's reason and docker's warning."""
    providers["gvisor"].fail_create = "gVisor runtime not available"
    ws = await _create(client)
    assert ws["provider"] == "docker"
    assert ws["provider_attempts"] == [{"provider": "gvisor", "error": "gVisor runtime not available"}]
    assert any("isolation is reduced" in w for w in ws["warnings"])  # type: ignore[attr-defined]


async def test_explicit_provider_never_falls_back(
    client: httpx.AsyncClient, providers: dict[str, FakeProvider]
) -> None:
    """An explicit provider that fails gives 503 naming it and its reason; docker is not tried."""
    providers["gvisor"].fail_create = "gVisor runtime not available"
    resp = await client.post("/api/v1/agent/workspaces", json={"provider": "gvisor"})
    assert resp.status_code == 503
    error = resp.json()["error"]
    assert error["code"] == "provider_unavailable"
    assert "gvisor" in error["message"] and "gVisor runtime not available" in error["message"]
    assert not any(call[0] == "create" for call in providers["docker"].calls)


async def test_all_providers_failing_lists_each_reason(
    client: httpx.AsyncClient, providers: dict[str, FakeProvider]
) -> None:
    """When every provider fails, one 503 lists every provider with its reason."""
    providers["gvisor"].fail_create = "runsc missing"
    providers["docker"].fail_create = "dockerd down"
    resp = await client.post("/api/v1/agent/workspaces", json={})
    assert resp.status_code == 503
    error = resp.json()["error"]
    assert error["code"] == "all_providers_failed"
    assert {(a["provider"], a["error"]) for a in error["details"]["attempts"]} == {
        ("gvisor", "runsc missing"),
        ("docker", "dockerd down"),
    }


@pytest.mark.parametrize(
    ("body", "status", "code", "needle"),
    [
        ({"provider": "nope"}, 400, "provider_not_found", "allowed: auto"),
        ({"resource_limits": {"memory": "lots"}}, 400, "invalid_request", "resource_limits.memory"),
        ({"resource_limits": {"cpu": "-1"}}, 400, "invalid_request", "resource_limits.cpu"),
        ({"resource_limits": {"gpu": "1"}}, 400, "invalid_request", "allowed: cpu, memory, disk"),
        ({"network": "internet"}, 400, "invalid_request", "network"),
        ({"container_type": "vm"}, 400, "invalid_request", "container_type"),
        ({"unexpected": 1}, 400, "invalid_request", "unexpected"),
        ({"provider": "firecracker"}, 503, "provider_unavailable", "not configured"),
    ],
)
async def test_bad_create_input_gets_a_named_4xx(
    client: httpx.AsyncClient, body: dict[str, object], status: int, code: str, needle: str
) -> None:
    """Bad create input gets a JSON error naming the problem, and the server keeps serving."""
    resp = await client.post("/api/v1/agent/workspaces", json=body)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code
    assert needle in resp.json()["error"]["message"]
    assert (await client.get("/api/v1/agent/workspaces")).status_code == 200


async def test_missing_workspace_is_404_and_destroyed_is_410(client: httpx.AsyncClient) -> None:
    """Unknown ids answer 404; a destroyed workspace answers 410 to exec and stays visible as destroyed."""
    resp = await client.post("/api/v1/agent/workspaces/doesnotexist/exec", json={"command": "true"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "workspace_not_found"
    ws = await _create(client)
    assert (await client.delete(f"/api/v1/agent/workspaces/{ws['id']}")).json()["status"] == "destroyed"
    assert (await client.delete(f"/api/v1/agent/workspaces/{ws['id']}")).status_code == 200
    resp = await client.post(f"/api/v1/agent/workspaces/{ws['id']}/exec", json={"command": "true"})
    assert resp.status_code == 410 and resp.json()["error"]["code"] == "workspace_destroyed"
    assert (await client.get(f"/api/v1/agent/workspaces/{ws['id']}")).json()["status"] == "destroyed"
    assert ws["id"] not in [w["id"] for w in (await client.get("/api/v1/agent/workspaces")).json()["workspaces"]]


async def test_exec_results_and_timeouts(client: httpx.AsyncClient) -> None:
    """A nonzero exit is a 200 result; a timeout is a result with timed_out true."""
    ws = await _create(client)
    base = f"/api/v1/agent/workspaces/{ws['id']}"
    result = (await client.post(f"{base}/exec", json={"command": "echo hi; exit 3"})).json()
    assert (result["exit_code"], result["stdout"], result["timed_out"]) == (3, "hi\n", False)
    result = (await client.post(f"{base}/exec", json={"command": "sleep 30", "timeout_s": 0.5})).json()
    assert result["timed_out"] is True and result["exit_code"] == 137
    argv = await client.post(f"{base}/exec", json={"command": "echo", "args": ["$(id)"], "mode": "argv"})
    assert argv.json()["stdout"] == "$(id)\n"
    bad = await client.post(f"{base}/exec", json={"command": "true", "mode": "zsh"})
    assert bad.status_code == 400 and "mode" in bad.json()["error"]["message"]


async def test_stop_blocks_exec_and_resume_restores(client: httpx.AsyncClient) -> None:
    """A stopped workspace refuses exec with 409 until it is resumed; files survive."""
    ws = await _create(client)
    base = f"/api/v1/agent/workspaces/{ws['id']}"
    assert (await client.put(f"{base}/files", params={"path": "keep.txt"}, content=b"kept")).status_code == 200
    assert (await client.post(f"{base}/stop")).json()["status"] == "stopped"
    resp = await client.post(f"{base}/exec", json={"command": "true"})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "workspace_state_conflict"
    assert (await client.post(f"{base}/resume")).json()["status"] == "ready"
    assert (await client.get(f"{base}/files", params={"path": "keep.txt"})).content == b"kept"


async def test_file_routes(client: httpx.AsyncClient) -> None:
    """Write, read, stat, list, glob, move, chmod and delete work through the file routes."""
    ws = await _create(client)
    base = f"/api/v1/agent/workspaces/{ws['id']}/files"
    payload = bytes(range(256)) * 10
    put = await client.put(base, params={"path": "src/a.bin"}, content=payload)
    assert put.json() == {"path": "/workspace/src/a.bin", "bytes_written": len(payload)}
    assert (await client.get(base, params={"path": "/workspace/src/a.bin"})).content == payload
    stat = (await client.get(f"{base}/stat", params={"path": "src/a.bin"})).json()
    assert (stat["type"], stat["size"]) == ("file", len(payload))
    listing = (await client.get(f"{base}/list", params={"path": "src"})).json()
    assert [e["name"] for e in listing["entries"]] == ["a.bin"]
    assert (await client.post(f"{base}/move", json={"src": "src/a.bin", "dst": "dst/b.bin"})).status_code == 204
    assert (await client.get(f"{base}/glob", params={"pattern": "**/*.bin"})).json()["paths"] == [
        "/workspace/dst/b.bin"
    ]
    assert (await client.post(f"{base}/chmod", json={"path": "dst/b.bin", "mode": "0600"})).status_code == 204
    assert (await client.get(f"{base}/stat", params={"path": "dst/b.bin"})).json()["mode"] == "0600"
    assert (await client.delete(base, params={"path": "dst", "recursive": "true"})).status_code == 204
    missing = await client.get(base, params={"path": "dst/b.bin"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"


@pytest.mark.parametrize(
    ("path", "needle"),
    [("", "non-empty"), ("a\x00b", "NUL"), ("../etc/passwd", "outside /workspace"), ("/etc/passwd", "outside")],
)
async def test_bad_file_paths_are_refused(client: httpx.AsyncClient, path: str, needle: str) -> None:
    """Empty paths, NUL bytes and paths outside /workspace get a 400 naming the problem."""
    ws = await _create(client)
    resp = await client.get(f"/api/v1/agent/workspaces/{ws['id']}/files", params={"path": path})
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]
    bad_mode = await client.post(f"/api/v1/agent/workspaces/{ws['id']}/files/chmod", json={"path": "x", "mode": "rwx"})
    assert bad_mode.status_code == 400 and "octal" in bad_mode.json()["error"]["message"]


async def test_providers_endpoint_reports_health(client: httpx.AsyncClient, providers: dict[str, FakeProvider]) -> None:
    """The providers endpoint lists each provider with status, last check, active count and capabilities."""
    await _create(client)
    data = (await client.get("/api/v1/agent/workspaces/providers")).json()["providers"]
    by_name = {p["name"]: p for p in data}
    assert set(by_name) == {"gvisor", "docker"}
    assert by_name["gvisor"]["status"] == "healthy"
    assert by_name["gvisor"]["active_workspaces"] == 1
    assert by_name["gvisor"]["last_check"] is not None
    assert "isolation" in by_name["gvisor"]["capabilities"]


# --- bad input never falls back; every answer names its isolation -------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "code", "needles"),
    [
        ({"base_image": "Not A Valid:Reference!"}, 400, "invalid_request", ["base_image", "name[:tag]"]),
        ({"base_image": "corral/workspace:a:b"}, 400, "invalid_request", ["base_image"]),
        ({"resource_limits": {"cpu": 64}}, 422, "resource_limit", ["resource_limits.cpu", "64 CPUs", "has 4"]),
        ({"resource_limits": {"memory": "999T"}}, 422, "resource_limit", ["resource_limits.memory", "16 GiB"]),
        ({"provider": "gvisor", "resource_limits": {"cpu": "5"}}, 422, "resource_limit", ["resource_limits.cpu"]),
        ({"provider": "docker"}, 403, "provider_not_allowed", ["CORRAL_ALLOW_DOCKER_FALLBACK"]),
    ],
)
async def test_bad_input_is_refused_before_any_provider_is_tried(
    strict_client: httpx.AsyncClient,
    providers: dict[str, FakeProvider],
    body: dict[str, object],
    status: int,
    code: str,
    needles: list[str],
) -> None:
    """A malformed image, limits beyond the host (4 CPUs, 16 GiB here) or plain docker while it is not allowed get
    a 4xx naming the problem, and no provider's create is ever called (so nothing falls back)."""
    resp = await strict_client.post("/api/v1/agent/workspaces", json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code
    for needle in needles:
        assert needle in error["message"]
    assert create_calls(providers) == []


async def test_limits_the_host_has_are_accepted(strict_client: httpx.AsyncClient) -> None:
    """Exactly the host's CPUs and memory are fine: only more than the host has is refused."""
    ws = await _create(strict_client, resource_limits={"cpu": 4, "memory": "16G"})
    assert ws["resource_limits"] == {"cpu": "4", "memory": "16G", "disk": "10G"}


async def test_auto_never_uses_docker_by_default(
    strict_client: httpx.AsyncClient, providers: dict[str, FakeProvider]
) -> None:
    """With CORRAL_ALLOW_DOCKER_FALLBACK unset, a gVisor failure is a 503; plain docker is not tried."""
    providers["gvisor"].fail_create = "runsc missing"
    resp = await strict_client.post("/api/v1/agent/workspaces", json={})
    assert resp.status_code == 503
    assert [a["provider"] for a in resp.json()["error"]["details"]["attempts"]] == ["gvisor"]
    assert [name for name, _ in create_calls(providers)] == ["gvisor"]


async def test_explicit_docker_is_served_when_the_operator_allows_it(client: httpx.AsyncClient) -> None:
    """With CORRAL_ALLOW_DOCKER_FALLBACK=true an explicit docker request works, says container and warns."""
    ws = await _create(client, provider="docker")
    assert (ws["provider"], ws["isolation"]) == ("docker", "container")
    assert any("isolation is reduced" in w for w in ws["warnings"])  # type: ignore[attr-defined]


async def test_every_workspace_answer_names_its_isolation(client: httpx.AsyncClient) -> None:
    """Create, get, list, stop, resume and delete answers carry the isolation of the workspace's provider."""
    ws = await _create(client)
    assert ws["isolation"] == "gvisor"
    base = f"/api/v1/agent/workspaces/{ws['id']}"
    answers = [
        (await client.get(base)).json(),
        (await client.get("/api/v1/agent/workspaces")).json()["workspaces"][0],
        (await client.post(f"{base}/stop")).json(),
        (await client.post(f"{base}/resume")).json(),
        (await client.delete(base)).json(),
    ]
    assert [a["isolation"] for a in answers] == ["gvisor"] * 5


async def test_a_failed_workspace_has_no_isolation(
    client: httpx.AsyncClient, providers: dict[str, FakeProvider]
) -> None:
    """A workspace no provider could create, kept with keep_failed=true, answers isolation null."""
    for provider in providers.values():
        provider.fail_create = "down"
    resp = await client.post("/api/v1/agent/workspaces", params={"keep_failed": "true"}, json={})
    assert resp.status_code == 503
    [record] = (await client.get("/api/v1/agent/workspaces")).json()["workspaces"]
    assert (record["status"], record["isolation"]) == ("error", None)
    assert record["id"] == resp.json()["error"]["details"]["workspace_id"]
    assert [a["provider"] for a in record["provider_attempts"]] == ["gvisor", "docker"]
    assert (record["idle_timeout_s"], record["expires_at"]) == (3600.0, None)  # not ready: nothing to expire


async def test_a_failed_create_leaves_no_record_unless_kept(
    client: httpx.AsyncClient, providers: dict[str, FakeProvider]
) -> None:
    """A create failing on every provider answers 503 with the attempts and leaves nothing in the list."""
    for provider in providers.values():
        provider.fail_create = "down"
    resp = await client.post("/api/v1/agent/workspaces", json={"base_image": "corral/nothing:here"})
    assert resp.status_code == 503
    error = resp.json()["error"]
    assert [a["provider"] for a in error["details"]["attempts"]] == ["gvisor", "docker"]
    assert "workspace_id" not in error["details"]
    assert (await client.get("/api/v1/agent/workspaces")).json()["workspaces"] == []
    assert all(any(c[0] == "create" for c in p.calls) for p in providers.values())  # both were really tried


async def test_session_answers_name_their_workspace_isolation(client: httpx.AsyncClient) -> None:
    """A session answers the isolation of its workspace once it has one, and null when it has none."""
    typed = await client.post("/api/v1/agent-types", json={"name": "coder", "workspace": {"enabled": True}})
    assert typed.status_code == 201, typed.text
    started = await client.post("/api/v1/agent/sessions", json={"agent_type_id": typed.json()["id"]})
    assert started.status_code == 201, started.text
    session = started.json()
    deadline = time.monotonic() + 10
    while session["status"] == "provisioning" and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        session = (await client.get(f"/api/v1/agent/sessions/{session['id']}")).json()
    assert (session["status"], session["isolation"]) == ("active", "gvisor")
    assert session["idle_timeout_s"] == 3600.0 and session["expires_at"].endswith("Z")  # the default idle timeout
    ended = (await client.delete(f"/api/v1/agent/sessions/{session['id']}")).json()
    assert ended["isolation"] == "gvisor"  # the (now destroyed) workspace's
    assert ended["expires_at"] is None
    bare = await client.post("/api/v1/agent-types", json={"name": "chat"})
    plain = (await client.post("/api/v1/agent/sessions", json={"agent_type_id": bare.json()["id"]})).json()
    assert (plain["workspace_id"], plain["isolation"]) == (None, None)
