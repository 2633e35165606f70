"""Automatic provider selection, container-type routing and the fallback chain (seed 000), over fake providers."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from corral.errors import (
    AllProvidersFailedError,
    InvalidRequestError,
    ProviderNotAllowedError,
    ProviderUnavailableError,
    ResourceLimitError,
)
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.selection import SelectionInputs, fallback_chain, preference_order
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers.base import Capabilities, ResourceLimits, WorkspaceSpec
from corral.providers.fake import FakeProvider
from corral.providers.registry import KNOWN_PROVIDERS, ProviderEntry, register_provider
from corral.settings import Settings
from corral.store import ProviderAttempt, Store

ISOLATION = {"docker": "container", "gvisor": "gvisor", "firecracker": "microvm"}
"""What each real provider reports, for the fakes that stand in for them."""

pytestmark = pytest.mark.unit

NO_KVM = "KVM not available: /dev/kvm does not exist"
ALL_BACKENDS = ("firecracker", "gvisor", "docker")
ALL_HEALTHY = ("e2b", "firecracker", "gvisor", "http", "docker")

Build = Callable[..., Awaitable[WorkspaceService]]


def inputs(
    mode: str = "self-hosted",
    *,
    e2b_key: bool = False,
    allow_docker: bool = True,
    configured: tuple[str, ...] = ALL_BACKENDS,
) -> SelectionInputs:
    """Selection inputs with the defaults of a self-hosted server configured with firecracker, gvisor and docker."""
    return SelectionInputs(
        deployment_mode=mode,  # type: ignore[arg-type]
        e2b_configured=e2b_key,
        allow_docker=allow_docker,
        configured=configured,
    )


def fakes(*names: str) -> dict[str, FakeProvider]:
    """In-memory providers named after the real backends, so auto selection considers them."""
    return {name: FakeProvider(name, isolation=ISOLATION.get(name, "none")) for name in names}


def create_calls(provider: FakeProvider) -> list[str]:
    """Ids of the workspaces ``create`` was called for on this provider."""
    return [workspace_id for method, workspace_id in provider.calls if method == "create"]


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CORRAL_* / E2B_API_KEY variables out of Settings."""
    for name in list(os.environ):
        if name.startswith(("CORRAL_", "WORKSPACE_DEFAULT_")) or name == "E2B_API_KEY":
            monkeypatch.delenv(name)


@pytest.fixture
async def build(tmp_path: Path) -> AsyncIterator[Build]:
    """Build a service over the given fakes and a SQLite file, health checked once; stores are closed afterwards."""
    stores: list[Store] = []

    async def _build(providers: dict[str, FakeProvider], **settings: object) -> WorkspaceService:
        data_dir = tmp_path / f"service-{len(stores)}"
        data_dir.mkdir()
        config = Settings(data_dir=data_dir, providers=",".join(providers), **settings)  # type: ignore[arg-type]
        store = await Store.open(config.sqlalchemy_url())
        stores.append(store)
        monitor = HealthMonitor(providers, config.health_interval_s)
        await monitor.check_all()
        return WorkspaceService(config, store, providers, monitor)

    yield _build
    for store in stores:
        await store.close()


# --- preference_order / fallback_chain: pure selection -----------------------------------------------------------


def test_self_hosted_with_kvm_selects_firecracker() -> None:
    """Self-hosted, provider auto, Firecracker healthy (KVM available): the orchestrator selects Firecracker."""
    try_order, skipped = fallback_chain(inputs(), "agent_workspace", healthy=ALL_BACKENDS)
    assert try_order == ["firecracker", "gvisor", "docker"]
    assert skipped == []


def test_self_hosted_without_kvm_selects_gvisor() -> None:
    """Self-hosted, provider auto, Firecracker reports KVM unavailable: the orchestrator selects gVisor."""
    try_order, skipped = fallback_chain(inputs(), "agent_workspace", healthy=("gvisor", "docker"))
    assert try_order == ["gvisor", "docker"]
    assert skipped == ["firecracker"]


def test_managed_with_e2b_key_selects_e2b() -> None:
    """Managed deployment with an E2B API key configured: the orchestrator selects E2B, then the self-hosted order."""
    order = preference_order(inputs("managed", e2b_key=True, configured=ALL_HEALTHY), "agent_workspace")
    assert order == ["e2b", "firecracker", "gvisor", "http", "docker"]


def test_managed_without_e2b_key_falls_back_to_self_hosted_order() -> None:
    """Managed deployment without an E2B API key: the self-hosted selection logic applies (Firecracker > gVisor)."""
    order = preference_order(inputs("managed", e2b_key=False, configured=ALL_HEALTHY), "agent_workspace")
    assert order == ["firecracker", "gvisor", "http", "docker"]


def test_e2b_key_is_ignored_when_self_hosted() -> None:
    """An E2B key alone does not make a self-hosted server prefer E2B: e2b is only a managed-mode choice."""
    order = preference_order(inputs("self-hosted", e2b_key=True, configured=ALL_HEALTHY), "agent_workspace")
    assert "e2b" not in order
    assert order[0] == "firecracker"


def test_agent_workspace_prefers_firecracker() -> None:
    """container_type agent_workspace with provider auto: the orchestrator prefers Firecracker."""
    assert preference_order(inputs(), "agent_workspace")[0] == "firecracker"


def test_mcp_server_prefers_gvisor() -> None:
    """container_type mcp_server with provider auto: the orchestrator prefers gVisor (lower resource overhead)."""
    assert preference_order(inputs(), "mcp_server") == ["gvisor", "firecracker", "docker"]


def test_mcp_server_in_managed_mode_still_prefers_e2b_then_gvisor() -> None:
    """Managed with an E2B key keeps E2B first for MCP servers too, and then routes to gVisor before Firecracker."""
    order = preference_order(inputs("managed", e2b_key=True, configured=ALL_HEALTHY), "mcp_server")
    assert order[:3] == ["e2b", "gvisor", "firecracker"]


def test_docker_is_last_whatever_the_configured_order() -> None:
    """Plain Docker shares the host kernel, so it comes last even when it is configured first."""
    order = preference_order(inputs(configured=("docker", "gvisor", "firecracker")), "agent_workspace")
    assert order == ["firecracker", "gvisor", "docker"]


def test_docker_is_never_selected_without_allow_docker_fallback() -> None:
    """With allow_docker_fallback off, docker is not in the order even when it is the only healthy provider."""
    no_docker = inputs(allow_docker=False)
    assert preference_order(no_docker, "agent_workspace") == ["firecracker", "gvisor"]
    assert fallback_chain(no_docker, "agent_workspace", healthy=("docker",)) == ([], ["firecracker", "gvisor"])


def test_fake_is_never_auto_selected() -> None:
    """The fake provider is for tests: auto selection never picks it, even when it is the only one configured."""
    assert preference_order(inputs(configured=("fake",)), "agent_workspace") == []
    assert "fake" not in preference_order(inputs(configured=("fake", *ALL_BACKENDS)), "mcp_server")


def test_only_configured_providers_are_considered() -> None:
    """Selection never names a provider the server was not configured with."""
    assert preference_order(inputs(configured=("gvisor",)), "agent_workspace") == ["gvisor"]
    assert preference_order(inputs("managed", e2b_key=True, configured=("gvisor",)), "agent_workspace") == ["gvisor"]
    assert preference_order(inputs(configured=()), "agent_workspace") == []


def test_fallback_chain_keeps_unhealthy_providers_for_reporting_in_preference_order() -> None:
    """Unhealthy providers are left out of the try order but reported, best first, so errors can name them."""
    try_order, skipped = fallback_chain(
        inputs("managed", e2b_key=True, configured=("e2b", *ALL_BACKENDS)), "agent_workspace", healthy=("docker",)
    )
    assert try_order == ["docker"]
    assert skipped == ["e2b", "firecracker", "gvisor"]


# --- WorkspaceService.plan: selection with cached health -----------------------------------------------------------


async def test_plan_without_kvm_skips_firecracker_with_its_health_error(build: Build) -> None:
    """Self-hosted without KVM: plan tries gVisor first and reports Firecracker as skipped with the KVM reason."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].healthy = False
    providers["firecracker"].health_error = NO_KVM
    service = await build(providers, allow_docker_fallback=True)
    try_order, skipped = service.plan("auto", "agent_workspace")
    assert try_order == ["gvisor", "docker"]
    assert skipped == [("firecracker", f"unhealthy: {NO_KVM}")]


async def test_plan_in_managed_mode_reads_the_e2b_key_from_settings(build: Build) -> None:
    """Managed mode with Settings(e2b_api_key=...) (E2B_API_KEY) plans E2B first; without the key it is left out."""
    with_key = await build(
        fakes("e2b", *ALL_BACKENDS), deployment_mode="managed", e2b_api_key="e2b_test_key", allow_docker_fallback=True
    )
    without_key = await build(fakes("e2b", *ALL_BACKENDS), deployment_mode="managed", allow_docker_fallback=True)
    assert with_key.plan("auto", "agent_workspace")[0] == ["e2b", "firecracker", "gvisor", "docker"]
    assert without_key.plan("auto", "agent_workspace")[0] == ["firecracker", "gvisor", "docker"]


def test_e2b_key_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The E2B key comes from E2B_API_KEY (or CORRAL_E2B_API_KEY) in the environment."""
    monkeypatch.setenv("E2B_API_KEY", "from-env")
    assert Settings(data_dir=tmp_path).e2b_api_key == "from-env"
    monkeypatch.delenv("E2B_API_KEY")
    monkeypatch.setenv("CORRAL_E2B_API_KEY", "from-corral-env")
    assert Settings(data_dir=tmp_path).e2b_api_key == "from-corral-env"


async def test_plan_for_an_explicit_provider_is_that_provider_alone(build: Build) -> None:
    """An explicit provider is planned alone, with no fallback and no health filtering."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].healthy = False
    service = await build(providers)
    assert service.plan("firecracker", "agent_workspace") == (["firecracker"], [])


# --- WorkspaceService.create: the fallback chain -------------------------------------------------------------------


async def test_omitting_the_provider_behaves_as_auto(build: Build) -> None:
    """A request that omits the provider field behaves as if provider = "auto" was specified."""
    service = await build(fakes(*ALL_BACKENDS))
    request = CreateWorkspace()
    assert request.provider == "auto"
    record = await service.create(request)
    assert record.requested_provider == "auto"
    assert record.provider == "firecracker"
    assert record.status == "ready"
    assert record.provider_attempts == ()
    assert record.warnings == ()


async def test_unhealthy_providers_are_summarised_not_listed_as_attempts(build: Build) -> None:
    """A provider skipped as unhealthy is not in provider_attempts (it was never tried); one short warning names it."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].healthy = False
    providers["firecracker"].health_error = NO_KVM
    service = await build(providers)
    record = await service.create(CreateWorkspace())
    assert record.provider == "gvisor"
    assert record.provider_attempts == ()
    assert record.warnings == ("skipped firecracker (unhealthy); reasons at GET /api/v1/agent/workspaces/providers",)
    assert create_calls(providers["firecracker"]) == []


async def test_mcp_server_is_created_on_gvisor(build: Build) -> None:
    """container_type mcp_server with provider auto is created on gVisor; agent_workspace on Firecracker."""
    service = await build(fakes(*ALL_BACKENDS))
    assert (await service.create(CreateWorkspace(container_type="mcp_server"))).provider == "gvisor"
    assert (await service.create(CreateWorkspace(container_type="agent_workspace"))).provider == "firecracker"


async def test_firecracker_failure_falls_back_to_gvisor(build: Build, caplog: pytest.LogCaptureFixture) -> None:
    """Firecracker fails to create: the system retries with gVisor, logs the fallback and records the provider used."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].fail_create = "KVM error: cannot open /dev/kvm"
    service = await build(providers)
    record = await service.create(CreateWorkspace())
    assert record.provider == "gvisor"
    assert record.provider_attempts == (ProviderAttempt("firecracker", "KVM error: cannot open /dev/kvm"),)
    assert (await service.get(record.id)).provider == "gvisor"  # stored, not only returned
    assert create_calls(providers["docker"]) == []
    fallbacks = [r for r in caplog.records if r.levelno == logging.WARNING and "falling back" in r.getMessage()]
    assert len(fallbacks) == 1
    assert "firecracker failed (KVM error: cannot open /dev/kvm); falling back to gvisor" in fallbacks[0].getMessage()


async def test_e2b_failure_falls_back_to_firecracker_then_gvisor(
    build: Build, caplog: pytest.LogCaptureFixture
) -> None:
    """E2B fails (quota exceeded), then Firecracker: the system retries Firecracker, then gVisor, logging each step."""
    providers = fakes("e2b", *ALL_BACKENDS)
    providers["e2b"].fail_create = "API error: quota exceeded"
    providers["firecracker"].fail_create = "resource exhaustion: no memory left for a microVM"
    service = await build(providers, deployment_mode="managed", e2b_api_key="e2b_test_key")
    record = await service.create(CreateWorkspace())
    assert record.provider == "gvisor"
    assert record.provider_attempts == (
        ProviderAttempt("e2b", "API error: quota exceeded"),
        ProviderAttempt("firecracker", "resource exhaustion: no memory left for a microVM"),
    )
    fallbacks = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert len(fallbacks) == 2
    assert "e2b failed (API error: quota exceeded); falling back to firecracker" in fallbacks[0]
    assert "firecracker failed" in fallbacks[1] and fallbacks[1].endswith("falling back to gvisor")
    assert all(r.levelno == logging.WARNING for r in caplog.records if "falling back" in r.getMessage())


async def test_e2b_failure_is_served_by_firecracker_when_kvm_is_available(build: Build) -> None:
    """E2B fails in managed mode and Firecracker is healthy: Firecracker serves the workspace."""
    providers = fakes("e2b", *ALL_BACKENDS)
    providers["e2b"].fail_create = "API error: 500"
    service = await build(providers, deployment_mode="managed", e2b_api_key="e2b_test_key")
    record = await service.create(CreateWorkspace())
    assert record.provider == "firecracker"
    assert record.provider_attempts == (ProviderAttempt("e2b", "API error: 500"),)
    assert create_calls(providers["gvisor"]) == []


async def test_explicit_provider_does_not_fall_back(build: Build) -> None:
    """Explicit provider = "firecracker" that fails returns an error without attempting any fallback."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].fail_create = "KVM error: cannot open /dev/kvm"
    service = await build(providers)
    with pytest.raises(ProviderUnavailableError) as caught:
        await service.create(CreateWorkspace(provider="firecracker"))
    assert not isinstance(caught.value, AllProvidersFailedError)
    assert caught.value.provider == "firecracker"
    assert caught.value.reason == "KVM error: cannot open /dev/kvm"
    assert "firecracker" in caught.value.message and "KVM error" in caught.value.message
    assert len(create_calls(providers["firecracker"])) == 1
    assert create_calls(providers["gvisor"]) == []
    assert create_calls(providers["docker"]) == []
    assert "workspace_id" not in caught.value.details  # its record was not kept (no keep_failed)
    assert await service.store.workspaces.list(include_destroyed=True) == []


async def test_explicit_provider_failure_kept_on_request(build: Build) -> None:
    """With keep_failed an explicit provider's failure leaves an error record, named in the error's details."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].fail_create = "KVM error: cannot open /dev/kvm"
    service = await build(providers)
    with pytest.raises(ProviderUnavailableError) as caught:
        await service.create(CreateWorkspace(provider="firecracker", keep_failed=True))
    record = await service.get(caught.value.details["workspace_id"])
    assert record.status == "error"
    assert record.requested_provider == "firecracker"
    assert record.provider_attempts == (ProviderAttempt("firecracker", "KVM error: cannot open /dev/kvm"),)


async def test_all_providers_fail_lists_every_provider_and_reason(build: Build) -> None:
    """When the fallback chain is exhausted, the error lists each provider, unhealthy ones included, with its reason."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].healthy = False
    providers["firecracker"].health_error = NO_KVM
    providers["gvisor"].fail_create = "runsc runtime is not registered with dockerd"
    providers["docker"].fail_create = "docker daemon unreachable"
    service = await build(providers, allow_docker_fallback=True)
    with pytest.raises(AllProvidersFailedError) as caught:
        await service.create(CreateWorkspace())
    assert caught.value.attempts == [
        ("firecracker", f"unhealthy: {NO_KVM}"),
        ("gvisor", "runsc runtime is not registered with dockerd"),
        ("docker", "docker daemon unreachable"),
    ]
    for name in ALL_BACKENDS:
        assert name in caught.value.message
    assert create_calls(providers["firecracker"]) == []  # skipped up front: it was unhealthy


async def test_failed_auto_create_leaves_no_record(build: Build) -> None:
    """A create that exhausts the chain deletes its record, and its error still lists every attempt."""
    providers = fakes("firecracker", "gvisor")
    providers["firecracker"].fail_create = "KVM error"
    providers["gvisor"].fail_create = "runsc missing"
    service = await build(providers)
    with pytest.raises(AllProvidersFailedError) as caught:
        await service.create(CreateWorkspace(metadata={"task": "t-1"}))
    assert caught.value.attempts == [("firecracker", "KVM error"), ("gvisor", "runsc missing")]
    assert len(create_calls(providers["gvisor"])) == 1  # it was tried, then its record went
    assert await service.store.workspaces.list(include_destroyed=True) == []


async def test_failed_auto_create_kept_with_keep_failed_has_the_attempts(build: Build) -> None:
    """With keep_failed, a create that exhausts the chain leaves a record with status "error" and every attempt."""
    providers = fakes("firecracker", "gvisor")
    providers["firecracker"].fail_create = "KVM error"
    providers["gvisor"].fail_create = "runsc missing"
    service = await build(providers)
    with pytest.raises(AllProvidersFailedError):
        await service.create(CreateWorkspace(metadata={"task": "t-1"}, keep_failed=True))
    [record] = await service.store.workspaces.list(status="error")
    assert record.provider is None
    assert record.requested_provider == "auto"
    assert record.metadata == {"task": "t-1"}
    assert record.provider_attempts == (
        ProviderAttempt("firecracker", "KVM error"),
        ProviderAttempt("gvisor", "runsc missing"),
    )
    assert (
        record.error is not None
        and "firecracker: KVM error" in record.error
        and "gvisor: runsc missing" in record.error
    )


async def test_docker_fallback_records_the_reduced_isolation_warning(build: Build) -> None:
    """Falling back to plain Docker works, and the record warns that isolation is reduced."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].fail_create = "KVM error"
    providers["gvisor"].fail_create = "runsc missing"
    service = await build(providers, allow_docker_fallback=True)
    record = await service.create(CreateWorkspace())
    assert record.provider == "docker"
    assert [a.provider for a in record.provider_attempts] == ["firecracker", "gvisor"]
    assert len(record.warnings) == 1
    assert "isolation is reduced" in record.warnings[0]


async def test_without_allow_docker_fallback_auto_never_tries_docker(build: Build) -> None:
    """With allow_docker_fallback=False, auto selection fails rather than falling back to plain Docker."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].fail_create = "KVM error"
    providers["gvisor"].fail_create = "runsc missing"
    service = await build(providers, allow_docker_fallback=False)
    with pytest.raises(AllProvidersFailedError) as caught:
        await service.create(CreateWorkspace())
    assert [name for name, _ in caught.value.attempts] == ["firecracker", "gvisor"]
    assert create_calls(providers["docker"]) == []


def test_plain_docker_is_off_by_default(tmp_path: Path) -> None:
    """CORRAL_ALLOW_DOCKER_FALLBACK defaults to false and is read from the environment."""
    assert Settings(data_dir=tmp_path).allow_docker_fallback is False
    assert inputs(allow_docker=False) == SelectionInputs("self-hosted", False, False, ALL_BACKENDS)


async def test_default_auto_never_tries_docker(build: Build) -> None:
    """With default settings, auto fails when gVisor and Firecracker do, rather than using plain Docker."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].fail_create = "KVM error"
    providers["gvisor"].fail_create = "runsc missing"
    service = await build(providers)
    with pytest.raises(AllProvidersFailedError) as caught:
        await service.create(CreateWorkspace())
    assert [name for name, _ in caught.value.attempts] == ["firecracker", "gvisor"]
    assert create_calls(providers["docker"]) == []


async def test_explicit_docker_is_refused_unless_allowed(build: Build) -> None:
    """An explicit docker request is refused (403 provider_not_allowed) while plain Docker is not allowed, without
    a record or a create call; with allow_docker_fallback it is served, with the reduced-isolation warning."""
    providers = fakes(*ALL_BACKENDS)
    strict = await build(providers)
    with pytest.raises(ProviderNotAllowedError) as caught:
        await strict.create(CreateWorkspace(provider="docker"))
    assert caught.value.http_status == 403 and caught.value.code == "provider_not_allowed"
    assert "CORRAL_ALLOW_DOCKER_FALLBACK=true" in caught.value.message
    assert create_calls(providers["docker"]) == []
    assert await strict.store.workspaces.list() == []
    allowed = await build(fakes(*ALL_BACKENDS), allow_docker_fallback=True)
    record = await allowed.create(CreateWorkspace(provider="docker"))
    assert record.provider == "docker"
    assert any("isolation is reduced" in w for w in record.warnings)


async def test_only_fake_configured_means_auto_has_nothing_to_try(build: Build) -> None:
    """A server configured with only the fake provider never auto-selects it; auto fails without calling it."""
    providers = {"fake": FakeProvider("fake")}
    service = await build(providers)
    with pytest.raises(AllProvidersFailedError) as caught:
        await service.create(CreateWorkspace())
    assert caught.value.attempts == []
    assert create_calls(providers["fake"]) == []


# --- fallback is for provider failures only ---------------------------------------------------------------------------


class CapacityFake(FakeProvider):
    """A fake whose create fails with a transient capacity error, as Firecracker's past CORRAL_FIRECRACKER_MAX_VMS."""

    async def create(self, spec: WorkspaceSpec) -> None:
        """Record the call, then refuse for capacity."""
        self.calls.append(("create", spec.id))
        raise ResourceLimitError("firecracker: 32 microVMs already run on this host, the configured maximum")


class RemoteFake(FakeProvider):
    """A fake that reports what a remote service reports: isolation "remote" and no host size."""

    async def capabilities(self) -> Capabilities:
        """Remote isolation, no resources."""
        caps = await super().capabilities()
        return dataclasses.replace(caps, isolation="remote", resources={})


def limits(cpu: float = 2, memory_gib: int = 4) -> ResourceLimits:
    """Resource limits in CPUs and GiB (the fakes' host has 4 CPUs and 16 GiB)."""
    return ResourceLimits(cpu=cpu, memory_bytes=memory_gib * 1024**3)


async def test_a_transient_capacity_error_still_falls_back(build: Build) -> None:
    """Firecracker at its most VMs (a ResourceLimitError from create) is a provider failure: auto goes on to gVisor."""
    providers = {"firecracker": CapacityFake("firecracker"), **fakes("gvisor", "docker")}
    service = await build(providers)
    record = await service.create(CreateWorkspace())
    assert record.provider == "gvisor"
    assert [a.provider for a in record.provider_attempts] == ["firecracker"]
    assert "32 microVMs" in record.provider_attempts[0].error


@pytest.mark.parametrize(
    ("request_limits", "needle"),
    [
        (limits(cpu=64), "resource_limits.cpu: 64 CPUs requested, but the host has 4"),
        (limits(memory_gib=999 * 1024), "resource_limits.memory"),
    ],
    ids=["cpu", "memory"],
)
@pytest.mark.parametrize("provider", ["auto", "gvisor"])
async def test_limits_beyond_the_host_are_refused_before_any_provider(
    build: Build, request_limits: ResourceLimits, needle: str, provider: str
) -> None:
    """More CPUs or memory than the host has is a ResourceLimitError (422) before any create call, for auto and an
    explicit provider alike, even when plain Docker is allowed and unhealthy providers would come back later."""
    providers = fakes(*ALL_BACKENDS)
    providers["firecracker"].healthy = False
    service = await build(providers, allow_docker_fallback=True)
    with pytest.raises(ResourceLimitError) as caught:
        await service.create(CreateWorkspace(provider=provider, limits=request_limits))
    assert caught.value.http_status == 422 and caught.value.code == "resource_limit"
    assert needle in caught.value.message
    assert all(create_calls(p) == [] for p in providers.values())
    assert await service.store.workspaces.list() == []


async def test_a_remote_provider_of_unknown_size_is_still_tried_for_big_limits(build: Build) -> None:
    """When a remote provider (E2B) cannot say its size, big limits skip the local providers with their reason and
    go to it."""
    providers = {"e2b": RemoteFake("e2b"), **fakes("firecracker", "gvisor")}
    service = await build(providers, deployment_mode="managed", e2b_api_key="key")
    providers["e2b"].fail_create = "quota exceeded"
    with pytest.raises(AllProvidersFailedError) as caught:
        await service.create(CreateWorkspace(limits=limits(cpu=64)))
    reasons = dict(caught.value.attempts)
    assert reasons["e2b"] == "quota exceeded"
    assert "64 CPUs requested" in reasons["gvisor"] and "64 CPUs requested" in reasons["firecracker"]
    assert create_calls(providers["gvisor"]) == [] and create_calls(providers["firecracker"]) == []


@pytest.mark.parametrize("image", ["Upper", "name:tag:again", "with space", "trailing/", "a" * 300])
async def test_a_malformed_base_image_is_refused_before_any_provider(build: Build, image: str) -> None:
    """A base_image that is not a Docker image reference is an InvalidRequestError naming the field and the form;
    no provider is tried."""
    providers = fakes(*ALL_BACKENDS)
    service = await build(providers, allow_docker_fallback=True)
    with pytest.raises(InvalidRequestError) as caught:
        await service.create(CreateWorkspace(base_image=image))
    assert caught.value.details == {"field": "base_image"}
    assert caught.value.message.startswith("base_image: ")
    assert all(create_calls(p) == [] for p in providers.values())


async def test_a_provider_finding_the_input_bad_ends_the_chain(build: Build) -> None:
    """An InvalidRequestError from a provider's create (the engine refusing the image) is not retried elsewhere."""

    class PickyFake(FakeProvider):
        async def create(self, spec: WorkspaceSpec) -> None:
            self.calls.append(("create", spec.id))
            raise InvalidRequestError(
                "base_image: 'corral/x' is not a valid image reference (invalid reference format)"
            )

    providers = {"firecracker": PickyFake("firecracker"), **fakes("gvisor")}
    service = await build(providers)
    with pytest.raises(InvalidRequestError):
        await service.create(CreateWorkspace(base_image="corral/x"))
    assert create_calls(providers["gvisor"]) == []


async def test_the_service_knows_each_providers_isolation(build: Build) -> None:
    """Each provider's isolation comes from its capabilities, fetched once; unknown providers have none."""
    providers = {"e2b": RemoteFake("e2b"), **fakes("gvisor")}
    service = await build(providers)
    await service.probe_providers()
    assert (service.isolation_of("e2b"), service.isolation_of("gvisor"), service.isolation_of(None)) == (
        "remote",
        "gvisor",
        None,
    )
    await service.probe_providers()
    assert sum(1 for method, _ in providers["gvisor"].calls if method == "capabilities") == 1


async def test_a_registered_third_party_provider_joins_auto(build: Build, monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider registered with an auto rank ahead of gVisor's is what auto picks for agent workspaces, and its MCP
    rank behind gVisor's keeps gVisor first for MCP servers: by registration alone."""
    monkeypatch.setitem(KNOWN_PROVIDERS, "acme", KNOWN_PROVIDERS["fake"])  # restored after the test
    register_provider("acme", ProviderEntry("corral.providers.factories", "fake", auto_rank=5, mcp_rank=15))
    providers = {**fakes("gvisor"), "acme": FakeProvider("acme", isolation="gvisor")}
    service = await build(providers)
    assert (await service.create(CreateWorkspace())).provider == "acme"
    assert (await service.create(CreateWorkspace(container_type="mcp_server"))).provider == "gvisor"
