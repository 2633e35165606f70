"""E2B's default sandbox comes from a warm pool of its own (CORRAL_E2B_WARM_POOL_SIZE), over the fake provider.

E2B sandboxes are networked unless told otherwise, so they never match the isolated default pool; the E2B API
registers a pool of exactly their shape when it is mounted. tests/e2e/test_e2b_warm_pool.py checks the same with the
unmodified SDK against a real gVisor server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from corral.api.app import create_app
from corral.orchestrator.service import WorkspaceService
from corral.providers.fake import FakeProvider
from corral.settings import Settings

pytestmark = pytest.mark.unit

TOKEN = "unit-test-token"
DEADLINE_S = 10.0


async def _app(tmp_path: Path, fake: FakeProvider, **settings: Any) -> AsyncIterator[FastAPI]:
    config = Settings(data_dir=tmp_path, api_token=TOKEN, providers="gvisor", **settings)
    application = create_app(config, providers={"gvisor": fake})
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    """An app whose only pool is E2B's (one warm workspace), over the fake provider as ``gvisor``."""
    async for application in _app(tmp_path, FakeProvider("gvisor"), warm_pool_size=0, e2b_warm_pool_size=1):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client carrying the API key, as the SDK sends it."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://corral", headers={"X-API-KEY": TOKEN}) as http:
        yield http


def _service(app: FastAPI) -> WorkspaceService:
    service: WorkspaceService = app.state.service
    return service


async def _e2b_pool(app: FastAPI) -> dict[str, Any]:
    service = _service(app)
    assert service.pools is not None
    [pool] = [p for p in await service.pools.status() if p["network"] == "default"]
    return pool


async def _full(app: FastAPI) -> dict[str, Any]:
    """The E2B pool's status once it holds its target with nothing being created (polled, with a deadline)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        pool = await _e2b_pool(app)
        if pool["size"] >= pool["target"] and pool["creating"] == 0:
            return pool
        assert time.monotonic() < deadline, f"the E2B pool did not fill within {DEADLINE_S:g} s: {pool}"
        await asyncio.sleep(0.01)


async def test_e2b_create_is_served_from_its_pool_and_the_pool_refills(app: FastAPI, client: httpx.AsyncClient) -> None:
    """A default E2B create gets the pool's warm workspace (a hit, no miss), with its metadata, envs and timer; the
    pool then refills with a new workspace."""
    before = await _full(app)
    assert (before["provider"], before["network"], before["target"]) == ("gvisor", "default", 1)
    service = _service(app)
    [warm] = await service.warm_records(before["key"], ("ready",))

    answer = await client.post(
        "/e2b/v2/sandboxes",
        json={"templateID": "base", "metadata": {"team": "corral"}, "envVars": {"GREETING": "hi"}, "timeout": 60},
    )
    assert answer.status_code == 201, answer.text
    sandbox_id = answer.json()["sandboxID"]
    assert sandbox_id == warm.id
    record = await service.get(sandbox_id)
    assert record.from_warm_pool and record.pool_key is None and record.network == "default"
    assert (await app.state.e2b.envs(sandbox_id)) == {"GREETING": "hi"}
    detail = (await client.get(f"/e2b/sandboxes/{sandbox_id}")).json()
    assert detail["metadata"] == {"team": "corral"} and detail["allowInternetAccess"] is True
    assert detail["endAt"] != "9999-12-31T23:59:59.000000Z"  # the E2B timeout is armed on the claimed workspace

    after = await _full(app)
    assert (after["hits"], after["misses"]) == (1, 0)
    [refilled] = await service.warm_records(after["key"], ("ready",))
    assert refilled.id != sandbox_id
    listed = (await client.get("/e2b/v2/sandboxes")).json()
    assert [s["sandboxID"] for s in listed] == [sandbox_id]  # the refilled warm workspace is no sandbox yet


async def test_isolated_e2b_create_does_not_take_the_networked_pool(app: FastAPI, client: httpx.AsyncClient) -> None:
    """allow_internet_access false asks for another shape: the networked pool keeps its workspace."""
    before = await _full(app)
    answer = await client.post("/e2b/v2/sandboxes", json={"templateID": "base", "allow_internet_access": False})
    assert answer.status_code == 201, answer.text
    record = await _service(app).get(answer.json()["sandboxID"])
    assert not record.from_warm_pool and record.network == "isolated"
    after = await _e2b_pool(app)
    assert (after["hits"], after["size"]) == (0, before["size"])


async def test_size_zero_registers_no_e2b_pool(tmp_path: Path) -> None:
    """CORRAL_E2B_WARM_POOL_SIZE=0 turns the pool off: no pool is configured and nothing is created ahead."""
    fake = FakeProvider("gvisor")
    async for application in _app(tmp_path, fake, warm_pool_size=0, e2b_warm_pool_size=0):
        service = _service(application)
        assert service.pools is not None and service.pools.specs == []
        assert await service.store.workspaces.list() == []
