"""What the docker and gvisor providers promise beyond the shared contract: layout, limits, hardening, runtimes."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import pytest

from corral.errors import InvalidRequestError, ProviderUnavailableError, WorkspaceStateError
from corral.providers._docker_engine import DockerEngine
from corral.providers.base import ExecRequest, ResourceLimits, WorkspaceSpec, WorkspaceState
from corral.providers.docker import LABEL_ID, DockerProvider, container_name, volume_name
from corral.providers.gvisor import GVisorProvider
from tests.conftest import BASE_IMAGE

pytestmark = pytest.mark.integration


def _spec(**kwargs: object) -> WorkspaceSpec:
    return WorkspaceSpec(id=f"t{uuid.uuid4().hex[:15]}", image=BASE_IMAGE, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def gvisor(docker_engine: DockerEngine) -> AsyncIterator[GVisorProvider]:
    provider = GVisorProvider(DockerEngine(docker_engine.socket_path))
    yield provider
    for workspace_id in await provider.list_workspaces():
        if workspace_id.startswith("t"):
            await provider.destroy(workspace_id)
    await provider.aclose()


@pytest.fixture
async def runc(docker_engine: DockerEngine) -> AsyncIterator[DockerProvider]:
    provider = DockerProvider(DockerEngine(docker_engine.socket_path))
    yield provider
    for workspace_id in await provider.list_workspaces():
        if workspace_id.startswith("t"):
            await provider.destroy(workspace_id)
    await provider.aclose()


async def test_gvisor_workspace_layout_limits_and_hardening(
    gvisor: GVisorProvider, docker_engine: DockerEngine
) -> None:
    """A default gVisor workspace runs under runsc with 2 CPUs, 4 GiB, its labelled volume and the hardening flags."""
    spec = _spec()
    await gvisor.create(spec)
    info = await docker_engine.inspect_container(container_name(spec.id))
    assert info is not None
    host = info["HostConfig"]
    assert host["Runtime"] == "runsc"
    assert host["NanoCpus"] == 2_000_000_000
    assert host["Memory"] == 4 * 1024**3
    assert host["PidsLimit"] == 1024
    assert host["CapDrop"] == ["ALL"]
    assert "NET_RAW" not in host["CapAdd"] and "SYS_ADMIN" not in host["CapAdd"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert host["Privileged"] is False
    assert host["NetworkMode"] == "none"
    assert not host.get("Binds"), "no host path may be mounted"
    mounts = sorted(info["Mounts"], key=lambda m: m["Destination"])
    # The workspace volume, and the agent's runtime read-only (nothing inside may change the agent's code path).
    assert [(m["Type"], m["Destination"], m["RW"]) for m in mounts] == [
        ("bind", "/.corral", False),
        ("volume", "/workspace", True),
    ]
    assert mounts[0]["Source"] == await gvisor.agent_runtime.ensure()
    assert mounts[1]["Name"] == volume_name(spec.id)
    assert info["Config"]["Labels"][LABEL_ID] == spec.id
    volume = await docker_engine.inspect_volume(volume_name(spec.id))
    assert volume is not None and volume["Labels"][LABEL_ID] == spec.id
    # Inside: no Docker socket, and processes hold exactly the seven capabilities granted (CapEff 0xfb).
    result = await gvisor.exec(
        spec.id, ExecRequest("test -e /var/run/docker.sock || test -e /run/docker.sock; grep ^CapEff /proc/self/status")
    )
    assert result.exit_code == 0
    assert result.stdout.decode().split() == ["CapEff:", "00000000000000fb"]


async def test_custom_limits_are_applied(gvisor: GVisorProvider, docker_engine: DockerEngine) -> None:
    """Per-request CPU and memory limits reach the container."""
    spec = _spec(limits=ResourceLimits(cpu=0.5, memory_bytes=512 * 1024**2, disk_bytes=1024**3))
    await gvisor.create(spec)
    info = await docker_engine.inspect_container(container_name(spec.id))
    assert info is not None
    assert info["HostConfig"]["NanoCpus"] == 500_000_000
    assert info["HostConfig"]["Memory"] == 512 * 1024**2


async def test_isolated_gvisor_has_no_network_and_default_has_one(gvisor: GVisorProvider) -> None:
    """Isolated workspaces see only loopback; default ones get their own eth0 under runsc-net."""
    isolated, networked = _spec(), _spec(network="default")
    await gvisor.create(isolated)
    await gvisor.create(networked)
    iso = await gvisor.exec(isolated.id, ExecRequest("cat /proc/net/dev"))
    net = await gvisor.exec(networked.id, ExecRequest("cat /proc/net/dev"))
    assert "eth0" not in iso.stdout.decode()
    assert "eth0" in net.stdout.decode()


async def test_missing_runsc_runtime_fails_with_a_clear_error(docker_engine: DockerEngine) -> None:
    """When runsc is not registered with dockerd, create says "gVisor runtime not available" and leaves nothing."""
    provider = GVisorProvider(DockerEngine(docker_engine.socket_path), runtime="runsc-missing-for-test")
    spec = _spec()
    try:
        with pytest.raises(ProviderUnavailableError, match="gVisor runtime not available"):
            await provider.create(spec)
        health = await provider.health()
        assert not health.healthy and "gVisor runtime not available" in (health.error or "")
        assert await docker_engine.inspect_volume(volume_name(spec.id)) is None
    finally:
        await provider.aclose()


async def test_plain_docker_logs_a_security_warning(runc: DockerProvider, caplog: pytest.LogCaptureFixture) -> None:
    """Every plain-Docker create logs that isolation is reduced."""
    with caplog.at_level(logging.WARNING, logger="corral.providers.docker"):
        await runc.create(_spec())
    assert any("isolation is" in r.message and "reduced" in r.message for r in caplog.records)


async def test_missing_image_is_a_clear_error_and_never_pulled(
    gvisor: GVisorProvider, docker_engine: DockerEngine
) -> None:
    """An image that is not on the host is refused with a message naming it; nothing is left behind."""
    spec = WorkspaceSpec(id=f"t{uuid.uuid4().hex[:15]}", image="corral/does-not-exist:1")
    with pytest.raises(InvalidRequestError, match="corral/does-not-exist:1"):
        await gvisor.create(spec)
    assert await docker_engine.inspect_volume(volume_name(spec.id)) is None
    assert await docker_engine.inspect_container(container_name(spec.id)) is None


FORK_PROBE = """
import os, time
kids = []
try:
    for _ in range(300):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
    print("unblocked", len(kids))
except OSError:
    print("blocked", len(kids))
for k in kids:
    os.kill(k, 9)
    os.waitpid(k, 0)
"""


@pytest.mark.parametrize(
    ("provider_cls", "limit"), [(DockerProvider, 64), (GVisorProvider, 256)], ids=["docker", "gvisor"]
)
async def test_pids_limit_contains_a_fork_bomb(
    docker_engine: DockerEngine, provider_cls: type[DockerProvider], limit: int
) -> None:
    """A process that forks without end never gets past the pids limit.

    runc fails the fork with EAGAIN at the limit. gVisor release 20221219 (Debian bookworm) instead terminates the
    whole sandbox when the limit is hit: the bomb is still contained, the workspace ends up stopped, and resume
    brings it back with /workspace intact. Under gVisor the limit also counts the sandbox kernel's own host threads,
    so a very small limit (64) can stop even an idle sandbox; 256 leaves it room.
    """
    provider = provider_cls(DockerEngine(docker_engine.socket_path), pids_limit=limit)
    spec = _spec()
    try:
        await provider.create(spec)
        await provider.write_file(spec.id, "/workspace/probe.py", FORK_PROBE.encode())
        try:
            result = await provider.exec(spec.id, ExecRequest("python3 /workspace/probe.py", timeout_s=60))
        except WorkspaceStateError:
            assert provider_cls is GVisorProvider, "only gVisor stops the sandbox at the pids limit"
            assert await provider.state(spec.id) is WorkspaceState.STOPPED
            await provider.resume(spec.id)
            assert (await provider.exec(spec.id, ExecRequest("test -f /workspace/probe.py"))).exit_code == 0
        else:
            verdict, count = result.stdout.decode().split()
            assert verdict == "blocked" and int(count) < limit
    finally:
        await provider.destroy(spec.id)
        await provider.aclose()


async def test_ls_and_stat_work_under_gvisor(gvisor: GVisorProvider) -> None:
    """coreutils' ls and stat work in gVisor workspaces (runsc 20221219 rejects their statx flag without the
    image's shim)."""
    spec = _spec()
    await gvisor.create(spec)
    result = await gvisor.exec(
        spec.id, ExecRequest("touch /workspace/x && ls -l /workspace && stat -c %s /workspace/x")
    )
    assert result.exit_code == 0, result.stderr
    assert " x\n" in result.stdout.decode()
    assert result.stdout.decode().endswith("0\n")
