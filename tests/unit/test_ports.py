"""Preview hosts and the ports proxy's checks over the fake provider, in process: host parsing, the domain and traffic
token the E2B API answers, and the refusals that come before any connection (tests/e2e/test_e2b_ports.py proxies to
real servers in gVisor sandboxes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from corral.api.app import create_app
from corral.api.ports import parse_preview_host
from corral.providers.fake import FakeProvider
from corral.settings import Settings

pytestmark = pytest.mark.unit

TOKEN = "unit-test-token"
DOMAIN = "corral.test"


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    """The app over the fake provider (as ``gvisor``, which cannot dial ports), with the preview domain set."""
    settings = Settings(
        data_dir=tmp_path,
        api_token=TOKEN,
        providers="gvisor",
        warm_pool_size=0,
        e2b_warm_pool_size=0,
        sandbox_domain=DOMAIN,
    )
    application = create_app(settings, providers={"gvisor": FakeProvider("gvisor")})
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client carrying the API key, as the SDK sends it."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://corral", headers={"X-API-KEY": TOKEN}) as http:
        yield http


async def _create(client: httpx.AsyncClient, **body: object) -> dict[str, Any]:
    answer = await client.post("/e2b/v2/sandboxes", json={"templateID": "base", **body})
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("3000-abc123.corral.test", (3000, "abc123")),
        ("3000-abc123.corral.test:8000", (3000, "abc123")),
        ("3000-ABC123.Corral.Test.", (3000, "abc123")),
        ("corral.test", None),
        ("127.0.0.1:8000", None),
        ("3000-abc123.other.test", None),
        ("web.corral.test", False),
        ("3000-abc.def.corral.test", False),
        ("70000-abc123.corral.test", False),
        ("0-abc123.corral.test", False),
    ],
)
def test_parse_preview_host(host: str, expected: object) -> None:
    """A host under the domain is ``{port}-{id}`` (port 1-65535, any ``:port`` suffix and case ignored); other
    hosts are not preview hosts, and a malformed one under the domain is told apart from them."""
    assert parse_preview_host(host, DOMAIN) == expected


async def test_create_answers_the_domain_and_a_traffic_token_only_when_private(client: httpx.AsyncClient) -> None:
    """Create answers CORRAL_SANDBOX_DOMAIN as ``domain`` (what get_host builds on) and a traffic access token only
    for ``allowPublicTraffic: false``, stable for the sandbox; the sandbox's detail answers the domain too."""
    public = await _create(client)
    assert public["domain"] == DOMAIN
    assert public["trafficAccessToken"] is None
    private = await _create(client, network={"allowPublicTraffic": False})
    assert isinstance(private["trafficAccessToken"], str) and len(private["trafficAccessToken"]) >= 32
    assert private["trafficAccessToken"] != private["envdAccessToken"]
    connected = await client.post(f"/e2b/sandboxes/{private['sandboxID']}/connect", json={"timeout": 60})
    assert connected.json()["trafficAccessToken"] == private["trafficAccessToken"]
    detail = await client.get(f"/e2b/sandboxes/{public['sandboxID']}")
    assert detail.json()["domain"] == DOMAIN
    bad = await client.post("/e2b/v2/sandboxes", json={"templateID": "base", "network": {"allowPublicTraffic": 1}})
    assert bad.status_code == 400


async def test_refusals_before_dialling(client: httpx.AsyncClient) -> None:
    """Unknown sandbox 404 and a private one without (or with a wrong) token 403, in E2B's proxy shape, without a
    Corral token; a provider that cannot dial ports answers 501 naming it; the path route needs the bearer token."""
    private = await _create(client, network={"allowPublicTraffic": False})
    sandbox_id, token = private["sandboxID"], private["trafficAccessToken"]
    host = f"3000-{sandbox_id}.{DOMAIN}"
    bare = {"X-API-KEY": ""}

    unknown = await client.get("/", headers={**bare, "Host": f"3000-0123456789abcdef.{DOMAIN}"})
    assert unknown.status_code == 404
    assert unknown.json() == {"code": 404, "message": "The sandbox was not found", "sandboxId": "0123456789abcdef"}
    missing = await client.get("/x", headers={**bare, "Host": host})
    assert missing.status_code == 403
    assert "'e2b-traffic-access-token' is missing" in missing.json()["message"]
    wrong = await client.get("/x", headers={**bare, "Host": host, "e2b-traffic-access-token": token[::-1]})
    assert wrong.status_code == 403
    assert "is invalid" in wrong.json()["message"]
    allowed = await client.get("/x", headers={**bare, "Host": host, "e2b-traffic-access-token": token})
    assert allowed.status_code == 501
    assert "cannot reach ports" in allowed.json()["message"]

    path = f"/api/v1/agent/workspaces/{sandbox_id}/ports/3000/x"
    assert (await client.get(path, headers=bare)).status_code == 401
    by_path = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert by_path.status_code == 501
    assert by_path.json()["error"]["code"] == "port_tunnel_unavailable"
    bad_port = await client.get(
        f"/api/v1/agent/workspaces/{sandbox_id}/ports/99999/", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert bad_port.status_code == 400


async def test_without_a_domain_hosts_are_not_routed(tmp_path: Path) -> None:
    """With CORRAL_SANDBOX_DOMAIN unset, a host shaped like a preview host is Corral's API as any other, and create
    answers no domain (the SDK then falls back to E2B_DOMAIN)."""
    settings = Settings(data_dir=tmp_path, api_token=TOKEN, providers="gvisor", warm_pool_size=0, e2b_warm_pool_size=0)
    application = create_app(settings, providers={"gvisor": FakeProvider("gvisor")})
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as http:
            health = await http.get("/healthz", headers={"Host": f"3000-0123456789abcdef.{DOMAIN}"})
            assert health.status_code == 200
            created = await http.post("/e2b/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": TOKEN})
            assert created.json()["domain"] is None
