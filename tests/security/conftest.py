"""Fixtures of the security regression tests: a real server on gVisor, and ways to watch its memory."""

from __future__ import annotations

import secrets
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from corral.providers._docker_engine import DockerEngine
from corral.providers.base import WorkspaceEvent, WorkspaceSpec
from corral.providers.docker import DockerProvider
from corral.providers.gvisor import GVisorProvider
from tests.conftest import BASE_IMAGE
from tests.e2e.conftest import Server, start_server, stop_server
from tests.gitserver import GitServer, make_repository, serve_git

MiB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc (what the issue's measurements used)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.fixture(scope="module")
def gvisor_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A `corral serve` process whose workspaces run on gVisor (auto picks it; no warm pool)."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")
    server = start_server(tmp_path_factory.mktemp("corral-security"), {"CORRAL_PROVIDERS": "gvisor,docker"})
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def workspace(gvisor_server: Server) -> Iterator[str]:
    """A fresh gVisor workspace on the module's server, destroyed afterwards."""
    answer = gvisor_server.client.post("/api/v1/agent/workspaces", json={"provider": "gvisor"})
    assert answer.status_code == 201, answer.text
    workspace_id: str = answer.json()["id"]
    try:
        yield workspace_id
    finally:
        gvisor_server.client.delete(f"/api/v1/agent/workspaces/{workspace_id}")


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServer]:
    """Real repositories ``app`` (main: README.md) and ``infra`` (main: main.tf) over smart HTTP on loopback, behind
    Basic auth as ``x-access-token`` with a random secret."""
    root = tmp_path_factory.mktemp("git")
    make_repository(root, "app", {"main": {"README.md": "app on main\n"}})
    make_repository(root, "infra", {"main": {"main.tf": "# infra\n"}})
    with serve_git(root, secret=f"gitsecret-{secrets.token_hex(8)}") as server:
        yield server


@pytest.fixture(params=[GVisorProvider, DockerProvider], ids=["gvisor", "runc"])
async def provider(request: pytest.FixtureRequest, docker_engine: DockerEngine) -> AsyncIterator[DockerProvider]:
    """A gVisor (and a plain runc) provider that records the events it reports."""
    cls: type[DockerProvider] = request.param
    instance = cls(DockerEngine(docker_engine.socket_path))
    events: list[WorkspaceEvent] = []
    instance.subscribe(events.append)
    instance.events = events  # type: ignore[attr-defined]
    yield instance
    await instance.aclose()


@pytest.fixture
async def workspace_id(provider: DockerProvider) -> AsyncIterator[str]:
    """A running workspace, destroyed afterwards."""
    spec = WorkspaceSpec(id=f"t{uuid.uuid4().hex[:15]}", image=BASE_IMAGE)
    await provider.create(spec)
    try:
        yield spec.id
    finally:
        await provider.destroy(spec.id)
