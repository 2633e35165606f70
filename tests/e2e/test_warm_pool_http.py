"""Warm pools over HTTP on gVisor: a matching request gets a warm workspace and the counters show it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, start_server, stop_server

pytestmark = pytest.mark.e2e

API = "/api/v1/agent/workspaces"


def _pool(server: Server) -> dict[str, object]:
    [pool] = server.client.get(f"{API}/pool").json()["pools"]
    return pool  # type: ignore[no-any-return]


def _wait_full(server: Server) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pool = _pool(server)
        if pool["size"] == pool["target"]:
            return
        time.sleep(0.1)
    raise AssertionError(f"pool never filled: {_pool(server)}")


def test_warm_pool_hits_misses_and_refill(tmp_path: Path) -> None:
    """The default pool fills at start with gVisor; a matching create is a hit, a different shape a counted miss,
    and the pool refills to its target."""
    server = start_server(tmp_path / "data", {"CORRAL_WARM_POOL_SIZE": "1"})
    try:
        _wait_full(server)
        pool = _pool(server)
        assert (pool["provider"], pool["network"], pool["target"]) == ("gvisor", "isolated", 1)

        warm = server.client.post(API, json={"metadata": {"task": "warm"}}).json()
        assert warm["from_warm_pool"] is True
        assert warm["provider"] == "gvisor"
        assert warm["metadata"] == {"task": "warm"}
        run = server.client.post(f"{API}/{warm['id']}/exec", json={"command": "echo ready"}).json()
        assert run["stdout"] == "ready\n"

        cold = server.client.post(API, json={"resource_limits": {"memory": "1G"}}).json()
        assert cold["from_warm_pool"] is False

        _wait_full(server)
        pool = _pool(server)
        assert (pool["hits"], pool["misses"]) == (1, 1)
        assert pool["miss_reasons"] == {"spec mismatch": 1}
        listed = {w["id"] for w in server.client.get(API).json()["workspaces"]}
        assert listed == {warm["id"], cold["id"]}, "warm workspaces waiting in the pool are not listed"
    finally:
        stop_server(server)
