"""The standalone manager process (``python -m corral.microvm.server``, what ``corral firecracker-manager`` runs)
and the provider as its HTTP client, on this host's real readiness."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.errors import ProviderUnavailableError
from corral.microvm.manager import readiness_config_from_settings
from corral.microvm.readiness import probe
from corral.providers.base import WorkspaceSpec
from corral.providers.firecracker import FirecrackerProvider
from corral.settings import Settings

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def manager_url(tmp_path: Path) -> Iterator[str]:
    """A standalone manager on a free loopback port, stopped (and checked to exit) afterwards."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_FIRECRACKER_MANAGER")}
    env["CORRAL_DATA_DIR"] = str(tmp_path)
    with (tmp_path / "manager.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral.microvm.server", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, (tmp_path / "manager.log").read_text()
        try:
            httpx.get(f"{url}/health", timeout=1)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the manager did not start serving"
            time.sleep(0.05)
    yield url
    proc.terminate()
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status says what ended it
    assert proc.wait(10) in (0, -15)
    assert "Finished server process" in (tmp_path / "manager.log").read_text()


def test_health_tells_the_truth_about_this_host(manager_url: str) -> None:
    """GET /health reports KVM usability with the probe's own reason, and the counts and resources."""
    expected = probe(readiness_config_from_settings(Settings()))
    body = httpx.get(f"{manager_url}/health", timeout=10).json()
    assert body["kvm"]["available"] is expected.usable
    assert body["kvm"]["reason"] == expected.reason
    assert body["status"] == ("healthy" if expected.usable else "unhealthy")
    assert (body["active_vms"], body["stopped_vms"]) == (0, 0)
    assert set(body["resources"]) >= {"cpu_count", "memory_total_bytes", "memory_available_bytes", "disk_free_bytes"}
    assert body["warm_pool"]["ready"] == 0
    assert isinstance(body["errors"], list)


async def test_provider_through_the_standalone_manager(manager_url: str) -> None:
    """The provider as an HTTP client: health mirrors the manager, and create fails with "KVM not available"."""
    expected = probe(readiness_config_from_settings(Settings()))
    provider = FirecrackerProvider(manager_url=manager_url)
    try:
        health = await provider.health()
        assert health.healthy is expected.usable
        assert await provider.list_workspaces() == []
        if expected.usable:
            return  # a KVM host: creation is covered by the needs_kvm test
        assert health.error == expected.reason
        assert health.error is not None
        assert health.error.startswith("KVM not available: ")
        with pytest.raises(ProviderUnavailableError) as caught:
            await provider.create(WorkspaceSpec(id="standalone1", image="corral/workspace:base"))
        assert str(caught.value).startswith("firecracker: KVM not available: ")
        assert await provider.list_workspaces() == []
    finally:
        await provider.aclose()
