"""The manager, its HTTP API and the firecracker provider on hosts that cannot run VMs (simulated probe answers)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from corral.errors import (
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    SnapshotNotFoundError,
    WorkspaceNotFoundError,
)
from corral.microvm.manager import CreateVM, FirecrackerManager, ManagerConfig, config_from_settings
from corral.microvm.readiness import Check, Readiness, ReadinessConfig
from corral.microvm.server import create_manager_app
from corral.providers.base import ExecRequest, ResourceLimits, WorkspaceProvider, WorkspaceSpec, WorkspaceState
from corral.providers.firecracker import FirecrackerProvider, from_settings
from corral.settings import Settings
from corral.testing.microvm import usable_probe

pytestmark = pytest.mark.unit

REASON = "KVM not available: /dev/kvm is backed by PVM (kvm_pvm module); and the firecracker binary is not installed"
BAD = Readiness(
    usable=False,
    reason=REASON,
    checks=(
        Check("kvm_device", ok=True, detail="/dev/kvm opened read-write"),
        Check("pvm", ok=False, detail="/dev/kvm is backed by PVM"),
    ),
)


def bad_probe(config: ReadinessConfig) -> Readiness:
    del config
    return BAD


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The manager's HTTP API on an unusable host, through ASGI."""
    manager = FirecrackerManager(ManagerConfig(state_dir=tmp_path / "fc"), probe=bad_probe)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_manager_app(manager)), base_url="http://m"
    ) as client:
        yield client


def test_limits_become_whole_vcpus_and_mib() -> None:
    """Default limits are 2 vCPUs, 4096 MiB and 10 GiB; 4/8G/20G are kept; fractional CPUs round up."""
    default = ResourceLimits()
    assert CreateVM.from_limits("a", cpu=default.cpu, memory_bytes=default.memory_bytes,
                                disk_bytes=default.disk_bytes) == CreateVM("a", 2, 4096, 10 * 1024**3)  # fmt: skip
    custom = ResourceLimits.parse({"cpu": "4", "memory": "8G", "disk": "20G"})
    request = CreateVM.from_limits("b", cpu=custom.cpu, memory_bytes=custom.memory_bytes, disk_bytes=custom.disk_bytes)
    assert (request.vcpu_count, request.mem_size_mib, request.disk_bytes) == (4, 8192, 20 * 1024**3)
    assert CreateVM.from_limits("c", cpu=0.5, memory_bytes=100 * 1024**2, disk_bytes=1).vcpu_count == 1


async def test_health_on_an_unusable_host(api: httpx.AsyncClient) -> None:
    """GET /health is 200 with status unhealthy, KVM's reason and checks, counts, pool, resources and errors."""
    response = await api.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "unhealthy"
    assert body["kvm"]["available"] is False
    assert body["kvm"]["reason"] == REASON
    assert {c["name"] for c in body["kvm"]["checks"]} == {"kvm_device", "pvm"}
    assert (body["active_vms"], body["stopped_vms"], body["max_vms"]) == (0, 0, 32)
    assert body["warm_pool"] == {"target": 0, "ready": 0, "disk_bytes": 10 * 1024**3, "hits": 0, "misses": 0}
    assert body["resources"]["cpu_count"] >= 1
    assert body["resources"]["memory_total_bytes"] > 0
    assert body["resources"]["disk_free_bytes"] > 0
    assert body["errors"] == []


async def test_create_is_refused_with_the_kvm_reason(api: httpx.AsyncClient, tmp_path: Path) -> None:
    """POST /vms answers 503 provider_unavailable whose reason begins "KVM not available"; nothing is written."""
    response = await api.post("/vms", json={"id": "vm1"})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "provider_unavailable"
    assert error["details"]["reason"].startswith("KVM not available")
    assert error["message"] == f"firecracker: {REASON}"
    assert not (tmp_path / "fc").exists()


async def test_api_errors_have_corrals_shape(api: httpx.AsyncClient) -> None:
    """Unknown VMs are 404, bad bodies 400, and destroying an unknown VM is a 204 no-op."""
    assert (await api.get("/vms")).json() == {"vms": []}
    missing = await api.get("/vms/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "workspace_not_found"
    assert (await api.post("/vms/nope/stop")).status_code == 404
    assert (await api.post("/vms/nope/resume")).status_code == 404
    assert (await api.delete("/vms/nope")).status_code == 204
    bad = await api.post("/vms", json={"id": "x", "colour": "red"})
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_request"
    assert "colour" in bad.json()["error"]["message"]
    limits = await api.post("/vms", json={"id": "x", "resource_limits": {"memory": "lots"}})
    assert limits.status_code == 400


async def test_limits_are_checked_before_anything_is_made(tmp_path: Path) -> None:
    """On a usable host, too many vCPUs, too much memory or a bad id is refused without touching the host."""
    manager = FirecrackerManager(ManagerConfig(state_dir=tmp_path / "fc"), probe=usable_probe)
    with pytest.raises(ResourceLimitError, match="1 to 32"):
        await manager.create(CreateVM("vm", vcpu_count=33))
    with pytest.raises(ResourceLimitError, match="this host has"):
        await manager.create(CreateVM("vm", mem_size_mib=1 << 30))
    with pytest.raises(InvalidRequestError, match="not a valid VM id"):
        await manager.create(CreateVM("../escape"))
    with pytest.raises(ProviderUnavailableError, match="no guest kernel or rootfs configured"):
        await manager.create(CreateVM("vm"))
    assert not (tmp_path / "fc").exists()


async def test_readiness_is_cached(tmp_path: Path) -> None:
    """The probe runs once per 10 s of the manager's clock, however often health is asked."""
    now = [0.0]
    calls = []

    def counting(config: ReadinessConfig) -> Readiness:
        calls.append(config)
        return BAD

    manager = FirecrackerManager(ManagerConfig(state_dir=tmp_path), probe=counting, clock=lambda: now[0])
    await manager.health()
    now[0] = 9.9
    await manager.health()
    assert len(calls) == 1
    now[0] = 10.0
    await manager.health()
    assert len(calls) == 2


# --- the provider -------------------------------------------------------------------------------------------------


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[FirecrackerProvider]:
    """The provider over an in-process manager on an unusable host."""
    manager = FirecrackerManager(ManagerConfig(state_dir=tmp_path / "fc"), probe=bad_probe)
    prov = FirecrackerProvider(manager=manager)
    yield prov
    await prov.aclose()


async def test_provider_health_and_create_on_an_unusable_host(provider: FirecrackerProvider) -> None:
    """health carries the reason and per-check details; create raises ProviderUnavailableError with the reason."""
    assert isinstance(provider, WorkspaceProvider)
    health = await provider.health()
    assert (health.healthy, health.error) == (False, REASON)
    assert health.details["pvm"] == {"ok": False, "detail": "/dev/kvm is backed by PVM", "skipped": False}
    assert cast("dict[str, Any]", health.details["manager"])["active_vms"] == 0
    with pytest.raises(ProviderUnavailableError) as caught:
        await provider.create(WorkspaceSpec(id="ws1", image="corral/workspace:base"))
    assert str(caught.value) == f"firecracker: {REASON}"
    assert caught.value.reason == REASON
    readiness = await provider.readiness()
    assert (readiness.usable, readiness.reason) == (False, REASON)


async def test_provider_capabilities_carry_kvm_and_resources(provider: FirecrackerProvider) -> None:
    """capabilities describe microVMs and carry whether KVM is usable and why, with the host's resources."""
    caps = await provider.capabilities()
    assert (caps.isolation, caps.disk_limit, caps.requirements) == ("microvm", "enforced", ("kvm", "firecracker"))
    assert (caps.persistence, caps.snapshots, caps.pause) == ("full", "memory", "memory")
    assert (caps.warm_pool, caps.streaming) == (True, True)
    assert caps.resources["kvm_usable"] is False
    assert caps.resources["reason"] == REASON
    assert caps.resources["max_vms"] == 32
    assert cast("int", caps.resources["memory_total_bytes"]) > 0


async def test_provider_unknown_workspace(provider: FirecrackerProvider) -> None:
    """Unknown ids: destroy is a no-op, state is missing, the list is empty, other calls raise not found."""
    await provider.destroy("ws-1")
    assert await provider.state("ws-1") is WorkspaceState.MISSING
    assert await provider.list_workspaces() == []
    with pytest.raises(WorkspaceNotFoundError, match="workspace ws-1 does not exist"):
        await provider.exec("ws-1", ExecRequest("true"))
    with pytest.raises(WorkspaceNotFoundError):
        await provider.read_file("ws-1", "/workspace/a")
    with pytest.raises(WorkspaceNotFoundError):
        await provider.stop("ws-1")
    with pytest.raises(WorkspaceNotFoundError):
        await provider.resume("ws-1")


async def test_provider_with_an_unreachable_manager(tmp_path: Path) -> None:
    """A manager URL nobody serves makes health unhealthy and create fail with "unreachable"."""
    provider = FirecrackerProvider(manager_url=f"unix:{tmp_path / 'nobody.sock'}")
    try:
        health = await provider.health()
        assert not health.healthy
        assert "is unreachable" in str(health.error)
        with pytest.raises(ProviderUnavailableError, match="unreachable"):
            await provider.create(WorkspaceSpec(id="ws1", image="corral/workspace:base"))
        caps = await provider.capabilities()
        assert caps.resources["kvm_usable"] is False
    finally:
        await provider.aclose()


async def test_from_settings_in_process_and_remote(tmp_path: Path) -> None:
    """Without a manager URL the manager runs in-process under data_dir; with one the provider is its client."""
    settings = Settings(data_dir=tmp_path, firecracker_kernel="/k/vmlinux", firecracker_rootfs="/r.ext4")
    local = from_settings(settings)
    assert local.manager is not None
    assert local.manager.config.state_dir == (tmp_path / "firecracker").resolve()
    assert local.config == ReadinessConfig(kernel_path="/k/vmlinux", rootfs_path="/r.ext4")
    remote = from_settings(cast("Settings", SimpleNamespace(firecracker_manager_url="http://fc:8100")))
    assert (remote.manager, remote.manager_url) == (None, "http://fc:8100")
    await local.aclose()
    await remote.aclose()
    config = config_from_settings(cast("Settings", SimpleNamespace(
        data_dir=tmp_path, firecracker_subnet="10.50.0.0/20", firecracker_max_vms=4, firecracker_dns="1.1.1.1, 9.9.9.9",
        firecracker_warm_pool_size=2, default_disk="2G", firecracker_netns="ns-x",
    )))  # fmt: skip
    assert (config.network.subnet, config.network.dns, config.network.netns) == (
        "10.50.0.0/20", ("1.1.1.1", "9.9.9.9"), "ns-x",
    )  # fmt: skip
    assert (config.max_vms, config.warm_pool_size, config.warm_disk_bytes) == (4, 2, 2 * 1024**3)


async def test_snapshot_and_pause_routes_on_an_unusable_host(api: httpx.AsyncClient) -> None:
    """Pause, snapshot and snapshot routes answer in Corral's error shape: 404 for unknown VMs and snapshots, 400
    for bad snapshot ids, 204 for deleting a snapshot that is not there."""
    assert (await api.get("/snapshots")).json() == {"snapshots": []}
    assert (await api.post("/vms/nope/pause")).json()["error"]["code"] == "workspace_not_found"
    bad = await api.post("/vms/nope/snapshots/Bad_Id")
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_request")
    assert "not a valid snapshot id" in bad.json()["error"]["message"]
    missing = await api.post("/vms/nope/snapshots/s1")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "workspace_not_found")
    gone = await api.get("/snapshots/s1")
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "snapshot_not_found")
    assert (await api.delete("/snapshots/s1")).status_code == 204
    from_bad = await api.post("/vms", json={"id": "x", "from_snapshot": "../etc"})
    assert (from_bad.status_code, from_bad.json()["error"]["code"]) == (400, "invalid_request")


async def test_restore_from_a_missing_snapshot_makes_nothing(tmp_path: Path) -> None:
    """On a usable host a create from an unknown snapshot raises SnapshotNotFoundError before touching the host."""
    manager = FirecrackerManager(ManagerConfig(state_dir=tmp_path / "fc"), probe=usable_probe)
    with pytest.raises(SnapshotNotFoundError, match="snapshot gone does not exist"):
        await manager.create(CreateVM("vm"), from_snapshot="gone")
    assert not (tmp_path / "fc" / "vms").exists()
    provider = FirecrackerProvider(manager=manager)
    try:
        with pytest.raises(SnapshotNotFoundError):
            await provider.restore(WorkspaceSpec(id="ws1", image="corral/workspace:base"), "gone")
        assert await provider.list_snapshots() == []
        await provider.delete_snapshot("gone")
    finally:
        await provider.aclose()
