"""Bad input is refused with a 4xx on the real Docker and gVisor providers; only provider failures fall back.

The outside review found ``auto`` trying plain Docker after errors that were the request's fault: ``cpu: 64`` ended
in a 503 once Docker had been tried too, ``memory: "999T"`` was accepted on a 23 GiB host, and a malformed
``base_image`` answered 503 "invalid reference format". These run the same requests against the real engine.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.errors import InvalidRequestError, ResourceLimitError
from corral.orchestrator.service import CreateWorkspace, WorkspaceService, host_resources
from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.providers.base import ResourceLimits, WorkspaceSpec
from corral.providers.docker import DockerProvider
from corral.providers.gvisor import GVisorProvider
from tests.e2e.conftest import Server
from tests.integration.conftest import build_service, close_service


def _runtime_objects(workspace_id: str) -> list[str]:
    """Containers and volumes labelled with this workspace id."""
    found = []
    for kind in (["ps", "-aq"], ["volume", "ls", "-q"]):
        out = subprocess.run(
            ["docker", *kind, "--filter", f"label=corral.workspace.id={workspace_id}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found += out.split()
    return found


@pytest.fixture
async def service(tmp_path: Path, docker_engine: DockerEngine) -> AsyncIterator[WorkspaceService]:
    """gVisor and plain Docker on the local engine, plain Docker allowed (so a fallback would reach it)."""
    providers = {
        "gvisor": GVisorProvider(DockerEngine(docker_engine.socket_path)),
        "docker": DockerProvider(DockerEngine(docker_engine.socket_path)),
    }
    svc = await build_service(tmp_path, providers, allow_docker_fallback=True)
    yield svc
    await close_service(svc)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("limits", "needle"),
    [({"cpu": 64}, "resource_limits.cpu: 64 CPUs requested"), ({"memory": "999T"}, "resource_limits.memory")],
    ids=["cpu-64", "memory-999T"],
)
async def test_limits_beyond_this_host_are_refused_without_trying_a_provider(
    service: WorkspaceService, limits: dict[str, object], needle: str
) -> None:
    """Asking for more CPUs or memory than this host has is a 422 resource_limit naming the limit, and neither
    gVisor nor plain Docker creates anything."""
    cpus, memory = host_resources()
    assert cpus is not None and cpus < 64 and memory is not None and memory < 999 * 1024**4
    before = await service.providers["docker"].list_workspaces()
    with pytest.raises(ResourceLimitError) as caught:
        await service.create(CreateWorkspace(limits=ResourceLimits.parse(limits, defaults=service.default_limits())))
    assert caught.value.http_status == 422 and needle in caught.value.message
    assert await service.providers["docker"].list_workspaces() == before
    assert await service.store.workspaces.list() == []


@pytest.mark.integration
async def test_the_engines_invalid_reference_is_bad_input(docker_engine: DockerEngine) -> None:
    """When the engine itself refuses an image reference, the provider raises InvalidRequestError (400) naming
    base_image, not ProviderUnavailableError (which would fall back), and leaves no container or volume."""
    provider = GVisorProvider(DockerEngine(docker_engine.socket_path))
    workspace_id = uuid.uuid4().hex[:16]
    try:
        with pytest.raises(InvalidRequestError) as caught:
            await provider.create(WorkspaceSpec(id=workspace_id, image="Not:A Valid::Reference"))
        assert caught.value.details["field"] == "base_image"
        assert "invalid reference format" in caught.value.message
        assert _runtime_objects(workspace_id) == []
    finally:
        await provider.destroy(workspace_id)
        await provider.aclose()


@pytest.mark.unit
async def test_invalid_reference_format_translates_to_invalid_request(tmp_path: Path) -> None:
    """The engine's "invalid reference format" answer maps to InvalidRequestError wherever it comes from."""
    provider = DockerProvider(DockerEngine(str(tmp_path / "no-engine.sock")))
    try:
        answer = DockerAPIError(400, "invalid reference format: repository name must be lowercase")
        error = provider._translate(answer, None)
        assert isinstance(error, InvalidRequestError) and error.details["field"] == "base_image"
    finally:
        await provider.aclose()


@pytest.mark.e2e
def test_the_reviews_requests_over_http(gvisor_server: Server) -> None:
    """Against `corral serve` on gVisor and Docker with default settings: the review's requests get 400, 422 and
    403 without a fallback, and a good request answers 201 on gVisor saying so."""
    api = "/api/v1/agent/workspaces"
    refused = {
        "bad-image": ({"base_image": "Not A/Valid:Reference"}, 400, "invalid_request"),
        "cpu-64": ({"resource_limits": {"cpu": 64}}, 422, "resource_limit"),
        "memory-999T": ({"resource_limits": {"memory": "999T"}}, 422, "resource_limit"),
        "explicit-docker": ({"provider": "docker"}, 403, "provider_not_allowed"),
    }
    before = gvisor_server.client.get(api).json()["workspaces"]
    for name, (body, status, code) in refused.items():
        resp = gvisor_server.client.post(api, json=body)
        assert (resp.status_code, resp.json()["error"]["code"]) == (status, code), f"{name}: {resp.text}"
    assert gvisor_server.client.get(api).json()["workspaces"] == before  # not even an error record
    created = gvisor_server.client.post(api, json={})
    assert created.status_code == 201, created.text
    workspace = created.json()
    try:
        assert (workspace["provider"], workspace["isolation"]) == ("gvisor", "gvisor")
        assert gvisor_server.client.get(f"{api}/{workspace['id']}").json()["isolation"] == "gvisor"
    finally:
        gvisor_server.client.delete(f"{api}/{workspace['id']}")
