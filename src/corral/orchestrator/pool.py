"""Warm pools: ready workspaces created ahead of requests, handed out in milliseconds.

A pool is keyed by everything that shapes a workspace: provider, image, limits and network. A warm workspace is an
ordinary workspace record with ``pool_key`` set; handing it out is one atomic claim in the store
(:meth:`~corral.store.WorkspaceRepository.claim_from_pool`), so concurrent requests never share one and a server
restart finds its pool in the database. A request gets a warm workspace only when the provider that selection
chooses for it and the rest of the key match; otherwise it cold-starts and the miss is logged with its reason.
Every assignment triggers a background refill.

A pool grows ahead of the next burst: when more requests for it arrive within :data:`BURST_WINDOW_S` than it holds,
its target rises to that many (up to ``PoolSpec.max_size``), so the same burst again finds every workspace warm. It
stays grown for :data:`GROWN_FOR_S` after the last burst that needed it, then shrinks back to its size (the surplus
is destroyed). A cold burst still costs what the engine takes: growing cannot make the first one warm.

A pool may instead hold workspaces restored from one snapshot (``PoolSpec.snapshot_id``: an agent type's setup
snapshot, see :class:`~corral.orchestrator.snapshots.SnapshotService`). Its key is the snapshot's own
(:func:`snapshot_pool_key`), so only a request for exactly that snapshot gets one of its workspaces
(:meth:`WarmPools.acquire_restored`). Such pools come and go while the server runs (:meth:`WarmPools.add`,
:meth:`WarmPools.remove`); removing one destroys its workspaces.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from corral.errors import CorralError, InvalidRequestError
from corral.providers.registry import KNOWN_PROVIDERS
from corral.settings import Settings
from corral.store import UNSET, ProviderAttempt, Unset, WorkspaceRecord, WorkspaceStatus
from corral.values import ResourceLimits

__all__ = ["Claim", "PoolBackend", "PoolSpec", "WarmPools", "grown", "pool_specs", "snapshot_pool_key"]

log = logging.getLogger(__name__)
FILL_CONCURRENCY = 2
RETRY_AFTER_FAILURE_S = 30.0
REFILL_DELAY_S = 0.1
MAX_POOL_SIZE = 100
BURST_WINDOW_S = 0.5
"""Requests for one pool that arrive this close together count as one burst, which the pool grows to hold."""
GROWN_FOR_S = 600.0
"""How long a pool keeps the target a burst gave it, counted from the last burst that reached that target."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One pool: the shape of its workspaces and how many to keep ready."""

    provider: str
    image: str
    limits: ResourceLimits
    network: str
    size: int
    snapshot_id: str | None = None
    """Set for a pool of workspaces restored from this snapshot (of ``provider``, with its image, limits and
    network) instead of created fresh; only requests for that snapshot get them."""
    max_size: int = 0
    """The most a burst may grow the pool to; ``size`` (no growth) when smaller."""

    @property
    def ceiling(self) -> int:
        """The largest target the pool may have: ``max_size``, or ``size`` when that is larger."""
        return max(self.size, self.max_size)

    @property
    def key(self) -> str:
        """The pool key stored on warm workspace records."""
        if self.snapshot_id is not None:
            return snapshot_pool_key(self.snapshot_id)
        return pool_key(self.provider, self.image, self.limits, self.network)


def pool_key(provider: str, image: str, limits: ResourceLimits, network: str) -> str:
    """``gvisor|corral/workspace:base|2|4G|10G|isolated``."""
    shape = limits.to_json()
    return "|".join((provider, image, shape["cpu"], shape["memory"], shape["disk"], network))


def snapshot_pool_key(snapshot_id: str) -> str:
    """``snapshot|<id>``: the key of the pool restored from one snapshot (no provider is called ``snapshot``, so it
    never equals a shape's key)."""
    return f"snapshot|{snapshot_id}"


def pool_specs(settings: Settings, *, default_provider: str | None, configured: Collection[str]) -> list[PoolSpec]:
    """The default pool (of ``default_provider``, what auto selection picks now for an agent workspace) and
    CORRAL_WARM_POOLS (each naming one of the ``configured`` providers).

    Raises:
        InvalidRequestError: CORRAL_WARM_POOLS is not a JSON list of valid pool objects.
    """
    defaults = settings.default_limits()
    specs = []
    size = settings.warm_pool_size
    if size > 0 and default_provider is not None:
        specs.append(
            PoolSpec(default_provider, settings.base_image, defaults, "isolated", size, max_size=grown(settings, size))
        )
    elif size > 0:
        log.warning("no healthy provider for the default warm pool; it stays empty")
    try:
        extra = json.loads(settings.warm_pools)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"CORRAL_WARM_POOLS: not valid JSON: {exc}") from exc
    if not isinstance(extra, list):
        raise InvalidRequestError("CORRAL_WARM_POOLS: must be a JSON list of pool objects")
    specs += [_parse_pool(raw, f"CORRAL_WARM_POOLS[{index}]", settings, configured) for index, raw in enumerate(extra)]
    return specs


def grown(settings: Settings, size: int) -> int:
    """The ``max_size`` of a pool of ``size``: CORRAL_WARM_POOL_GROWTH times it, at most 100."""
    return min(size * settings.warm_pool_growth, MAX_POOL_SIZE)


def _parse_pool(raw: object, where: str, settings: Settings, configured: Collection[str]) -> PoolSpec:
    allowed = {"provider", "image", "resource_limits", "network", "size", "max_size"}
    if not isinstance(raw, dict) or not set(raw) <= allowed or "provider" not in raw:
        raise InvalidRequestError(f"{where}: needs 'provider' and may have {', '.join(sorted(allowed))}")
    provider, image = raw["provider"], raw.get("image", settings.base_image)
    if not isinstance(provider, str) or provider not in configured:
        raise InvalidRequestError(f"{where}: provider {provider!r} is not configured")
    entry = KNOWN_PROVIDERS.get(provider)
    if entry is not None and entry.reduced_isolation and not settings.allow_docker_fallback:  # never claimable
        raise InvalidRequestError(
            f"{where}: provider {provider!r} is not allowed unless CORRAL_ALLOW_DOCKER_FALLBACK=true"
        )
    if not isinstance(image, str) or not image.strip():
        raise InvalidRequestError(f"{where}: image must be an image name")
    network = raw.get("network", "isolated")
    if network not in ("isolated", "default"):
        raise InvalidRequestError(f"{where}: network must be 'isolated' or 'default'")
    size = raw.get("size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_POOL_SIZE:
        raise InvalidRequestError(f"{where}: size must be a whole number from 0 to {MAX_POOL_SIZE}")
    max_size = raw.get("max_size", grown(settings, size))
    if isinstance(max_size, bool) or not isinstance(max_size, int) or not size <= max_size <= MAX_POOL_SIZE:
        raise InvalidRequestError(
            f"{where}: max_size must be a whole number from the pool's size ({size}) to {MAX_POOL_SIZE}"
        )
    limits = raw.get("resource_limits")
    if limits is not None and not isinstance(limits, dict):
        raise InvalidRequestError(f'{where}: resource_limits must be an object like {{"cpu": "1"}}')
    limits = ResourceLimits.parse(limits, defaults=settings.default_limits())
    return PoolSpec(provider, image, limits, network, size, max_size=max_size)


@dataclass(frozen=True, slots=True)
class Claim:
    """What a request writes on the warm workspace it takes."""

    requested_provider: str | Unset = UNSET
    metadata: Mapping[str, Any] | Unset = UNSET
    warnings: Sequence[str] | Unset = UNSET
    provider_attempts: Sequence[ProviderAttempt] | Unset = UNSET
    requester: str | None = field(default=None, compare=False)
    """Who asks (see ``CreateWorkspace.requester``): counted once toward a burst; not written anywhere."""


@dataclass
class _PoolState:
    spec: PoolSpec
    hits: int = 0
    misses: int = 0
    miss_reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    last_error: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    removed: bool = False
    """Set by :meth:`WarmPools.remove`: a refill that was waiting for the lock must not make more."""
    recent: collections.deque[tuple[float, str | None]] = field(default_factory=collections.deque)
    """The requests of the last :data:`BURST_WINDOW_S`: when each arrived (monotonic) and who asked, at most
    ``spec.ceiling`` of them."""
    burst: int = 0
    """The largest burst seen, while it is remembered (see :meth:`target`)."""
    burst_at: float = 0.0
    shrink_due: bool = False
    """A shrink check is scheduled for when the burst is forgotten."""

    def target(self, now: float) -> int:
        """How many workspaces the pool keeps: its size, or the remembered burst up to its ceiling."""
        remembered = self.burst if now - self.burst_at < GROWN_FOR_S else 0
        return min(max(self.spec.size, remembered), self.spec.ceiling)

    def note_request(self, now: float, requester: str | None) -> bool:
        """Count one request for the pool (a requester already counted in the window is not counted again); True
        when it raised the target."""
        if self.spec.ceiling <= self.spec.size:
            return False
        before = self.target(now)
        while self.recent and (now - self.recent[0][0] > BURST_WINDOW_S or len(self.recent) >= self.spec.ceiling):
            self.recent.popleft()
        if requester is not None and any(requester == asked for _, asked in self.recent):
            return False
        self.recent.append((now, requester))
        if len(self.recent) >= before:  # a burst as large as the target renews it: it stays grown while they come
            self.burst, self.burst_at = len(self.recent), now
        return self.target(now) > before


class PoolBackend(Protocol):
    """What the pools need done to workspaces; the workspace service does it (pools never write a record or call a
    provider themselves)."""

    async def create_warm(self, spec: PoolSpec) -> None:
        """Create one ready workspace for the pool (its record carries the pool key); raise CorralError on failure."""

    async def claim_warm(self, key: str, claim: Claim, container_type: str) -> WorkspaceRecord | None:
        """Take the oldest ready workspace out of the pool, writing ``claim`` on it; None when the pool is empty."""

    async def warm_records(self, key: str, statuses: tuple[WorkspaceStatus, ...]) -> list[WorkspaceRecord]:
        """The pool's workspaces in these statuses."""

    def known_dead(self, record: WorkspaceRecord) -> bool:
        """Whether the runtime is known to have lost this workspace (no I/O)."""

    async def discard(self, workspace_id: str) -> None:
        """Destroy the workspace and its record's place in the pool."""


class WarmPools:
    """Fills, hands out and refills warm workspaces for a set of pool specs.

    Built first and handed to the workspace service, which attaches itself as the :class:`PoolBackend`.
    """

    def __init__(self, specs: list[PoolSpec]) -> None:
        self._backend: PoolBackend | None = None
        self._pools: dict[str, _PoolState] = {s.key: _PoolState(s) for s in specs if s.size > 0}
        self._unpooled_misses: collections.Counter[str] = collections.Counter()
        self._refills: set[asyncio.Task[Any]] = set()
        self._retries: set[asyncio.Task[Any]] = set()
        self._finishing: set[asyncio.Future[bool]] = set()
        """Work that must end what it began, never cancelled: shrink steps, and destroying workspaces claimed for
        requests that went away."""
        self._fill_slots = asyncio.Semaphore(FILL_CONCURRENCY)
        self._closing = False
        self._started = False

    def attach(self, backend: PoolBackend) -> None:
        """Give the pools the service that does their work (the service calls this when it is handed the pools)."""
        self._backend = backend

    @property
    def backend(self) -> PoolBackend:
        """The service doing the pools' work."""
        if self._backend is None:
            raise RuntimeError("warm pools used before a workspace service was attached")
        return self._backend

    @property
    def keys(self) -> list[str]:
        """Every configured pool key."""
        return list(self._pools)

    @property
    def specs(self) -> list[PoolSpec]:
        """Every configured pool."""
        return [state.spec for state in self._pools.values()]

    def add(self, spec: PoolSpec) -> bool:
        """Configure one more pool while the server runs (filled in the background once the pools started);
        returns False when it is empty by design (size 0), already configured, or the pools are closing."""
        if spec.size <= 0 or spec.key in self._pools or self._closing:
            return False
        self._pools[spec.key] = _PoolState(spec)
        if self._started:
            self.schedule_refill(spec.key)
        return True

    async def remove(self, key: str) -> int:
        """Stop serving and refilling the pool ``key`` and destroy its warm workspaces; returns how many.

        Each one is taken out with the same atomic claim a request uses, so a workspace a request claimed a moment
        earlier is left to that request and never destroyed under it. A refill in progress is waited for.
        """
        state = self._pools.pop(key, None)
        if state is None:
            return 0
        state.removed = True
        async with state.lock:  # a refill holds it while creating: its workspaces exist (or failed) afterwards
            drained = 0
            while await self._take_and_discard(key):
                drained += 1
            # Left "creating" by a server that stopped mid-create (none otherwise: the lock is held).
            for record in await self.backend.warm_records(key, ("creating", "ready")):
                await self.backend.discard(record.id)
                drained += 1
        log.info("warm pool %s removed; %d warm workspace(s) destroyed", key, drained)
        return drained

    # --- filling -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Fill every pool in the background (the server answers while pools fill)."""
        self._started = True
        for key in self._pools:
            self.schedule_refill(key)

    def schedule_refill(self, key: str) -> None:
        """Top the pool up in the background."""
        if self._closing or key not in self._pools:
            return
        task = asyncio.create_task(self.refill(key), name=f"warm-pool-refill-{key}")
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    async def refill(self, key: str) -> int:
        """Create workspaces until the pool holds its target, or destroy those above it once a burst that grew it
        is forgotten; returns how many were created (0 for a pool that is not, or no longer, configured)."""
        state = self._pools.get(key)
        if state is None:
            return 0
        async with state.lock:
            if state.removed:
                return 0
            target = state.target(time.monotonic())
            if target > state.spec.size:
                self._shrink_when_forgotten(state)
            have = len(await self.backend.warm_records(key, ("creating", "ready")))
            if have > target:
                await self._shrink(state, target)
                return 0
            missing = target - have
            if missing == 0:
                return 0
            results = await asyncio.gather(*(self._create_one(state) for _ in range(missing)))
        created = sum(results)
        if created < missing and not self._closing and not state.removed:
            # The provider failed; try again later rather than spinning.
            self._later(RETRY_AFTER_FAILURE_S, key)
        return created

    def _shrink_when_forgotten(self, state: _PoolState) -> None:
        """Check the pool again when the burst that grew it is forgotten (once; a renewed burst moves the check)."""
        if state.shrink_due or self._closing:
            return
        state.shrink_due = True
        key = state.spec.key

        async def check() -> None:
            while True:
                await asyncio.sleep(max(state.burst_at + GROWN_FOR_S - time.monotonic(), 0.0) + 0.01)
                if state.target(time.monotonic()) <= state.spec.size:
                    break
            state.shrink_due = False
            await self.refill(key)

        task = asyncio.create_task(check(), name=f"warm-pool-shrink-{key}")
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _shrink(self, state: _PoolState, target: int) -> None:
        """Destroy ready workspaces of the pool, oldest first, until it holds ``target`` (requests taking some
        meanwhile count too). Each is taken with the same atomic claim a request uses, so none is destroyed under a
        request that just took it, and taken and destroyed in one shielded task that :meth:`close` waits for: a
        shutdown never leaves one taken out of the pool but still running."""
        key = state.spec.key
        destroyed = 0
        while len(await self.backend.warm_records(key, ("creating", "ready"))) > target:
            if not await self._shielded(self._take_and_discard(key)):
                break
            destroyed += 1
        log.info("warm pool %s: back to %d after the burst; %d warm workspace(s) destroyed", key, target, destroyed)

    async def _discard_claimed(self, claiming: asyncio.Future[WorkspaceRecord | None]) -> bool:
        try:
            record = await claiming
        except Exception:  # the claim failed: it took nothing
            return False
        if record is None:
            return False
        log.warning("warm workspace %s was claimed for a request that went away; destroying it", record.id)
        await self.backend.discard(record.id)
        return True

    async def _take_and_discard(self, key: str) -> bool:
        """Take the pool's oldest ready workspace with a request's own atomic claim and destroy it; False when
        there was none."""
        record = await self.backend.claim_warm(key, Claim(), "agent_workspace")
        if record is None:
            return False
        await self.backend.discard(record.id)
        return True

    def _finish(self, work: Coroutine[Any, Any, bool]) -> asyncio.Future[bool]:
        """Run ``work`` in a task nothing cancels; :meth:`close` waits for it."""
        task = asyncio.ensure_future(work)
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        return task

    async def _shielded(self, work: Coroutine[Any, Any, bool]) -> bool:
        return await asyncio.shield(self._finish(work))

    def _later(self, delay: float, key: str) -> None:
        async def retry() -> None:
            await asyncio.sleep(delay)
            self.schedule_refill(key)

        task = asyncio.create_task(retry(), name=f"warm-pool-retry-{key}")
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _create_one(self, state: _PoolState) -> bool:
        spec = state.spec
        async with self._fill_slots:
            if self._closing:
                return False
            try:
                await self.backend.create_warm(spec)
            except CorralError as exc:
                state.last_error = exc.message
                log.warning("warm pool %s: could not create a workspace: %s", spec.key, exc.message)
                return False
            state.last_error = None
            return True

    # --- handing out ---------------------------------------------------------------------------------------------

    async def acquire(
        self,
        provider: str,
        image: str,
        limits: ResourceLimits,
        network: str,
        container_type: str = "agent_workspace",
        *,
        claim: Claim | None = None,
    ) -> WorkspaceRecord | None:
        """A warm workspace of exactly this shape from ``provider``'s pool, or None (the miss is logged).

        ``claim`` holds what the request sets on the workspace; the claim writes it in the same statement.
        """
        claim = claim or Claim()
        key = pool_key(provider, image, limits, network)
        state = self._pools.get(key)
        if state is not None and container_type != "agent_workspace":
            # Pools hold agent workspaces; MCP servers are long-lived and labelled differently: always cold.
            state.misses += 1
            state.miss_reasons["container type mismatch"] += 1
            log.info("warm pool miss (container type mismatch: %s); cold start with %s", container_type, provider)
            return None
        if state is None:
            self._record_unpooled_miss(provider, image, limits, network)
            return None
        return await self._claim(state, claim, container_type)

    async def acquire_restored(self, snapshot_id: str, *, claim: Claim | None = None) -> WorkspaceRecord | None:
        """A warm workspace already restored from ``snapshot_id``, or None (no such pool, or it is empty).

        Only the pool of exactly this snapshot is asked, so a workspace restored from another snapshot (an older
        setup of the same agent type, say) is never handed out for it.
        """
        state = self._pools.get(snapshot_pool_key(snapshot_id))
        if state is None:
            log.info("warm pool miss (no pool for snapshot %s); restoring on demand", snapshot_id)
            return None
        return await self._claim(state, claim or Claim(), "agent_workspace")

    async def _claim(self, state: _PoolState, claim: Claim, container_type: str) -> WorkspaceRecord | None:
        """Take a live workspace out of the pool (refilling it meanwhile), or None when it is empty."""
        key = state.spec.key
        # The refill below (at once on a miss, a moment later on a hit) makes what a raised target asks for.
        if state.note_request(time.monotonic(), claim.requester):
            log.info("warm pool %s: growing to %d for a burst", key, state.target(time.monotonic()))
        while True:
            claiming = asyncio.ensure_future(self.backend.claim_warm(key, claim, container_type))
            try:
                record = await asyncio.shield(claiming)
            except asyncio.CancelledError:
                # The requester went away (its request cancelled, the server stopping) while the claim ran: a
                # workspace the claim took must not stay out of the pool, running, with no one to use it.
                self._finish(self._discard_claimed(claiming))
                raise
            if record is None:
                state.misses += 1
                state.miss_reasons["pool empty"] += 1
                log.info("warm pool miss (pool empty) for %s; cold start", key)
                self.schedule_refill(key)
                return None
            # Refill a moment later, so its database writes do not queue before the requester's.
            self._later(REFILL_DELAY_S, key)
            # No I/O on the hand-out path: providers that watch their runtime say whether it died since.
            if not self.backend.known_dead(record):
                state.hits += 1
                return record
            # It died while waiting (killed from outside); drop it and try the next one.
            log.warning("warm workspace %s was not running; discarding it", record.id)
            await self.backend.discard(record.id)

    def _record_unpooled_miss(self, provider: str, image: str, limits: ResourceLimits, network: str) -> None:
        """Count a miss on the pool it came closest to, with the reason, and log it."""
        for state in self._pools.values():
            spec = state.spec
            if spec.snapshot_id is not None:
                continue  # restored from a snapshot: no plain request is near it
            if (spec.image, spec.limits, spec.network) == (image, limits, network):
                reason = "provider mismatch"
                detail = f"the pool holds {spec.provider} workspaces, selection chose {provider}"
                break
            if spec.provider == provider:
                reason = "spec mismatch"
                detail = "image, limits or network differ from the pool's"
                break
        else:
            self._unpooled_misses["no pool configured"] += 1
            log.info("warm pool miss (no pool configured for %s); cold start", provider)
            return
        state.misses += 1
        state.miss_reasons[reason] += 1
        log.info("warm pool miss (%s: %s); cold start with %s", reason, detail, provider)

    # --- status and shutdown -------------------------------------------------------------------------------------

    async def status(self) -> list[dict[str, Any]]:
        """Per pool: provider, image, limits, network, the snapshot it restores (None for fresh workspaces),
        target (grown by a burst, see :meth:`_PoolState.target`), base and max size, current size, hits, misses and
        reasons."""
        out = []
        for key, state in list(self._pools.items()):  # pools may be added or removed while this awaits
            ready = await self.backend.warm_records(key, ("ready",))
            creating = await self.backend.warm_records(key, ("creating",))
            spec = state.spec
            out.append(
                {
                    "key": key,
                    "provider": spec.provider,
                    "image": spec.image,
                    "resource_limits": spec.limits.to_json(),
                    "network": spec.network,
                    "snapshot_id": spec.snapshot_id,
                    "target": state.target(time.monotonic()),
                    "base_size": spec.size,
                    "max_size": spec.ceiling,
                    "size": len(ready),
                    "creating": len(creating),
                    "hits": state.hits,
                    "misses": state.misses,
                    "miss_reasons": dict(state.miss_reasons),
                    "last_error": state.last_error,
                }
            )
        return out

    def unpooled_misses(self) -> dict[str, int]:
        """Misses of requests no pool was configured for."""
        return dict(self._unpooled_misses)

    async def close(self, *, drain: bool) -> None:
        """Stop refilling; with ``drain``, destroy every warm workspace (they are cheap to make again).

        Refills in progress are cancelled (their store calls are shielded); a workspace they left half-made is
        still a ``creating`` record of the pool, so the drain removes it.
        """
        self._closing = True
        tasks = [*self._retries, *self._refills]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*self._finishing, return_exceptions=True)  # each finishes what it took: not cancelled
        if drain:
            for key in list(self._pools):
                for record in await self.backend.warm_records(key, ("creating", "ready")):
                    await self.backend.discard(record.id)
