"""The workspace service: records in the store, runtime objects in the providers, and the rules between them.

Create writes a ``creating`` record before touching any runtime, so a server killed mid-create leaves a record
that reconciliation can match with whatever the runtime holds; a create that fails deletes it again unless asked to
keep it. Auto selection walks the fallback chain and records every provider it tried (those it skipped as unhealthy
get one warning line); an explicit provider is tried alone. Falling back is for provider failures only: bad input
(a malformed image reference, limits no host here could ever give, a provider the operator has not allowed) is
refused before any provider is tried.

The exec and file hot paths never touch the database: the service keeps each live workspace's provider and status
in memory (it is the only writer of records) and loads a record only on a cache miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from corral.egress import EgressPolicy
from corral.errors import (
    AllProvidersFailedError,
    CorralError,
    InvalidRequestError,
    ProviderNotAllowedError,
    ProviderNotFoundError,
    ProviderUnavailableError,
    ResourceLimitError,
    WorkspaceBrokenError,
    WorkspaceDestroyedError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.images.reference import check_image_reference
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.paths import lexically_confined
from corral.orchestrator.pool import Claim, PoolSpec, WarmPools
from corral.orchestrator.selection import SelectionInputs, fallback_chain
from corral.providers.base import (
    WORKSPACE_ROOT,
    ByteStream,
    Capabilities,
    DeathWatcher,
    DirEventStream,
    DirWatcher,
    DiskUsageReporter,
    EgressControl,
    EventSource,
    ExecRequest,
    ExecResult,
    ExecStream,
    FileInfo,
    PtyHost,
    PtyRequest,
    PtySession,
    ResourceLimits,
    ShellHost,
    ShellUnavailableError,
    SnapshotInfo,
    Snapshotter,
    WorkspaceEvent,
    WorkspaceProvider,
    WorkspaceSpec,
    WorkspaceState,
)
from corral.providers.registry import KNOWN_PROVIDERS, PROVIDER_NAMES
from corral.settings import Settings
from corral.store import UNSET, ProviderAttempt, SessionRecord, Store, WorkspaceRecord, WorkspaceStatus

__all__ = [
    "CreateWorkspace",
    "Lifetime",
    "ProviderProfile",
    "WorkspaceRuntime",
    "WorkspaceService",
    "host_resources",
    "skipped_summary",
]

NO_AUTO_PROVIDER = "no provider that auto selection may use is configured (fake is never auto-selected)"

log = logging.getLogger(__name__)
_T = TypeVar("_T")

WARM_UP_COMMAND = "bash -l -c true 2>/dev/null || true"
"""Run once in every warm workspace before it is offered (see :meth:`WorkspaceService.create_warm`); an image
without bash runs ``true`` only."""


def new_workspace_id() -> str:
    """A workspace id: 16 hex digits, whether it is made cold, warm or from a snapshot (one format everywhere)."""
    return uuid.uuid4().hex[:16]


E2B_METADATA_KEY = "e2b"
"""The metadata key of an E2B sandbox's state (``corral.api.e2b``): it has E2B's timeout, not the idle one."""

EGRESS_KEY = "egress"
"""The metadata key under which a workspace's egress rules are kept (``EgressPolicy.to_json``)."""


@dataclass(frozen=True, slots=True)
class CreateWorkspace:
    """A validated create request (the API's body, after parsing)."""

    provider: str = "auto"
    container_type: str = "agent_workspace"
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    base_image: str | None = None
    network: str = "isolated"
    metadata: Mapping[str, Any] = field(default_factory=dict)
    exclude: frozenset[str] = frozenset()
    """Providers auto selection must not use (a session's retry excludes the provider that just failed)."""
    requester: str | None = None
    """Who asks (a session's id): warm pools count one requester once toward a burst, however often it asks (a
    session asks once for a warm workspace and, on a miss, again while provisioning)."""
    keep_failed: bool = False
    """Keep the ``error`` record of a create that fails (``?keep_failed=true``); by default it is deleted, and the
    error raised says what failed. The reaper deletes kept ones after CORRAL_FAILED_RECORD_TTL_S."""


@dataclass(frozen=True, slots=True)
class Lifetime:
    """When a workspace or session ends unless used: its idle timeout and the time it strikes (None: never)."""

    idle_timeout_s: float | None
    expires_at: datetime | None

    @classmethod
    def never(cls) -> Lifetime:
        """No idle timeout applies."""
        return cls(None, None)

    def to_json(self) -> dict[str, Any]:
        """``idle_timeout_s`` and ``expires_at`` (ISO 8601, UTC) as the API answers them."""
        expires = None if self.expires_at is None else self.expires_at.isoformat().replace("+00:00", "Z")
        return {"idle_timeout_s": self.idle_timeout_s, "expires_at": expires}


def skipped_summary(skipped: Sequence[tuple[str, str]]) -> list[str]:
    """One short warning naming the providers auto selection skipped without trying (empty when none was).

    Their full reasons (an unhealthy provider's can run to several hundred characters) stay at
    ``GET /api/v1/agent/workspaces/providers``; a create that fails everywhere still lists them in its error.
    """
    if not skipped:
        return []
    kinds = []
    for name, reason in skipped:
        if reason.startswith("unhealthy"):
            kinds.append(f"{name} (unhealthy)")
        elif reason.startswith("excluded"):
            kinds.append(f"{name} (failed this request before)")
        else:
            kinds.append(f"{name} (its host is too small for these limits)")
    return [f"skipped {', '.join(kinds)}; reasons at GET /api/v1/agent/workspaces/providers"]


@dataclass(frozen=True, slots=True)
class ProviderProfile:
    """What the service keeps of a provider's capabilities: its isolation and the most its host has."""

    isolation: str
    """``microvm``, ``gvisor``, ``container`` (plain runc), ``remote`` (E2B, HTTP) or ``none`` (the fake)."""
    cpu_count: float | None
    """CPUs of the host the provider runs workspaces on; None when unknown (a remote service)."""
    memory_bytes: int | None
    """Memory of that host; None when unknown."""

    @classmethod
    def of(cls, caps: Capabilities) -> ProviderProfile:
        """Read the host's numbers from ``caps.resources``; a local runtime that reports none gets this host's."""
        cpus = _positive(caps.resources.get("cpu_count"))
        memory = _positive(caps.resources.get("memory_bytes", caps.resources.get("memory_total_bytes")))
        if caps.isolation != "remote":  # the runtime runs on this host even when it cannot say so right now
            host_cpus, host_memory = host_resources()
            cpus = cpus if cpus is not None else host_cpus
            memory = memory if memory is not None else host_memory
        return cls(caps.isolation, cpus, None if memory is None else int(memory))

    def shortfalls(self, limits: ResourceLimits) -> list[str]:
        """What ``limits`` asks for beyond this host's CPUs and memory, one sentence each (empty: it fits)."""
        problems = []
        if self.cpu_count is not None and limits.cpu > self.cpu_count:
            problems.append(f"resource_limits.cpu: {limits.cpu:g} CPUs requested, but the host has {self.cpu_count:g}")
        if self.memory_bytes is not None and limits.memory_bytes > self.memory_bytes:
            problems.append(
                f"resource_limits.memory: {_gib(limits.memory_bytes)} requested, "
                f"but the host has {_gib(self.memory_bytes)}"
            )
        return problems


def _positive(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


def _gib(size: int) -> str:
    return f"{size / 1024**3:.4g} GiB"


@functools.cache
def host_resources() -> tuple[float | None, int | None]:
    """This host's CPU count and total memory in bytes, read once from the OS and /proc (None where unknown)."""
    memory = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024  # the kernel reports kB
                break
    cpus = os.cpu_count()
    return (float(cpus) if cpus else None), memory


class WorkspaceService:
    """Creates, finds and operates workspaces across providers."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        providers: Mapping[str, WorkspaceProvider],
        health: HealthMonitor,
        *,
        pools: WarmPools | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.providers = dict(providers)
        self.health = health
        self._live: dict[str, tuple[str, str]] = {}  # id -> (provider, status), for the hot paths
        self._lifecycle: dict[str, asyncio.Lock] = {}  # id -> held by pause, snapshot, stop, resume, destroy
        self._last_used: dict[str, float] = {}  # id -> time.time() of the last exec or file call
        # Idle time counts at most from this server's start: last uses before a restart are not stored.
        self._started = time.time()
        self._profiles: dict[str, ProviderProfile] = {}  # provider -> its capabilities, fetched once
        self.pools: WarmPools | None = None
        if pools is not None:
            self.attach_pools(pools)
        self._event_tasks: set[asyncio.Task[None]] = set()
        self.runtime = WorkspaceRuntime(self)
        """Runtime calls by workspace id for the layers above (tools, checkout, E2B), through this service."""
        for provider in self.providers.values():
            if isinstance(provider, EventSource):
                provider.subscribe(self._on_event)

    # --- defaults and selection -----------------------------------------------------------------------------------

    def default_limits(self) -> ResourceLimits:
        """Limits from WORKSPACE_DEFAULT_CPU / _MEMORY / _DISK."""
        return self.settings.default_limits()

    def selection_inputs(self) -> SelectionInputs:
        """What auto selection depends on, from settings."""
        return SelectionInputs.of(self.settings, self.providers)

    def plan(self, requested: str, container_type: str) -> tuple[list[str], list[tuple[str, str]]]:
        """The providers to try in order, and those skipped up front with their reason.

        Raises:
            ProviderNotFoundError: an unknown provider name.
            ProviderNotAllowedError: plain ``docker`` named while CORRAL_ALLOW_DOCKER_FALLBACK is false.
            ProviderUnavailableError: a known provider this server is not configured with.
        """
        if requested != "auto":
            if requested not in PROVIDER_NAMES and requested not in self.providers:
                allowed = ["auto", *sorted(set(PROVIDER_NAMES) | set(self.providers))]
                raise ProviderNotFoundError(
                    f"unknown provider {requested!r}; allowed: {', '.join(allowed)}",
                    details={"provider": requested, "allowed": allowed},
                )
            entry = KNOWN_PROVIDERS.get(requested)
            if entry is not None and entry.reduced_isolation and not self.settings.allow_docker_fallback:
                raise ProviderNotAllowedError(
                    f"provider {requested!r} (plain runc: it shares the host kernel) is not allowed on this server; "
                    "use 'auto' or 'gvisor', or ask the operator to set CORRAL_ALLOW_DOCKER_FALLBACK=true",
                    details={"provider": requested, "setting": "CORRAL_ALLOW_DOCKER_FALLBACK"},
                )
            if requested not in self.providers:
                raise ProviderUnavailableError(
                    requested,
                    f"not configured on this server (CORRAL_PROVIDERS={self.settings.providers})",
                )
            return [requested], []
        try_order, unhealthy = fallback_chain(self.selection_inputs(), container_type, self.health.healthy())
        skipped = []
        for name in unhealthy:
            latest = self.health.latest(name)
            reason = latest.error if latest is not None and latest.error else "not checked yet"
            skipped.append((name, f"unhealthy: {reason}"))
        return try_order, skipped

    # --- what providers offer --------------------------------------------------------------------------------------

    async def profile(self, name: str) -> ProviderProfile | None:
        """The provider's isolation and host size from its capabilities, fetched once; None while they fail."""
        cached = self._profiles.get(name)
        if cached is not None or name not in self.providers:
            return cached
        try:
            caps = await self.providers[name].capabilities()
        except Exception as exc:  # a broken capabilities call must not break creation; it is retried next time
            log.warning("provider %s: capabilities failed (%s: %s)", name, type(exc).__name__, exc)
            return None
        profile = self._profiles[name] = ProviderProfile.of(caps)
        return profile

    async def probe_providers(self) -> None:
        """Fetch every provider's profile (at start), so answers can name their isolation without a call."""
        await asyncio.gather(*(self.profile(name) for name in self.providers))

    def isolation_of(self, provider: str | None) -> str | None:
        """The isolation of a provider's workspaces (``microvm``, ``gvisor``, ``container``...), None if unknown."""
        profile = self._profiles.get(provider or "")
        return None if profile is None else profile.isolation

    async def workspace_isolation(self, workspace_id: str | None) -> str | None:
        """The isolation of a workspace (destroyed ones too), None without a workspace or a known provider."""
        if workspace_id is None:
            return None
        live = self._live.get(workspace_id)
        if live is not None:
            return self.isolation_of(live[0])
        record = await self.store.workspaces.get(workspace_id)
        return None if record is None else self.isolation_of(record.provider)

    async def _fit_limits(
        self, request: CreateWorkspace, try_order: list[str], skipped: list[tuple[str, str]]
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """Leave out providers whose host can never give the requested limits; refuse when no candidate could.

        Every provider the plan named counts, unhealthy ones included: a request too big for all of them is bad
        input (422), whatever their health. A provider whose size is unknown (a remote service) may still fit.

        Raises:
            ResourceLimitError: more CPUs or memory than the host of any candidate provider has.
        """
        candidates = list(dict.fromkeys([*try_order, *(name for name, _ in skipped)]))
        shortfalls = {}
        for name in candidates:
            profile = await self.profile(name)
            shortfalls[name] = [] if profile is None else profile.shortfalls(request.limits)
        if candidates and all(shortfalls.values()):
            problems = list(dict.fromkeys(p for name in candidates for p in shortfalls[name]))
            raise ResourceLimitError(
                "; ".join(problems) + "; no provider of this server can ever give that much",
                details={"field": "resource_limits", "problems": problems},
            )
        refused = [(name, "; ".join(shortfalls[name])) for name in try_order if shortfalls[name]]
        return [name for name in try_order if not shortfalls[name]], [*skipped, *refused]

    def attach_pools(self, pools: WarmPools) -> None:
        """Serve warm workspaces from ``pools``; the service does their work (it is their :class:`PoolBackend`)."""
        self.pools = pools
        pools.attach(self)

    # --- warm pools' work (PoolBackend) ---------------------------------------------------------------------------

    async def create_warm(self, spec: PoolSpec) -> None:
        """Create one ready workspace for a pool (restored from the pool's snapshot, for a snapshot's pool); its
        record carries the pool key until a request claims it."""
        provider = self.providers.get(spec.provider)
        if provider is None:
            raise ProviderUnavailableError(spec.provider, "not configured on this server")
        if spec.snapshot_id is not None and not isinstance(provider, Snapshotter):
            raise ProviderUnavailableError(spec.provider, "it cannot restore snapshots")
        # Store calls are shielded: the pools cancel refills on shutdown, and a database call cut in half could leave
        # SQLite's write lock held. A cancelled provider create cleans up after itself; its record stays
        # "creating" in the pool, so the drain (or reconciliation) removes it.
        record = await asyncio.shield(
            self.store.workspaces.create(
                id=new_workspace_id(),
                requested_provider=spec.provider,
                container_type="agent_workspace",
                resource_limits=spec.limits.to_json(),
                network=spec.network,
                base_image=spec.image,
                provider=spec.provider,
                pool_key=spec.key,
                metadata={"from_snapshot": spec.snapshot_id} if spec.snapshot_id is not None else None,
            )
        )
        workspace_spec = WorkspaceSpec(
            id=record.id,
            image=spec.image,
            limits=spec.limits,
            network=spec.network,  # type: ignore[arg-type]  # validated when the pool was configured
        )
        try:
            if spec.snapshot_id is not None:
                assert isinstance(provider, Snapshotter)  # checked above
                await provider.restore(workspace_spec, spec.snapshot_id)
            else:
                await provider.create(workspace_spec)
        except CorralError as exc:
            await asyncio.shield(self.store.workspaces.update(record.id, status="destroyed", error=exc.message))
            raise
        # The first command in a new sandbox costs about 8 ms more than later ones under gVisor (the agent's and the
        # spawner's first run, files not yet cached): a warm workspace pays it here, not its claimer's first command.
        # A login shell, because that is how E2B's SDK starts every command; any failure is the claimer's to see.
        with contextlib.suppress(CorralError):
            await provider.exec(record.id, ExecRequest(WARM_UP_COMMAND, timeout_s=30))
        # A claim keeps the warnings written here: the isolation notice restore() gives its workspaces.
        warnings = self._provider_warnings(spec.provider) if spec.snapshot_id is not None else UNSET
        await asyncio.shield(self.store.workspaces.update(record.id, status="ready", warnings=warnings))

    async def claim_warm(self, key: str, claim: Claim, container_type: str) -> WorkspaceRecord | None:
        """Take the oldest ready workspace out of a pool in one statement that also writes ``claim`` on it."""
        return await self.store.workspaces.claim_from_pool(
            key,
            requested_provider=claim.requested_provider,
            container_type=container_type,
            metadata=claim.metadata,
            warnings=claim.warnings,
            provider_attempts=claim.provider_attempts,
        )

    async def warm_records(self, key: str, statuses: tuple[WorkspaceStatus, ...]) -> list[WorkspaceRecord]:
        """A pool's workspaces in these statuses."""
        return await self.store.workspaces.list(status=statuses, pool_key=key)

    def known_dead(self, record: WorkspaceRecord) -> bool:
        """Whether the record's provider saw its runtime die since it started (no I/O; unknown: not dead)."""
        provider: object = self.providers.get(record.provider or "")
        if provider is None:
            return True
        return isinstance(provider, DeathWatcher) and provider.known_dead(record.id)

    # --- lifecycle ------------------------------------------------------------------------------------------------

    async def create(self, request: CreateWorkspace) -> WorkspaceRecord:
        """Create a workspace, falling back along the chain for ``auto``.

        Only provider failures fall back (a runtime missing or down, a transient capacity limit such as
        Firecracker's most VMs); bad input is refused before any provider is tried.

        Raises:
            InvalidRequestError: bad input (network, container type, image reference), or a provider found it bad.
            ProviderNotFoundError: an unknown provider name.
            ProviderNotAllowedError: plain ``docker`` named while CORRAL_ALLOW_DOCKER_FALLBACK is false.
            ResourceLimitError: limits that no candidate provider's host can ever give.
            ProviderUnavailableError: the explicit provider failed (no fallback), with its reason.
            AllProvidersFailedError: auto selection exhausted the chain; lists every provider and reason.
        """
        self._validate(request)
        try_order, skipped = self.plan(request.provider, request.container_type)
        try_order, skipped = await self._fit_limits(request, try_order, skipped)
        if request.provider == "auto" and request.exclude:
            skipped += [(p, "excluded: it failed this request before") for p in try_order if p in request.exclude]
            try_order = [p for p in try_order if p not in request.exclude]
        image = request.base_image or self.settings.base_image
        warm = await self._from_pool(request, try_order, skipped, image)
        if warm is not None:
            return warm
        workspace_id = new_workspace_id()
        await self.store.workspaces.create(
            id=workspace_id,
            requested_provider=request.provider,
            container_type=request.container_type,
            resource_limits=request.limits.to_json(),
            network=request.network,
            base_image=image,
            metadata=request.metadata,
        )
        spec = WorkspaceSpec(
            id=workspace_id,
            image=image,
            limits=request.limits,
            network=request.network,  # type: ignore[arg-type]  # checked above
            container_type=request.container_type,  # type: ignore[arg-type]  # checked above
        )
        attempts: list[tuple[str, str]] = []  # providers tried; skipped ones are summarised in one warning
        for index, name in enumerate(try_order):
            try:
                await self.providers[name].create(spec)
            except InvalidRequestError:
                await self._failed(request, workspace_id, error="invalid request")
                raise
            except CorralError as exc:
                attempts.append((name, exc.reason if isinstance(exc, ProviderUnavailableError) else exc.message))
            except Exception as exc:  # a provider bug must not end the chain or strand the record
                log.exception("workspace %s: provider %s failed unexpectedly", workspace_id, name)
                attempts.append((name, f"unexpected {type(exc).__name__}: {exc}"))
            except BaseException:  # cancelled (client gone, shutdown): the record must not stay "creating"
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._failed(request, workspace_id, error="creation was cancelled"))
                raise
            else:
                record = await self.store.workspaces.update(
                    workspace_id,
                    status="ready",
                    provider=name,
                    provider_attempts=[ProviderAttempt(p, e) for p, e in attempts],
                    warnings=[*self._provider_warnings(name), *skipped_summary(skipped)],
                )
                self._live[workspace_id] = (name, "ready")
                return record
            if request.provider == "auto" and index + 1 < len(try_order):
                log.warning(
                    "workspace %s: %s failed (%s); falling back to %s",
                    workspace_id,
                    name,
                    attempts[-1][1],
                    try_order[index + 1],
                )
        every = [*skipped, *attempts]  # the error names every provider, skipped ones with their full reason
        await self._failed(
            request,
            workspace_id,
            error="; ".join(f"{p}: {e}" for p, e in every) or NO_AUTO_PROVIDER,
            attempts=attempts,
            warnings=skipped_summary(skipped),
        )
        kept = {"workspace_id": workspace_id} if request.keep_failed else {}
        if request.provider != "auto":
            name, reason = every[0]
            raise ProviderUnavailableError(name, reason, details=kept)
        error = AllProvidersFailedError(every)
        error.details.update(kept)
        raise error

    async def _failed(
        self,
        request: CreateWorkspace,
        workspace_id: str,
        *,
        error: str,
        attempts: Sequence[tuple[str, str]] = (),
        warnings: Sequence[str] = (),
    ) -> None:
        """End a failed create: the record is deleted, or kept in ``error`` when the request asked for it.

        The providers already removed whatever they had made (a failed or cancelled create cleans up after itself).
        """
        if not request.keep_failed:
            await self.store.workspaces.delete(workspace_id)
            return
        await self.store.workspaces.update(
            workspace_id,
            status="error",
            provider_attempts=[ProviderAttempt(p, e) for p, e in attempts],
            warnings=list(warnings),
            error=error,
        )

    @staticmethod
    def _validate(request: CreateWorkspace) -> None:
        if request.base_image is not None:
            check_image_reference(request.base_image, field_name="base_image")
        if request.network not in ("isolated", "default"):
            raise InvalidRequestError(
                f"network: {request.network!r} is not allowed; use 'isolated' or 'default'",
                details={"field": "network"},
            )
        if request.container_type not in ("agent_workspace", "mcp_server"):
            raise InvalidRequestError(
                f"container_type: {request.container_type!r} is not allowed; use 'agent_workspace' or 'mcp_server'",
                details={"field": "container_type"},
            )

    async def restore_if_warm(self, snapshot_id: str, metadata: Mapping[str, Any]) -> WorkspaceRecord | None:
        """A workspace restored ahead of time from the snapshot, out of its warm pool with ``metadata`` written on
        it, or None when no pool holds one (nothing is restored here)."""
        if self.pools is None:
            return None
        record = await self.pools.acquire_restored(snapshot_id, claim=Claim(metadata=metadata))
        if record is not None:
            self._live[record.id] = (record.provider or "", "ready")
        return record

    async def create_if_warm(self, request: CreateWorkspace) -> WorkspaceRecord | None:
        """A warm workspace for this request if a pool has one, else None (no cold start is attempted)."""
        self._validate(request)
        try_order, skipped = self.plan(request.provider, request.container_type)
        return await self._from_pool(request, try_order, skipped, request.base_image or self.settings.base_image)

    async def _from_pool(
        self, request: CreateWorkspace, try_order: list[str], skipped: list[tuple[str, str]], image: str
    ) -> WorkspaceRecord | None:
        """A warm workspace when the provider selection chose and the rest of the pool key match."""
        if self.pools is None or not try_order:
            return None
        claim = Claim(
            requested_provider=request.provider,
            metadata=request.metadata,
            warnings=[*self._provider_warnings(try_order[0]), *skipped_summary(skipped)],
            provider_attempts=[],  # nothing was tried: the pool's workspace was made before this request
            requester=request.requester,
        )
        record = await self.pools.acquire(
            try_order[0], image, request.limits, request.network, request.container_type, claim=claim
        )
        if record is not None:
            self._live[record.id] = (try_order[0], "ready")
        return record

    def _provider_warnings(self, provider: str) -> list[str]:
        """What a workspace of this provider is told about its isolation (from the provider's capabilities)."""
        if self.isolation_of(provider) == "container":
            return [f"isolation is reduced: {provider} runs plain containers (runc), which share the host kernel"]
        return []

    async def get(self, workspace_id: str) -> WorkspaceRecord:
        """The record, destroyed ones included.

        Raises:
            WorkspaceNotFoundError: no record with that id.
        """
        record = await self.store.workspaces.get(workspace_id)
        if record is None:
            raise WorkspaceNotFoundError(f"workspace {workspace_id!r} does not exist", details={"id": workspace_id})
        return record

    async def list_workspaces(self, *, include_warm: bool = False) -> list[WorkspaceRecord]:
        """Every workspace that is not destroyed and (unless ``include_warm``) not waiting in a warm pool, oldest
        first."""
        return [r for r in await self.store.workspaces.list() if include_warm or r.pool_key is None]

    async def discard(self, workspace_id: str) -> None:
        """Destroy runtime objects and mark the record destroyed, whatever its state (pool, error, creating)."""
        record = await self.get(workspace_id)
        provider = self.providers.get(record.provider or "")
        if provider is not None:
            try:
                await provider.destroy(workspace_id)
            except CorralError as exc:
                log.warning("could not remove runtime objects of %s: %s", workspace_id, exc.message)
        self._live.pop(workspace_id, None)
        self._last_used.pop(workspace_id, None)
        if record.status != "destroyed":
            await self.store.workspaces.update(workspace_id, status="destroyed")

    def note_use(self, workspace_id: str) -> None:
        """Count use that goes around the runtime calls (typing into an open terminal) for the idle timeout."""
        self._last_used[workspace_id] = time.time()

    def last_used(self, workspace_id: str) -> float | None:
        """``time.time()`` of the workspace's last exec or file call in this process, if any."""
        return self._last_used.get(workspace_id)

    # --- lifetimes (the reaper acts on them; answers show them) ----------------------------------------------------

    def idle_timeout_of(self, record: WorkspaceRecord) -> float | None:
        """The idle timeout that applies to the workspace, or None: CORRAL_IDLE_TIMEOUT_S is 0, it waits in a warm
        pool, or it is an E2B sandbox (those keep E2B's own timeout)."""
        timeout = self.settings.idle_timeout_s
        if timeout <= 0 or record.pool_key is not None or E2B_METADATA_KEY in record.metadata:
            return None
        return timeout

    def last_activity(self, workspace_id: str | None, *since: datetime | None) -> float:
        """``time.time()`` the idle clock counts from: the workspace's last exec or file call, the latest of
        ``since``, or this server's start, whichever came last."""
        times = [self._started, *(t.timestamp() for t in since if t is not None)]
        if workspace_id is not None:
            times.append(self._last_used.get(workspace_id, 0.0))
        return max(times)

    def workspace_lifetime(self, record: WorkspaceRecord) -> Lifetime:
        """When the idle timeout stops this workspace (only a ready one has an ``expires_at``).

        A session's workspace ends with its session, which counts the same calls (see :meth:`session_lifetime`).
        """
        timeout = self.idle_timeout_of(record)
        if timeout is None:
            return Lifetime.never()
        if record.status != "ready":
            return Lifetime(timeout, None)
        used = self.last_activity(record.id, record.created_at, record.last_used_at)
        return Lifetime(timeout, datetime.fromtimestamp(used + timeout, UTC))

    def session_lifetime(self, session: SessionRecord) -> Lifetime:
        """When the idle timeout ends this session: only an active one has an ``expires_at``; its tool calls run in
        its workspace, so the workspace's last use counts."""
        timeout = self.settings.idle_timeout_s
        if timeout <= 0:
            return Lifetime.never()
        if session.status != "active":
            return Lifetime(timeout, None)
        used = self.last_activity(session.workspace_id, session.created_at, session.updated_at)
        return Lifetime(timeout, datetime.fromtimestamp(used + timeout, UTC))

    async def destroy(self, workspace_id: str) -> WorkspaceRecord:
        """See :meth:`_destroy`; one lifecycle change at a time."""
        async with self._held(workspace_id):
            record = await self._destroy(workspace_id)
        self._lifecycle.pop(workspace_id, None)
        return record

    async def _destroy(self, workspace_id: str) -> WorkspaceRecord:
        """Remove the runtime objects and mark the record destroyed. Destroying twice is fine."""
        record = await self.get(workspace_id)
        if record.status == "destroyed":
            return record
        if record.provider is not None and record.provider in self.providers:
            await self.providers[record.provider].destroy(workspace_id)
        self._live.pop(workspace_id, None)
        self._last_used.pop(workspace_id, None)
        return await self.store.workspaces.update(workspace_id, status="destroyed")

    async def stop(self, workspace_id: str) -> WorkspaceRecord:
        """See :meth:`_stop`; one lifecycle change at a time."""
        async with self._held(workspace_id):
            return await self._stop(workspace_id)

    async def _stop(self, workspace_id: str) -> WorkspaceRecord:
        """Stop a ready (or paused) workspace: its processes end, its disk is kept (all of it where the provider's
        ``persistence`` is "full"). A paused workspace's memory is discarded."""
        provider, record = await self._operable(workspace_id, allow_stopped=True)
        if record.status == "stopped":
            return record
        await provider.stop(workspace_id)
        self._live[workspace_id] = (record.provider or "", "stopped")
        return await self.store.workspaces.update(workspace_id, status="stopped")

    async def pause(self, workspace_id: str) -> tuple[WorkspaceRecord, str]:
        """See :meth:`_pause`; one lifecycle change at a time."""
        async with self._held(workspace_id):
            return await self._pause(workspace_id)

    async def _pause(self, workspace_id: str) -> tuple[WorkspaceRecord, str]:
        """Pause a ready workspace, freeing its CPU and memory; returns the record and what was kept: "memory"
        (processes and memory come back on resume; status ``paused``) or "filesystem" (a stop keeping the disk, for
        providers that cannot checkpoint memory; status ``stopped``)."""
        provider, record = await self._operable(workspace_id, allow_stopped=True)
        if record.status == "paused":
            return record, "memory"
        if record.status == "stopped":
            raise WorkspaceStateError(
                f"workspace {workspace_id} is stopped; resume it before pausing", details={"id": workspace_id}
            )
        if isinstance(provider, Snapshotter):
            kept = await provider.pause(workspace_id)
        else:
            await provider.stop(workspace_id)
            kept = "filesystem"
        status: WorkspaceStatus = "paused" if kept == "memory" else "stopped"
        self._live[workspace_id] = (record.provider or "", status)
        return await self.store.workspaces.update(workspace_id, status=status), kept

    async def resume(self, workspace_id: str) -> WorkspaceRecord:
        """See :meth:`_resume`; one lifecycle change at a time."""
        async with self._held(workspace_id):
            return await self._resume(workspace_id)

    async def _resume(self, workspace_id: str) -> WorkspaceRecord:
        """Resume a stopped or paused workspace (a ready one is returned as it is); a paused one gets its processes
        and memory back.

        A workspace in ``error`` whose runtime objects still exist (its agent broke the protocol) is restarted:
        stopped, then resumed with a fresh agent; whatever drove the old one ends with its container.
        """
        record = await self.get(workspace_id)
        if record.status == "error" and record.provider in self.providers and record.pool_key is None:
            return await self._restart_broken(record)
        provider, record = await self._operable(workspace_id, allow_stopped=True)
        if record.status == "ready":
            return record
        await provider.resume(workspace_id)
        self._live[workspace_id] = (record.provider or "", "ready")
        self._last_used[workspace_id] = time.time()  # a resume is use: the idle clock starts again
        return await self.store.workspaces.update(workspace_id, status="ready")

    async def _restart_broken(self, record: WorkspaceRecord) -> WorkspaceRecord:
        provider = self.providers[record.provider or ""]
        if await provider.state(record.id) is WorkspaceState.MISSING:
            raise WorkspaceStateError(
                f"workspace {record.id} is error ({record.error or 'unknown reason'}) and has nothing left to resume",
                details={"id": record.id, "status": record.status},
            )
        log.warning("workspace %s: restarting it after an error (%s)", record.id, record.error)
        await provider.stop(record.id)
        await provider.resume(record.id)
        self._live[record.id] = (record.provider or "", "ready")
        return await self.store.workspaces.update(record.id, status="ready", error=None)

    # --- events from the runtime ------------------------------------------------------------------------------------

    def _on_event(self, event: WorkspaceEvent) -> None:
        """A provider saw a workspace die or break on its own: the record follows at once, for every API."""
        live = self._live.get(event.workspace_id)
        if live is not None and live[1] == "ready":
            self._live[event.workspace_id] = (live[0], "stopped" if event.kind == "died" else "error")
        task = asyncio.create_task(self._record_event(event), name=f"workspace-event-{event.workspace_id}")
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)

    async def _record_event(self, event: WorkspaceEvent) -> None:
        try:
            record = await self.store.workspaces.get(event.workspace_id)
            if record is None or record.status != "ready" or record.pool_key is not None:
                return  # not a workspace in use (pools check their own), or already marked
            if event.kind == "died":
                log.warning("workspace %s stopped on its own: %s", event.workspace_id, event.reason)
                await self.store.workspaces.add_warnings(  # first, so whoever sees "stopped" sees why
                    event.workspace_id, f"stopped on its own: {event.reason}; resume brings it back"
                )
                await self.store.workspaces.update(event.workspace_id, status="stopped")
            else:
                log.warning("workspace %s is broken: %s", event.workspace_id, event.reason)
                await self.store.workspaces.update(event.workspace_id, status="error", error=event.reason)
        except CorralError as exc:
            log.warning("could not record %s for workspace %s: %s", event.kind, event.workspace_id, exc.message)

    async def settle(self) -> None:
        """Wait until every runtime event received so far is recorded (tests and shutdown use this)."""
        while self._event_tasks:
            await asyncio.gather(*list(self._event_tasks), return_exceptions=True)

    # --- operations -----------------------------------------------------------------------------------------------

    async def ensure_ready(self, workspace_id: str) -> None:
        """Raise the error that says why the workspace cannot take calls now (destroyed, stopped, broken...)."""
        await self._provider_of(workspace_id)

    async def _provider_of(self, workspace_id: str) -> WorkspaceProvider:
        """The provider of a ready workspace (fast path: no database access once cached)."""
        self._last_used[workspace_id] = time.time()
        held = self._lifecycle.get(workspace_id)
        if held is not None and held.locked():  # being paused, snapshotted, stopped...: wait for the outcome
            async with held:
                pass
        live = self._live.get(workspace_id)
        if live is not None and live[1] == "ready":
            return self.providers[live[0]]
        provider, _ = await self._operable(workspace_id, allow_stopped=False)
        return provider

    async def _operable(self, workspace_id: str, *, allow_stopped: bool) -> tuple[WorkspaceProvider, WorkspaceRecord]:
        record = await self.get(workspace_id)
        if record.status == "destroyed":
            raise WorkspaceDestroyedError(f"workspace {workspace_id} has been destroyed", details={"id": workspace_id})
        if record.status in ("stopped", "paused") and not allow_stopped:
            raise WorkspaceStateError(
                f"workspace {workspace_id} is {record.status}; resume it first",
                details={"id": workspace_id, "status": record.status},
            )
        if record.status not in ("ready", "stopped", "paused") or record.provider is None:
            raise WorkspaceStateError(
                f"workspace {workspace_id} is {record.status}: {record.error or 'not ready'}",
                details={"id": workspace_id, "status": record.status},
            )
        provider = self.providers.get(record.provider)
        if provider is None:
            raise ProviderUnavailableError(record.provider, "the workspace's provider is not configured on this server")
        self._live[workspace_id] = (record.provider, record.status)
        return provider, record

    async def _guarded(self, workspace_id: str, call: Callable[[WorkspaceProvider], Awaitable[_T]]) -> _T:
        """One runtime call on a ready workspace; what it finds out about the workspace is recorded at once.

        A workspace whose container died on its own (OOM, killed from outside) is marked ``stopped``; one whose agent
        broke the protocol ``error``. Every API sees it, and ``resume`` brings it back.
        """
        provider = await self._provider_of(workspace_id)
        try:
            return await call(provider)
        except (WorkspaceStateError, WorkspaceBrokenError) as exc:
            await self._runtime_failed(workspace_id, provider, exc)
            raise

    async def _runtime_failed(self, workspace_id: str, provider: WorkspaceProvider, exc: CorralError) -> None:
        if isinstance(exc, WorkspaceBrokenError):
            # The answer leaves after the record says so (the provider's event may still be on its way).
            await self._record_event(WorkspaceEvent(workspace_id, "broken", exc.message))
            self._live[workspace_id] = (self._live.get(workspace_id, ("", ""))[0], "error")
        elif await provider.state(workspace_id) is WorkspaceState.STOPPED:
            await self._record_event(WorkspaceEvent(workspace_id, "died", "its sandbox was found stopped"))
            self._live[workspace_id] = (self._live.get(workspace_id, ("", ""))[0], "stopped")

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """Run a command in a ready workspace (a nonzero exit is a result; see :meth:`_guarded` for failures)."""
        request.validate()
        return await self.runtime.exec(workspace_id, request)

    def exec_stream(self, workspace_id: str, request: ExecRequest) -> ExecStream:
        """Run a command, yielding its output as produced and its exit last (closing early kills it)."""
        request.validate()
        return self.runtime.exec_stream(workspace_id, request)

    async def read_file(self, workspace_id: str, path: str) -> ByteStream:
        """Open a file inside /workspace for streaming."""
        return await self.runtime.read_file(workspace_id, lexically_confined(path), beneath=WORKSPACE_ROOT)

    async def write_file(
        self, workspace_id: str, path: str, data: bytes | AsyncIterable[bytes], *, mode: int | None = None
    ) -> tuple[str, int]:
        """Write a file inside /workspace; returns the absolute path and bytes written."""
        absolute = lexically_confined(path)
        if absolute == WORKSPACE_ROOT:
            raise InvalidRequestError("path: /workspace is a directory, not a file", details={"field": "path"})
        written = await self.runtime.write_file(workspace_id, absolute, data, mode=mode, beneath=WORKSPACE_ROOT)
        return absolute, written

    async def delete(self, workspace_id: str, path: str, *, recursive: bool) -> None:
        """Delete a file or directory inside /workspace (not /workspace itself)."""
        absolute = lexically_confined(path)
        if absolute == WORKSPACE_ROOT:
            raise InvalidRequestError("path: refusing to delete /workspace itself", details={"field": "path"})
        await self.runtime.delete(workspace_id, absolute, recursive=recursive, beneath=WORKSPACE_ROOT)

    async def stat(self, workspace_id: str, path: str) -> FileInfo:
        """Stat a path inside /workspace."""
        return await self.runtime.stat(workspace_id, lexically_confined(path), beneath=WORKSPACE_ROOT)

    async def list_dir(self, workspace_id: str, path: str) -> list[FileInfo]:
        """List a directory inside /workspace."""
        return await self.runtime.list_dir(workspace_id, lexically_confined(path), beneath=WORKSPACE_ROOT)

    async def glob(self, workspace_id: str, pattern: str, path: str) -> list[str]:
        """Glob under a directory inside /workspace; ``..`` in the pattern is refused."""
        if not pattern or "\x00" in pattern:
            raise InvalidRequestError("pattern: must be a non-empty glob pattern", details={"field": "pattern"})
        if pattern.startswith("/") or ".." in pattern.split("/"):
            raise InvalidRequestError(
                "pattern: must be relative to path and must not contain '..'", details={"field": "pattern"}
            )
        root = lexically_confined(path)
        return await self.runtime.glob(workspace_id, pattern, root=root, beneath=WORKSPACE_ROOT)

    async def move(self, workspace_id: str, src: str, dst: str) -> None:
        """Rename inside /workspace."""
        source = lexically_confined(src, field_name="src")
        target = lexically_confined(dst, field_name="dst")
        if WORKSPACE_ROOT in (source, target):
            raise InvalidRequestError("src/dst: /workspace itself cannot be moved", details={"field": "src"})
        await self.runtime.move(workspace_id, source, target, beneath=WORKSPACE_ROOT)

    async def chmod(self, workspace_id: str, path: str, mode: int) -> None:
        """Change permission bits inside /workspace."""
        if not 0 <= mode <= 0o7777:
            raise InvalidRequestError(
                f"mode: {mode:o} is not a permission mode (0 to 7777 octal)", details={"field": "mode"}
            )
        await self.runtime.chmod(workspace_id, lexically_confined(path), mode, beneath=WORKSPACE_ROOT)

    async def disk_usage(self, workspace_id: str) -> int | None:
        """Bytes used under /workspace, where the provider watches a limit it cannot enforce; else None."""
        record = await self.get(workspace_id)
        provider: object = self.providers.get(record.provider or "")
        if not isinstance(provider, DiskUsageReporter):
            return None
        return await self._guarded(workspace_id, lambda _: provider.disk_usage(workspace_id))

    # --- reconciliation's work -------------------------------------------------------------------------------------

    # --- snapshots (records: corral.orchestrator.snapshots) ------------------------------------------------------

    async def snapshotter(self, workspace_id: str) -> tuple[Snapshotter, WorkspaceRecord]:
        """The provider of a ready workspace, when it takes snapshots.

        Raises:
            WorkspaceStateError: the workspace is not ready (stopped, paused, error...).
            InvalidRequestError: its provider cannot take snapshots (capabilities say ``snapshots: "none"``).
        """
        provider, record = await self._operable(workspace_id, allow_stopped=False)
        if not isinstance(provider, Snapshotter):
            raise InvalidRequestError(
                f"workspace {workspace_id} runs on {record.provider}, which cannot take snapshots or fork; "
                "snapshots need a provider whose capabilities say snapshots: memory or filesystem (gvisor, docker)",
                details={"id": workspace_id, "provider": record.provider},
            )
        return provider, record

    async def snapshot_estimate(self, workspace_id: str) -> int:
        """Bytes a snapshot of the workspace would hold, as far as its provider can tell beforehand (0: unknown)."""
        provider, _ = await self.snapshotter(workspace_id)
        estimate = getattr(provider, "snapshot_estimate", None)
        return int(await estimate(workspace_id)) if estimate is not None else 0

    async def take_snapshot(self, workspace_id: str, snapshot_id: str) -> SnapshotInfo:
        """The provider's snapshot of a ready workspace (the caller holds the snapshot's record)."""
        provider, _ = await self.snapshotter(workspace_id)
        async with self._held(workspace_id):
            return await provider.snapshot(workspace_id, snapshot_id)

    async def set_egress(self, workspace_id: str, policy: EgressPolicy | None) -> WorkspaceRecord:
        """Put egress rules in force in a networked workspace (None lifts them), now and after every resume; they
        are kept in its metadata under ``"egress"`` so a restarted server puts them back (see ``restore_egress``).

        Raises:
            InvalidRequestError: The workspace is isolated, or its provider cannot enforce rules.
        """
        provider, record = await self._operable(workspace_id, allow_stopped=True)
        if record.network != "default":
            raise InvalidRequestError(
                f"workspace {workspace_id} has no network (isolated): egress rules apply to networked workspaces",
                details={"id": workspace_id, "field": "network"},
            )
        if not isinstance(provider, EgressControl):
            raise InvalidRequestError(
                f"provider {record.provider} cannot enforce egress rules; gvisor and docker can",
                details={"id": workspace_id, "provider": record.provider},
            )
        async with self._held(workspace_id):
            await provider.set_egress(workspace_id, policy)
        metadata = {k: v for k, v in record.metadata.items() if k != EGRESS_KEY}
        if policy is not None and not policy.empty:
            metadata[EGRESS_KEY] = policy.to_json()
        return await self.set_metadata(workspace_id, metadata)

    async def restore_egress(self, workspace_id: str) -> None:
        """Give the provider back the rules a workspace's metadata keeps (after a restart: the kernel still holds
        them in a running workspace, but this process's proxy and the rules for its next start are gone)."""
        record = await self.get(workspace_id)
        stored = record.metadata.get(EGRESS_KEY)
        if not isinstance(stored, dict) or record.provider not in self.providers:
            return
        provider = self.providers[record.provider]
        if isinstance(provider, EgressControl):
            await provider.set_egress(workspace_id, EgressPolicy.from_json(stored))

    @contextlib.asynccontextmanager
    async def _held(self, workspace_id: str) -> AsyncIterator[None]:
        """One lifecycle change of a workspace at a time (pause, snapshot, stop, resume, destroy), and calls on it
        wait meanwhile: while its sandbox is checkpointed it looks stopped, and a call that found it so would record
        it as having died; a stop in the middle of a snapshot would be undone by the snapshot's restore."""
        lock = self._lifecycle.setdefault(workspace_id, asyncio.Lock())
        async with lock:
            yield

    async def restore(
        self,
        provider_name: str,
        snapshot_id: str,
        *,
        source: CreateWorkspace,
        metadata: Mapping[str, Any],
    ) -> WorkspaceRecord:
        """A new ready workspace restored from a snapshot of ``provider_name``, with the limits, image, network and
        container type of ``source`` (the snapshot's own).

        Raises:
            ProviderUnavailableError: the provider is not configured here or cannot restore snapshots.
        """
        provider = self.providers.get(provider_name)
        if provider is None or not isinstance(provider, Snapshotter):
            raise ProviderUnavailableError(provider_name, "not configured on this server, or it has no snapshots")
        limits, network, container_type = source.limits, source.network, source.container_type
        image = source.base_image or self.settings.base_image
        workspace_id = new_workspace_id()
        await self.store.workspaces.create(
            id=workspace_id,
            requested_provider=provider_name,
            provider=provider_name,
            container_type=container_type,
            resource_limits=limits.to_json(),
            network=network,
            base_image=image,
            metadata=metadata,
        )
        spec = WorkspaceSpec(
            id=workspace_id,
            image=image,
            limits=limits,
            network=network,  # type: ignore[arg-type]  # a stored workspace's, checked when it was created
            container_type=container_type,  # type: ignore[arg-type]
        )
        try:
            await provider.restore(spec, snapshot_id)
        except BaseException as exc:
            reason = exc.message if isinstance(exc, CorralError) else f"restore failed: {type(exc).__name__}"
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.workspaces.update(workspace_id, status="error", error=reason))
            raise
        self._live[workspace_id] = (provider_name, "ready")
        return await self.store.workspaces.update(
            workspace_id, status="ready", warnings=self._provider_warnings(provider_name)
        )

    async def remove_snapshot(self, provider_name: str, snapshot_id: str) -> None:
        """Remove a snapshot's runtime objects (idempotent; a provider not configured here is skipped)."""
        provider = self.providers.get(provider_name)
        if provider is not None and isinstance(provider, Snapshotter):
            await provider.delete_snapshot(snapshot_id)

    async def runtime_snapshot_ids(self) -> dict[str, set[str]]:
        """Per provider that takes snapshots: the ids it holds runtime objects for (reconciliation)."""
        out: dict[str, set[str]] = {}
        for name, provider in self.providers.items():
            if isinstance(provider, Snapshotter):
                try:
                    out[name] = set(await provider.list_snapshots())
                except CorralError as exc:
                    log.warning("could not list the snapshots of %s: %s", name, exc.message)
        return out

    async def runtime_ids(self, provider: str) -> set[str]:
        """Ids of every workspace the provider holds runtime objects for (running or stopped)."""
        return set(await self.providers[provider].list_workspaces())

    async def remove_runtime(self, provider: str, workspace_id: str) -> None:
        """Destroy runtime objects no live record owns (orphans, interrupted creates)."""
        await self.providers[provider].destroy(workspace_id)
        self._forget(workspace_id)

    async def mark_error(self, workspace_id: str, reason: str) -> WorkspaceRecord:
        """Record that the workspace failed (or vanished) and why."""
        self._forget(workspace_id)
        return await self.store.workspaces.update(workspace_id, status="error", error=reason)

    async def mark_status(self, workspace_id: str, status: WorkspaceStatus) -> WorkspaceRecord:
        """Record a state the runtime was found in (``stopped`` or ``ready`` after a restart)."""
        record = await self.store.workspaces.update(workspace_id, status=status)
        if record.provider is not None:
            self._live[workspace_id] = (record.provider, status)
        return record

    def _forget(self, workspace_id: str) -> None:
        self._live.pop(workspace_id, None)
        self._last_used.pop(workspace_id, None)

    # --- what the layers above record on a workspace ---------------------------------------------------------------

    async def add_warnings(self, workspace_id: str, *warnings: str) -> WorkspaceRecord:
        """Append warnings the workspace's answers show (setup failures, disk usage), each once."""
        return await self.store.workspaces.add_warnings(workspace_id, *warnings)

    async def set_metadata(self, workspace_id: str, metadata: Mapping[str, Any]) -> WorkspaceRecord:
        """Replace the workspace's metadata (E2B's extras, a session's task)."""
        return await self.store.workspaces.update(workspace_id, metadata=metadata)

    async def runtime_state(self, workspace_id: str) -> WorkspaceState:
        """What the provider's runtime holds for this workspace."""
        record = await self.get(workspace_id)
        if record.provider is None or record.provider not in self.providers:
            return WorkspaceState.MISSING
        return await self.providers[record.provider].state(workspace_id)

    async def provider_status(self) -> list[dict[str, Any]]:
        """Per configured provider: cached health, active workspaces, resources and capabilities."""
        records = await self.store.workspaces.list(status=("ready", "stopped", "paused", "creating"))
        out = []
        for name, provider in self.providers.items():
            health = self.health.latest(name)
            try:
                caps: dict[str, Any] = dataclasses.asdict(await provider.capabilities())
            except Exception as exc:  # capabilities must not break the status page
                caps = {"error": f"{type(exc).__name__}: {exc}"}
            out.append(
                {
                    "name": name,
                    "status": "healthy" if health is not None and health.healthy else "unhealthy",
                    "last_check": health.checked_at.isoformat() if health is not None else None,
                    "active_workspaces": sum(1 for r in records if r.provider == name),
                    "available_resources": caps.get("resources", {}),
                    "capabilities": caps,
                    "error": None if health is None else health.error,
                }
            )
            if health is None:
                out[-1]["error"] = "not checked yet"
        return out

    async def aclose(self) -> None:
        """Close every provider's connections (workspaces keep running)."""
        await self.settle()
        for provider in self.providers.values():
            with contextlib.suppress(Exception):
                await provider.aclose()


class WorkspaceRuntime:
    """Runtime calls on workspaces by id, with the provider's signatures, each one through the service.

    Everything above the orchestrator that works inside a workspace (the agent tools, checkout, E2B's envd) holds this
    instead of a provider: the workspace must be ready, a workspace found dead or broken on the way is recorded at
    once for every API (see :meth:`WorkspaceService._guarded`), and its last use is noted for the reaper. Paths are
    passed as given: ``beneath`` confines a call (the agent enforces it race-free); without it the call is
    unconfined, as E2B's envd needs (it addresses the whole sandbox, as E2B does).
    """

    def __init__(self, service: WorkspaceService) -> None:
        self._service = service

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """See :meth:`WorkspaceProvider.exec`."""
        return await self._service._guarded(workspace_id, lambda p: p.exec(workspace_id, request))

    async def exec_stream(self, workspace_id: str, request: ExecRequest) -> ExecStream:
        """See :meth:`WorkspaceProvider.exec_stream`."""
        provider = await self._service._provider_of(workspace_id)
        # Closing this generator early closes the provider's too, which kills the command.
        async with contextlib.aclosing(provider.exec_stream(workspace_id, request)) as events:
            try:
                async for event in events:
                    yield event
            except (WorkspaceStateError, WorkspaceBrokenError) as exc:
                await self._service._runtime_failed(workspace_id, provider, exc)
                raise

    async def exec_in_shell(
        self, workspace_id: str, request: ExecRequest, *, key: str, state_dir: str, command: str
    ) -> ExecResult:
        """See :meth:`ShellHost.exec_in_shell`; a provider without persistent shells raises ShellUnavailableError."""

        async def call(provider: WorkspaceProvider) -> ExecResult:
            if not isinstance(provider, ShellHost):
                raise ShellUnavailableError(f"provider {provider.name!r} keeps no persistent shells")
            return await provider.exec_in_shell(workspace_id, request, key=key, state_dir=state_dir, command=command)

        return await self._service._guarded(workspace_id, call)

    async def open_pty(self, workspace_id: str, request: PtyRequest) -> PtySession:
        """See :meth:`PtyHost.open_pty`; a provider without terminals raises InvalidRequestError naming it."""
        provider = await self._service._provider_of(workspace_id)
        if not isinstance(provider, PtyHost):
            raise InvalidRequestError(
                f"provider {provider.name!r} of workspace {workspace_id} cannot open terminals (capability pty)",
                details={"capability": "pty", "provider": provider.name},
            )
        return await provider.open_pty(workspace_id, request)

    async def watch_dir(self, workspace_id: str, path: str, *, recursive: bool = False) -> DirEventStream:
        """See :meth:`DirWatcher.watch_dir`; a provider without watches raises InvalidRequestError naming it."""
        provider = await self._service._provider_of(workspace_id)
        if not isinstance(provider, DirWatcher):
            raise InvalidRequestError(
                f"provider {provider.name!r} of workspace {workspace_id} cannot watch directories (capability "
                "dir_watch)",
                details={"capability": "dir_watch", "provider": provider.name},
            )
        return await provider.watch_dir(workspace_id, path, recursive=recursive)

    async def read_file(self, workspace_id: str, path: str, *, beneath: str | None = None) -> ByteStream:
        """See :meth:`WorkspaceProvider.read_file`."""
        return await self._service._guarded(workspace_id, lambda p: p.read_file(workspace_id, path, beneath=beneath))

    async def write_file(
        self,
        workspace_id: str,
        path: str,
        data: bytes | AsyncIterable[bytes],
        *,
        mode: int | None = None,
        beneath: str | None = None,
        owner: str | None = None,
    ) -> int:
        """See :meth:`WorkspaceProvider.write_file`."""
        return await self._service._guarded(
            workspace_id, lambda p: p.write_file(workspace_id, path, data, mode=mode, beneath=beneath, owner=owner)
        )

    async def list_dir(self, workspace_id: str, path: str, *, beneath: str | None = None) -> list[FileInfo]:
        """See :meth:`WorkspaceProvider.list_dir`."""
        return await self._service._guarded(workspace_id, lambda p: p.list_dir(workspace_id, path, beneath=beneath))

    async def delete(
        self, workspace_id: str, path: str, *, recursive: bool = False, beneath: str | None = None
    ) -> None:
        """See :meth:`WorkspaceProvider.delete`."""
        await self._service._guarded(
            workspace_id, lambda p: p.delete(workspace_id, path, recursive=recursive, beneath=beneath)
        )

    async def move(self, workspace_id: str, src: str, dst: str, *, beneath: str | None = None) -> None:
        """See :meth:`WorkspaceProvider.move`."""
        await self._service._guarded(workspace_id, lambda p: p.move(workspace_id, src, dst, beneath=beneath))

    async def chmod(self, workspace_id: str, path: str, mode: int, *, beneath: str | None = None) -> None:
        """See :meth:`WorkspaceProvider.chmod`."""
        await self._service._guarded(workspace_id, lambda p: p.chmod(workspace_id, path, mode, beneath=beneath))

    async def stat(self, workspace_id: str, path: str, *, beneath: str | None = None) -> FileInfo:
        """See :meth:`WorkspaceProvider.stat`."""
        return await self._service._guarded(workspace_id, lambda p: p.stat(workspace_id, path, beneath=beneath))

    async def glob(
        self,
        workspace_id: str,
        pattern: str,
        *,
        root: str = WORKSPACE_ROOT,
        limit: int = 10_000,
        beneath: str | None = None,
    ) -> list[str]:
        """See :meth:`WorkspaceProvider.glob`."""
        return await self._service._guarded(
            workspace_id, lambda p: p.glob(workspace_id, pattern, root=root, limit=limit, beneath=beneath)
        )

    async def realpath(self, workspace_id: str, path: str, *, beneath: str | None = None) -> str:
        """See :meth:`WorkspaceProvider.realpath`."""
        return await self._service._guarded(workspace_id, lambda p: p.realpath(workspace_id, path, beneath=beneath))
