"""The Firecracker manager and provider end to end, with the Firecracker API double as the VMM.

Everything but the VMM is real: disks are clones of an ext4 rootfs built from ``corral/workspace:base`` by the
rootfs builder, networking is real TAP devices and iptables rules inside a network namespace made for each test,
the double enforces Firecracker's API and runs the rootfs's own ``/sbin/corral-init`` (chrooted on the
loop-mounted disk), and exec and file calls reach the real guest agent over the hybrid-vsock handshake. The host
namespace must hold no TAP device or tagged rule afterwards.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

from corral.errors import (
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    SnapshotNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.microvm.api_client import FirecrackerClient
from corral.microvm.manager import CreateVM, FirecrackerManager
from corral.microvm.rootfs import build_rootfs_sync
from corral.providers.base import ExecRequest, ResourceLimits, Snapshotter, WorkspaceSpec, WorkspaceState
from corral.providers.firecracker import FirecrackerProvider
from corral.testing import ProviderConformance, SpecFactory
from corral.testing.microvm import FAKE_VMM, Netns, corral_network_objects, fake_vmm_manager
from tests.conftest import BASE_IMAGE

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
GIB = 1024 * MIB
DISK = 2 * GIB
"""A small root disk that still holds the base image's root filesystem (about 1.6 GB: E2B's base template)."""
OTHER_DISK = 3 * GIB
SMALL = ResourceLimits(cpu=1, memory_bytes=256 * MIB, disk_bytes=DISK)


@pytest.fixture(scope="session")
def base_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The VM root filesystem, built once per session from the workspace base image, deleted at the end."""
    found = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"base image {BASE_IMAGE} is missing (or dockerd is down); run `make bootstrap`")
    directory = tmp_path_factory.mktemp("rootfs")
    yield build_rootfs_sync(directory / "base.ext4", image=BASE_IMAGE).path
    shutil.rmtree(directory)


@pytest.fixture(scope="session")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A stand-in guest kernel file: the double checks that it exists, as Firecracker does, but boots no kernel."""
    path = tmp_path_factory.mktemp("kernel") / "vmlinux"
    path.write_bytes(b"not a kernel: the Firecracker API double never boots it\n")
    return str(path)


@pytest.fixture
def netns() -> Iterator[Netns]:
    """A network namespace for this test, deleted afterwards; the host namespace must be left without leftovers."""
    ns = Netns.create()
    yield ns
    ns.delete()
    assert not ns.exists()
    assert corral_network_objects() == []


@pytest.fixture
async def manager(tmp_path: Path, netns: Netns, base_rootfs: str, kernel: str) -> AsyncIterator[FirecrackerManager]:
    """A manager over the double, networked in the test's namespace; every VM is destroyed afterwards."""
    mgr = fake_vmm_manager(tmp_path / "fc", netns=netns.name, rootfs=base_rootfs, kernel=kernel)
    yield mgr
    await mgr.destroy_all()
    await mgr.aclose()
    assert netns.links() == ["lo"]
    assert [r for r in netns.iptables() + netns.iptables("nat") if "corral-fc" in r] == []
    assert list((tmp_path / "fc" / "vms").iterdir()) == [] if (tmp_path / "fc" / "vms").exists() else True


@pytest.fixture
async def provider(manager: FirecrackerManager) -> AsyncIterator[FirecrackerProvider]:
    """The firecracker provider over the in-process manager (through its HTTP API)."""
    prov = FirecrackerProvider(manager=manager)
    yield prov
    await prov.aclose()


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _spec(limits: ResourceLimits = SMALL, **kwargs: object) -> WorkspaceSpec:
    return WorkspaceSpec(id=f"fc{uuid.uuid4().hex[:14]}", image=BASE_IMAGE, limits=limits, **kwargs)  # type: ignore[arg-type]


class TestFirecrackerConformance(ProviderConformance):
    """The whole conformance suite through the firecracker provider, manager, double, init, vsock and agent."""

    unexercised: ClassVar[Mapping[str, str]] = {
        "pause=memory": "the Firecracker double cannot restore guest memory; a resume boots the guest from its disk",
        "snapshots=memory": "the Firecracker double cannot restore guest memory; a restore boots from the disk copy",
    }

    @pytest.fixture
    async def provider(self, manager: FirecrackerManager) -> AsyncIterator[FirecrackerProvider]:
        prov = FirecrackerProvider(manager=manager)
        yield prov
        await prov.aclose()

    @pytest.fixture
    def spec_factory(self) -> SpecFactory:
        return _spec


# --- limits -------------------------------------------------------------------------------------------------------


async def _machine_config(manager: FirecrackerManager, vm_id: str) -> dict[str, object]:
    async with FirecrackerClient((await manager.get(vm_id)).api_socket) as client:
        return await client.request("GET", "/vm/config") or {}


async def test_default_limits_give_2_vcpus_4g_and_a_10g_disk(
    provider: FirecrackerProvider, manager: FirecrackerManager
) -> None:
    """Default limits become vcpu_count 2 and mem_size_mib 4096 over the API, and a sparse 10 GiB root disk."""
    spec = _spec(ResourceLimits())
    await provider.create(spec)
    config = await _machine_config(manager, spec.id)
    assert config["machine-config"] == {"vcpu_count": 2, "mem_size_mib": 4096, "smt": False}
    drives = cast("list[dict[str, Any]]", config["drives"])
    assert [(d["drive_id"], d["is_root_device"], d["is_read_only"]) for d in drives] == [("rootfs", True, False)]
    # relative to the VM's directory, where Firecracker runs: a snapshot records it, and a restore reopens it there
    assert drives[0]["path_on_host"] == "rootfs.ext4"
    disk = os.stat(manager.vm_dir(spec.id) / drives[0]["path_on_host"])
    assert disk.st_size == 10 * GIB
    assert disk.st_blocks * 512 < 2 * GIB, "the disk file is not sparse (it holds the 1.6 GB base and no more)"
    df = await provider.exec(spec.id, ExecRequest("df -B1 --output=size / | tail -1"))
    assert 9 * GIB < int(df.stdout) <= 10 * GIB


async def test_custom_limits_are_honoured(provider: FirecrackerProvider, manager: FirecrackerManager) -> None:
    """cpu 4, memory 8G and disk 20G become 4 vCPUs, 8192 MiB and a 20 GiB root file system."""
    spec = _spec(ResourceLimits.parse({"cpu": "4", "memory": "8G", "disk": "20G"}))
    await provider.create(spec)
    config = await _machine_config(manager, spec.id)
    assert config["machine-config"] == {"vcpu_count": 4, "mem_size_mib": 8192, "smt": False}
    assert (await manager.get(spec.id)).disk_bytes == 20 * GIB
    df = await provider.exec(spec.id, ExecRequest("df -B1 --output=size / | tail -1"))
    assert 19 * GIB < int(df.stdout) <= 20 * GIB


async def test_too_many_vcpus_is_a_resource_limit(provider: FirecrackerProvider) -> None:
    """More than Firecracker's 32 vCPUs is refused as a resource limit, and nothing is left behind."""
    with pytest.raises(ResourceLimitError, match="32"):
        await provider.create(_spec(ResourceLimits(cpu=33)))
    assert await provider.list_workspaces() == []


# --- destroy, stop, resume ----------------------------------------------------------------------------------------


async def test_destroy_running_vm_shuts_down_cleanly_and_releases_everything(
    manager: FirecrackerManager, netns: Netns
) -> None:
    """Destroy sends Ctrl-Alt-Del, the guest stops by itself, and process, TAP, rules, disk and metadata go."""
    record = await manager.create(CreateVM("destroy-me", vcpu_count=1, mem_size_mib=256, disk_bytes=DISK))
    assert record.network.tap in netns.links()
    assert "LOWER_UP" in netns.run("ip", "link", "show", record.network.tap).stdout, "the VMM did not attach the TAP"
    assert await manager.destroy("destroy-me") == "clean", "the guest did not stop within the 5 s grace period"
    assert not _alive(record.pid)
    assert record.network.tap not in netns.links()
    assert not [r for r in netns.iptables() + netns.iptables("nat") if "destroy-me" in r]
    assert not _exists(record.disk_path)
    assert not manager.vm_dir("destroy-me").exists()
    assert not _exists(record.vsock_uds)
    with pytest.raises(WorkspaceNotFoundError):
        await manager.get("destroy-me")
    assert await manager.destroy("destroy-me") is None


async def test_destroy_kills_a_vm_that_ignores_ctrl_alt_del(manager: FirecrackerManager) -> None:
    """A VMM that does not stop within the grace period is killed, and its resources are released all the same."""
    fast = manager.with_config(shutdown_grace_s=0.5)
    record = await fast.create(CreateVM("stuck", vcpu_count=1, mem_size_mib=256, disk_bytes=DISK))
    assert record.pid is not None
    os.kill(record.pid, signal.SIGSTOP)  # a wedged VMM: the API does not answer and nothing shuts down
    started = time.monotonic()
    assert await fast.destroy("stuck") == "killed"
    assert time.monotonic() - started < 5
    assert not _exists(record.disk_path)
    await fast.aclose()


async def test_stop_keeps_disk_and_network_and_resume_reattaches_the_same_disk(
    provider: FirecrackerProvider, manager: FirecrackerManager, netns: Netns
) -> None:
    """Stop ends the VM but keeps disk file, TAP and metadata; resume boots a new VMM on the same disk file."""
    spec = _spec()
    await provider.create(spec)
    await provider.write_file(spec.id, "/workspace/kept.txt", b"survives stop")
    before = await manager.get(spec.id)
    disk_inode = os.stat(before.disk_path).st_ino
    first_pid = before.pid
    await provider.stop(spec.id)
    stopped = await manager.get(spec.id)
    assert (stopped.state, stopped.pid) == ("stopped", None)
    assert stopped.last_exit == "stopped (clean)"
    assert os.stat(stopped.disk_path).st_ino == disk_inode
    assert stopped.network.tap in netns.links()
    assert (manager.vm_dir(spec.id) / "vm.json").is_file()
    await provider.resume(spec.id)
    resumed = await manager.get(spec.id)
    assert resumed.pid not in (None, first_pid)
    assert resumed.boots == 2
    config = await _machine_config(manager, spec.id)
    drive = config["drives"][0]["path_on_host"]  # type: ignore[index]
    assert str(manager.vm_dir(spec.id) / drive) == before.disk_path
    assert os.stat(resumed.disk_path).st_ino == disk_inode
    assert (await provider.exec(spec.id, ExecRequest("cat /workspace/kept.txt"))).stdout == b"survives stop"


async def test_destroy_of_a_stopped_vm_removes_disk_network_and_metadata(
    manager: FirecrackerManager, netns: Netns
) -> None:
    """Destroying a stopped VM deletes its disk file, TAP device, rules and metadata."""
    record = await manager.create(CreateVM("stopped-one", vcpu_count=1, mem_size_mib=256, disk_bytes=DISK))
    await manager.stop("stopped-one")
    assert await manager.destroy("stopped-one") == "stopped"
    assert not _exists(record.disk_path)
    assert record.network.tap not in netns.links()
    assert not [r for r in netns.iptables() if "stopped-one" in r]
    assert not manager.vm_dir("stopped-one").exists()


async def test_a_crashed_vmm_is_reported_stopped_and_can_be_resumed(
    provider: FirecrackerProvider, manager: FirecrackerManager
) -> None:
    """When the Firecracker process dies the VM reads as stopped with the reason, and resume brings its files back."""
    spec = _spec()
    await provider.create(spec)
    await provider.write_file(spec.id, "/workspace/note.txt", b"still here")
    pid = (await manager.get(spec.id)).pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while await provider.state(spec.id) is not WorkspaceState.STOPPED:
        assert time.monotonic() < deadline, "the dead VMM was not noticed"
        await asyncio.sleep(0.05)
    assert "exited" in str((await manager.get(spec.id)).last_exit)
    await provider.resume(spec.id)
    assert (await provider.exec(spec.id, ExecRequest("cat /workspace/note.txt"))).stdout == b"still here"


# --- concurrency, limits, pool, restart ---------------------------------------------------------------------------


async def test_concurrent_creates_get_distinct_ip_tap_and_disk_up_to_the_maximum(
    tmp_path: Path, netns: Netns, base_rootfs: str, kernel: str
) -> None:
    """Four simultaneous creates against a maximum of three: three VMs with distinct resources, one refused."""
    mgr = fake_vmm_manager(tmp_path / "fc", netns=netns.name, rootfs=base_rootfs, kernel=kernel, max_vms=3)
    try:
        results = await asyncio.gather(
            *(mgr.create(CreateVM(f"vm{i}", vcpu_count=1, mem_size_mib=256, disk_bytes=DISK)) for i in range(4)),
            return_exceptions=True,
        )
        made = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(made) == 3
        assert len(refused) == 1
        assert isinstance(refused[0], ResourceLimitError)
        assert "maximum" in str(refused[0])
        assert len({r.network.guest_ip for r in made}) == 3
        assert len({r.network.tap for r in made}) == 3
        assert len({r.disk_path for r in made}) == 3
        assert len({r.guest_cid for r in made}) == 3
        assert sorted(netns.links()) == sorted(["lo", *(r.network.tap for r in made)])
        health = await mgr.health()
        assert (health["active_vms"], health["max_vms"]) == (3, 3)
    finally:
        await mgr.destroy_all()
        await mgr.aclose()


async def test_manager_restart_readopts_running_vms(manager: FirecrackerManager, provider: FirecrackerProvider) -> None:
    """A new manager over the same state directory finds the running VM, and a new provider can use it."""
    spec = _spec()
    await provider.create(spec)
    pid = (await manager.get(spec.id)).pid
    restarted = manager.with_config()
    record = await restarted.get(spec.id)
    assert (record.state, record.pid) == ("running", pid)
    other = FirecrackerProvider(manager=restarted)
    try:
        assert (await other.exec(spec.id, ExecRequest("echo adopted"))).stdout == b"adopted\n"
        await other.destroy(spec.id)
    finally:
        await other.aclose()
    assert not _alive(pid)


async def test_warm_pool_disk_is_used_and_refilled(tmp_path: Path, netns: Netns, base_rootfs: str, kernel: str) -> None:
    """A create asking for the pool's disk size takes a pre-cloned disk, and the pool is refilled afterwards."""
    mgr = fake_vmm_manager(
        tmp_path / "fc", netns=netns.name, rootfs=base_rootfs, kernel=kernel, warm_pool_size=1, warm_disk_bytes=DISK
    )
    try:
        assert await mgr.fill_pool() == 1
        record = await mgr.create(CreateVM("pooled", vcpu_count=1, mem_size_mib=256, disk_bytes=DISK))
        assert record.from_warm_pool
        other = await mgr.create(CreateVM("unpooled", vcpu_count=1, mem_size_mib=256, disk_bytes=OTHER_DISK))
        assert not other.from_warm_pool
        deadline = time.monotonic() + 30
        while (await mgr.health())["warm_pool"]["ready"] < 1:
            assert time.monotonic() < deadline, "the warm pool was not refilled"
            await asyncio.sleep(0.1)
        pool = (await mgr.health())["warm_pool"]
        assert (pool["target"], pool["ready"], pool["hits"]) == (1, 1, 1)
    finally:
        await mgr.destroy_all()
        await mgr.aclose()


async def test_health_reports_vms_resources_and_network(
    provider: FirecrackerProvider, manager: FirecrackerManager
) -> None:
    """The manager's health counts active VMs and allocations and names the subnet and the namespace."""
    spec = _spec(network="default")
    await provider.create(spec)
    health = await manager.health()
    assert health["status"] == "healthy"
    assert health["active_vms"] == 1
    assert health["resources"]["allocated_vcpus"] == 1
    assert health["resources"]["allocated_memory_bytes"] == 256 * MIB
    assert health["resources"]["memory_total_bytes"] > 0
    assert health["resources"]["disk_free_bytes"] > 0
    assert health["network"]["leases"] == 1
    assert health["network"]["netns"] == manager.config.network.netns
    assert health["errors"] == []


async def test_create_fails_cleanly_when_the_vmm_cannot_start(
    tmp_path: Path, netns: Netns, base_rootfs: str, kernel: str
) -> None:
    """A VMM command that does not exist fails the create with the reason, leaving no disk, TAP or metadata."""
    mgr = fake_vmm_manager(tmp_path / "fc", netns=netns.name, rootfs=base_rootfs, kernel=kernel)
    broken = mgr.with_config(firecracker_cmd=("/nonexistent/firecracker",))
    try:
        with pytest.raises(ProviderUnavailableError, match=r"failed to boot|cannot start"):
            await broken.create(CreateVM("doomed", vcpu_count=1, mem_size_mib=256, disk_bytes=DISK))
        assert broken.vms == {}
        assert netns.links() == ["lo"]
        assert not broken.vm_dir("doomed").exists()
        assert (await broken.health())["errors"], "the failure is not in the health report"
    finally:
        await broken.aclose()
        await mgr.aclose()


# --- pause, snapshots, restore (Firecracker's snapshot API, enforced by the double) -------------------------------


def _log(manager: FirecrackerManager, vm_id: str) -> str:
    return (manager.vm_dir(vm_id) / "firecracker.log").read_text(errors="replace")


async def test_pause_snapshots_memory_ends_the_process_and_resume_loads_it(
    provider: FirecrackerProvider, manager: FirecrackerManager
) -> None:
    """Pause = PATCH /vm Paused + PUT /snapshot/create + the process ended; resume = a new process loading the
    snapshot; the disk (also outside /workspace) is the same and the agent answers again."""
    assert isinstance(provider, Snapshotter)
    spec = _spec()
    await provider.create(spec)
    await provider.write_file(spec.id, "/root/kept.txt", b"outside the workspace")
    first_pid = (await manager.get(spec.id)).pid
    assert await provider.pause(spec.id) == "memory"
    assert await provider.state(spec.id) is WorkspaceState.PAUSED
    paused = await manager.get(spec.id)
    assert (paused.state, paused.pid) == ("paused", None)
    assert not _alive(first_pid), "pausing frees the VM's CPU and memory: its Firecracker process is gone"
    assert (manager.vm_dir(spec.id) / "pause.vmstate").is_file()
    assert (manager.vm_dir(spec.id) / "pause.mem").stat().st_size == 256 * MIB
    log = _log(manager, spec.id)
    assert '"PATCH /vm HTTP/1.1" 204' in log
    assert '"PUT /snapshot/create HTTP/1.1" 204' in log
    assert await provider.pause(spec.id) == "memory", "pausing a paused workspace answers what it holds"
    with pytest.raises(WorkspaceStateError, match="paused"):
        await provider.exec(spec.id, ExecRequest("true"))
    await provider.resume(spec.id)
    resumed = await manager.get(spec.id)
    assert (resumed.state, resumed.boots) == ("running", 2)
    assert resumed.pid not in (None, first_pid)
    assert '"PUT /snapshot/load HTTP/1.1" 204' in _log(manager, spec.id)
    assert not (manager.vm_dir(spec.id) / "pause.mem").exists()
    assert (await provider.exec(spec.id, ExecRequest("cat /root/kept.txt"))).stdout == b"outside the workspace"


async def test_stop_of_a_paused_vm_discards_its_memory_and_resume_boots_cold(
    provider: FirecrackerProvider, manager: FirecrackerManager
) -> None:
    """A paused VM that is stopped loses its memory snapshot, keeps its disk, and boots anew on resume."""
    spec = _spec()
    await provider.create(spec)
    await provider.write_file(spec.id, "/workspace/a.txt", b"disk")
    await provider.pause(spec.id)
    await provider.stop(spec.id)
    assert await provider.state(spec.id) is WorkspaceState.STOPPED
    assert not (manager.vm_dir(spec.id) / "pause.vmstate").exists()
    with pytest.raises(WorkspaceStateError, match="stopped"):
        await provider.pause(spec.id)
    await provider.resume(spec.id)
    assert (await provider.exec(spec.id, ExecRequest("cat /workspace/a.txt"))).stdout == b"disk"
    assert '"PUT /actions HTTP/1.1" 204' in _log(manager, spec.id).rsplit("snapshot/create", 1)[1]


async def test_snapshot_restores_into_a_new_vm_and_is_deleted(
    provider: FirecrackerProvider, manager: FirecrackerManager, netns: Netns
) -> None:
    """A snapshot keeps the source running; a VM restored from it has the snapshot's files (not later writes), its
    own disk, TAP device and vsock socket; deleting the snapshot leaves that VM running."""
    source = _spec()
    await provider.create(source)
    await provider.write_file(source.id, "/root/before.txt", b"in the snapshot")
    with pytest.raises(InvalidRequestError, match="not a valid snapshot id"):
        await provider.snapshot(source.id, "Not_Valid")
    info = await provider.snapshot(source.id, "snap-1")
    assert info.kind == "memory"
    assert info.size_bytes > 0
    assert await provider.list_snapshots() == ["snap-1"]
    with pytest.raises(WorkspaceStateError, match="already exists"):
        await provider.snapshot(source.id, "snap-1")
    # The source runs on; its agent stream was reset by the snapshot and reconnects.
    await provider.write_file(source.id, "/root/after.txt", b"not in the snapshot")
    copy = _spec()
    await provider.restore(copy, "snap-1")
    assert await provider.state(copy.id) is WorkspaceState.RUNNING
    assert (await provider.exec(copy.id, ExecRequest("cat /root/before.txt"))).stdout == b"in the snapshot"
    assert (await provider.exec(copy.id, ExecRequest("test -e /root/after.txt"))).exit_code == 1
    src, dst = await manager.get(source.id), await manager.get(copy.id)
    assert dst.from_snapshot == "snap-1"
    assert dst.guest_cid == src.guest_cid, "the vsock CID is in the snapshot"
    assert dst.network.tap != src.network.tap
    assert "LOWER_UP" in netns.run("ip", "link", "show", dst.network.tap).stdout, "network_overrides attached its TAP"
    assert os.stat(dst.disk_path).st_ino != os.stat(src.disk_path).st_ino
    config = await _machine_config(manager, copy.id)
    assert config["network-interfaces"][0]["host_dev_name"] == dst.network.tap  # type: ignore[index]
    await provider.write_file(copy.id, "/root/copy.txt", b"only here")
    assert (await provider.exec(source.id, ExecRequest("test -e /root/copy.txt"))).exit_code == 1
    await provider.delete_snapshot("snap-1")
    await provider.delete_snapshot("snap-1")
    assert await provider.list_snapshots() == []
    assert (await provider.exec(copy.id, ExecRequest("cat /root/copy.txt"))).stdout == b"only here"
    with pytest.raises(SnapshotNotFoundError, match="snap-1"):
        await provider.restore(_spec(), "snap-1")


async def test_snapshot_of_a_paused_vm_is_refused(provider: FirecrackerProvider) -> None:
    """Only a running VM can be snapshotted: a paused one is refused with a state error."""
    spec = _spec()
    await provider.create(spec)
    await provider.pause(spec.id)
    with pytest.raises(WorkspaceStateError, match="paused"):
        await provider.snapshot(spec.id, "nope")
    assert await provider.list_snapshots() == []


async def test_stop_does_not_rely_on_ctrl_alt_del(manager: FirecrackerManager) -> None:
    """A guest that never sees Ctrl-Alt-Del (no keyboard driver) is still stopped: killed after the grace period."""
    deaf = manager.with_config(firecracker_cmd=(*FAKE_VMM, "--no-keyboard"), shutdown_grace_s=0.5)
    try:
        record = await deaf.create(CreateVM("deaf", vcpu_count=1, mem_size_mib=256, disk_bytes=DISK))
        started = time.monotonic()
        stopped = await deaf.stop("deaf")
        assert (stopped.state, stopped.last_exit) == ("stopped", "stopped (killed)")
        assert time.monotonic() - started < 5
        assert not _alive(record.pid)
        assert "Ctrl-Alt-Del lost" in _log(deaf, "deaf")
    finally:
        await deaf.destroy_all()
        await deaf.aclose()
