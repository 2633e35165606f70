"""CPU, memory and disk of workspaces over time, sampled in the background and kept in memory.

Every ``interval_s`` the sampler reads each running workspace it is asked to watch: CPU time and memory from its
provider (:class:`~corral.providers.base.ResourceUsageReporter`, the engine's cgroup counters for Docker and gVisor)
and disk: the bytes under /workspace from :meth:`WorkspaceService.disk_usage` plus what the runtime counts written
outside it (the container's writable layer, where E2B's home directory lives). Each workspace keeps its last
``capacity`` samples in a ring, so memory does not grow with a workspace's lifetime; a paused workspace keeps its
ring and gets no new samples, and a destroyed one loses it at the next sweep.

CPU use is a rate: the CPU time used between two readings over the wall time between them, as a share of the
workspace's CPUs. A workspace's first sample has no reading before it and reports 0 %.

Providers that cannot read CPU and memory (fake, firecracker, http) give no samples at all, rather than samples with
made-up zeros.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from corral.errors import CorralError
from corral.orchestrator._periodic import Periodic
from corral.orchestrator.service import WorkspaceService
from corral.providers.base import ResourceUsage, ResourceUsageReporter
from corral.store import WorkspaceRecord
from corral.values import ResourceLimits

__all__ = ["MetricSample", "MetricsSampler", "SampleRing", "cpu_percent"]

log = logging.getLogger(__name__)
READ_TIMEOUT_S = 10.0
"""A reading that takes longer is skipped: one stuck workspace must not hold up the others' samples."""


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One workspace's resources at one moment."""

    timestamp: float
    """Unix time of the reading, in seconds."""
    cpu_count: int
    """The workspace's CPUs: its CPU limit rounded up, at least 1."""
    cpu_used_pct: float
    """CPU used since the previous sample, as a percentage of ``cpu_count`` CPUs (0 to 100)."""
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    """Bytes under /workspace plus those written outside it (the container's writable layer), as far as the
    provider counts them."""
    disk_total: int
    """The workspace's disk limit in bytes."""


class SampleRing:
    """The last ``capacity`` samples of one workspace, oldest first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self._samples: deque[MetricSample] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: MetricSample) -> None:
        """Keep ``sample``, dropping the oldest when full. Timestamps stay ascending: one older than the newest
        kept (a slow reading that finished after a faster one) is dropped."""
        if self._samples and sample.timestamp < self._samples[-1].timestamp:
            return
        self._samples.append(sample)

    def latest(self) -> MetricSample | None:
        """The newest sample, if any."""
        return self._samples[-1] if self._samples else None

    def between(self, start: float | None = None, end: float | None = None) -> list[MetricSample]:
        """Samples with ``start <= timestamp <= end`` (either bound may be open), oldest first."""
        return [
            s for s in self._samples if (start is None or s.timestamp >= start) and (end is None or s.timestamp <= end)
        ]


def cpu_percent(before: tuple[int, float] | None, after: tuple[int, float], cpus: float) -> float:
    """CPU use between two ``(cpu_ns, monotonic_s)`` readings as a percentage of ``cpus`` CPUs, within 0-100."""
    if before is None or cpus <= 0:
        return 0.0
    wall_ns = (after[1] - before[1]) * 1e9
    if wall_ns <= 0:
        return 0.0
    used = (after[0] - before[0]) / (wall_ns * cpus) * 100.0
    return round(min(100.0, max(0.0, used)), 2)


class MetricsSampler:
    """Samples of the workspaces ``watch`` selects, every ``interval_s`` seconds and on request."""

    def __init__(
        self,
        service: WorkspaceService,
        *,
        interval_s: float,
        capacity: int,
        watch: Callable[[WorkspaceRecord], bool] = lambda _: True,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        self.service = service
        self.interval_s = interval_s
        self.capacity = capacity
        self._watch = watch
        self._clock = clock
        self._monotonic = monotonic
        self._rings: dict[str, SampleRing] = {}
        self._cpu: dict[str, tuple[int, float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._periodic = Periodic("corral-metrics-sampler", interval_s, self.sample_all)

    # --- reading ---------------------------------------------------------------------------------------------------

    def samples(self, workspace_id: str, start: float | None = None, end: float | None = None) -> list[MetricSample]:
        """The kept samples of a workspace between ``start`` and ``end`` (Unix seconds, inclusive), oldest first."""
        ring = self._rings.get(workspace_id)
        return ring.between(start, end) if ring is not None else []

    def latest(self, workspace_id: str) -> MetricSample | None:
        """The newest kept sample of a workspace."""
        ring = self._rings.get(workspace_id)
        return ring.latest() if ring is not None else None

    async def fresh(self, record: WorkspaceRecord) -> MetricSample | None:
        """The newest sample of a workspace, taken now when the newest kept one is older than the interval (or
        there is none) and the workspace is running; None when there is none to give."""
        latest = self.latest(record.id)
        if record.status != "ready" or (latest is not None and self._clock() - latest.timestamp < self.interval_s):
            return latest
        async with self._locks.setdefault(record.id, asyncio.Lock()):
            latest = self.latest(record.id)  # another request may have sampled while this one waited
            if latest is not None and self._clock() - latest.timestamp < self.interval_s:
                return latest
            return await self.sample(record) or latest

    # --- sampling --------------------------------------------------------------------------------------------------

    async def sample(self, record: WorkspaceRecord) -> MetricSample | None:
        """Read a running workspace now and keep the sample; None when its provider cannot read CPU and memory, or
        the reading failed (the reason is logged)."""
        provider: object = self.service.providers.get(record.provider or "")
        if not isinstance(provider, ResourceUsageReporter):
            return None
        try:
            usage, disk = await asyncio.wait_for(self._read(provider, record.id), READ_TIMEOUT_S)
        except (CorralError, TimeoutError) as exc:
            log.debug("metrics of %s skipped: %s", record.id, exc)
            return None
        except Exception:  # what a runtime answers is not trusted; one bad answer must not end the sweep
            log.exception("metrics of %s failed", record.id)
            return None
        sample = self._sample(record, usage, disk)
        self._rings.setdefault(record.id, SampleRing(self.capacity)).add(sample)
        return sample

    async def _read(self, provider: ResourceUsageReporter, workspace_id: str) -> tuple[ResourceUsage, int]:
        usage, disk = await asyncio.gather(provider.resource_usage(workspace_id), self.service.disk_usage(workspace_id))
        return usage, disk or 0

    def _sample(self, record: WorkspaceRecord, usage: ResourceUsage, disk: int) -> MetricSample:
        limits = ResourceLimits.parse(record.resource_limits)
        reading = (usage.cpu_ns, self._monotonic())
        before = self._cpu.get(record.id)
        self._cpu[record.id] = reading
        if before is not None and reading[0] < before[0]:
            before = None  # the counter restarted with the container (a resume): no rate from across it
        # The limit the runtime enforces when it has one; else the workspace's own.
        mem_total = min(usage.mem_limit, limits.memory_bytes) if usage.mem_limit > 0 else limits.memory_bytes
        return MetricSample(
            timestamp=self._clock(),
            cpu_count=max(1, math.ceil(limits.cpu)),
            cpu_used_pct=cpu_percent(before, reading, limits.cpu),
            mem_used=usage.mem_used,
            mem_total=mem_total,
            mem_cache=usage.mem_cache,
            disk_used=disk + usage.layer_bytes,
            disk_total=limits.disk_bytes,
        )

    async def sample_all(self) -> int:
        """Sample every running workspace ``watch`` selects, and forget the ones that are gone; returns how many
        samples were taken."""
        records = await self.service.store.workspaces.list(status=("ready", "paused", "stopped"))
        watched = [r for r in records if r.pool_key is None and self._watch(r)]
        self._forget_except(r.id for r in watched)
        running = [r for r in watched if r.status == "ready"]
        taken = await asyncio.gather(*(self.sample(r) for r in running))
        return sum(1 for s in taken if s is not None)

    def _forget_except(self, kept: Iterable[str]) -> None:
        keep = set(kept)
        for table in (self._rings, self._cpu, self._locks):
            for workspace_id in [k for k in table if k not in keep]:
                del table[workspace_id]

    # --- running ---------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Sample in the background every interval."""
        self._periodic.start()

    async def stop(self) -> None:
        """Stop sampling (a sweep in progress finishes first)."""
        await self._periodic.stop()
