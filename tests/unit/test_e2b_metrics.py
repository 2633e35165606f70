"""Sandbox metrics: the sample ring, the CPU rate, reading Docker stats, the sampler, and E2B's metrics routes, over
a fake provider that reports counters the test sets."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b.api.client.models.sandbox_metric import SandboxMetric
from fastapi import FastAPI

from corral.api.app import create_app
from corral.errors import WorkspaceStateError
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.metrics import MetricSample, MetricsSampler, SampleRing, cpu_percent
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers._container_stats import NotRunning, usage_from_stats
from corral.providers.base import ResourceUsage, ResourceUsageReporter
from corral.providers.docker import DockerProvider
from corral.providers.fake import FakeProvider
from corral.providers.gvisor import GVisorProvider
from corral.settings import Settings
from corral.store import Store
from corral.values import ResourceLimits

pytestmark = pytest.mark.unit

TOKEN = "unit-test-token"
GiB = 1024**3


class MeteredFake(FakeProvider):
    """A fake whose CPU, memory and disk figures the test sets (and whose readings it counts)."""

    def __init__(self, name: str = "gvisor") -> None:
        super().__init__(name)
        self.cpu_ns: dict[str, int] = {}
        self.mem_used = 100 * 1024**2
        self.mem_limit = 0
        self.disk: dict[str, int] = {}
        self.layer: dict[str, int] = {}
        self.failing: set[str] = set()
        self.reads = 0

    async def resource_usage(self, workspace_id: str) -> ResourceUsage:
        """The counters the test set; a workspace in ``failing`` is reported not running."""
        self.reads += 1
        if workspace_id in self.failing:
            raise WorkspaceStateError(f"workspace {workspace_id} is not running")
        return ResourceUsage(
            cpu_ns=self.cpu_ns.get(workspace_id, 0),
            mem_used=self.mem_used,
            mem_cache=4096,
            mem_limit=self.mem_limit,
            layer_bytes=self.layer.get(workspace_id, 0),
        )

    async def disk_usage(self, workspace_id: str) -> int:
        """The bytes the test set."""
        return self.disk.get(workspace_id, 0)


class Clocks:
    """Wall and monotonic time that move only when a test says so."""

    def __init__(self) -> None:
        self.wall = 1_700_000_000.0
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        """Move both clocks forward."""
        self.wall += seconds
        self.mono += seconds


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CORRAL_* / E2B_API_KEY variables out of Settings."""
    for name in list(os.environ):
        if name.startswith(("CORRAL_", "WORKSPACE_DEFAULT_")) or name == "E2B_API_KEY":
            monkeypatch.delenv(name)


def _sample(timestamp: float) -> MetricSample:
    return MetricSample(timestamp, 1, 0.0, 1, 2, 0, 3, 4)


# --- the ring and the rate ----------------------------------------------------------------------------------------


def test_ring_keeps_only_the_newest_capacity_samples() -> None:
    """A ring of 3 fed 10 samples holds the last 3, oldest first."""
    ring = SampleRing(3)
    for t in range(10):
        ring.add(_sample(float(t)))
    assert len(ring) == 3
    assert [s.timestamp for s in ring.between()] == [7.0, 8.0, 9.0]
    assert ring.latest() == _sample(9.0)


def test_ring_stays_ascending_and_filters_inclusively() -> None:
    """A sample older than the newest is dropped; ``between`` includes both bounds and leaves either open."""
    ring = SampleRing(10)
    for t in (1.0, 2.0, 3.0, 2.5, 4.0):
        ring.add(_sample(t))
    assert [s.timestamp for s in ring.between()] == [1.0, 2.0, 3.0, 4.0]
    assert [s.timestamp for s in ring.between(2.0, 3.0)] == [2.0, 3.0]
    assert [s.timestamp for s in ring.between(start=3.0)] == [3.0, 4.0]
    assert [s.timestamp for s in ring.between(end=1.5)] == [1.0]
    with pytest.raises(ValueError, match="capacity"):
        SampleRing(0)


def test_cpu_percent_is_the_share_of_the_workspaces_cpus() -> None:
    """Half a CPU-second over one second is 50 % of one CPU and 25 % of two; no earlier reading or no elapsed time
    gives 0; more than the CPUs allow is capped at 100."""
    assert cpu_percent((0, 10.0), (500_000_000, 11.0), 1) == 50.0
    assert cpu_percent((0, 10.0), (500_000_000, 11.0), 2) == 25.0
    assert cpu_percent(None, (500_000_000, 11.0), 1) == 0.0
    assert cpu_percent((0, 11.0), (500_000_000, 11.0), 1) == 0.0
    assert cpu_percent((0, 10.0), (5_000_000_000, 11.0), 1) == 100.0


# --- Docker stats -------------------------------------------------------------------------------------------------


def test_stats_of_cgroup_v1_as_docker_stats_counts_them() -> None:
    """Under cgroup v1 memory used is usage less total_inactive_file, the cache is total_cache, CPU the total."""
    stats = {
        "cpu_stats": {"cpu_usage": {"total_usage": 131_736_591}},
        "memory_stats": {
            "usage": 14_163_968,
            "limit": 536_870_912,
            "stats": {"total_inactive_file": 1_000_000, "total_cache": 598_016, "inactive_file": 5},
        },
    }
    assert usage_from_stats(stats) == ResourceUsage(131_736_591, 13_163_968, 598_016, 536_870_912)


def test_stats_of_cgroup_v2_and_an_unlimited_container() -> None:
    """Under cgroup v2 the inactive page cache is inactive_file and the cache is file; "no limit" reads as 0."""
    stats = {
        "cpu_stats": {"cpu_usage": {"total_usage": 7}},
        "memory_stats": {"usage": 3000, "limit": 0x7FFFFFFFFFFFF000, "stats": {"inactive_file": 1000, "file": 1500}},
    }
    assert usage_from_stats(stats) == ResourceUsage(7, 2000, 1500, 0)


def test_stats_of_a_stopped_container_are_refused() -> None:
    """The engine's empty answer for a container that is not running is not read as zero use."""
    with pytest.raises(NotRunning, match="not running"):
        usage_from_stats({"cpu_stats": {"cpu_usage": {"total_usage": 0}}, "memory_stats": {}})


def test_docker_and_gvisor_read_resource_usage() -> None:
    """The Docker-engine providers implement the optional interface; the plain fake does not."""
    assert hasattr(DockerProvider, "resource_usage")
    assert hasattr(GVisorProvider, "resource_usage")
    assert not isinstance(FakeProvider("gvisor"), ResourceUsageReporter)
    assert isinstance(MeteredFake(), ResourceUsageReporter)


# --- the sampler --------------------------------------------------------------------------------------------------


@pytest.fixture
def provider() -> MeteredFake:
    """The one backend."""
    return MeteredFake()


@pytest.fixture
async def service(tmp_path: Path, provider: FakeProvider) -> AsyncIterator[WorkspaceService]:
    """A service over the provider and a SQLite file."""
    settings = Settings(data_dir=tmp_path, providers="gvisor", warm_pool_size=0, e2b_warm_pool_size=0)
    store = await Store.open(settings.sqlalchemy_url())
    monitor = HealthMonitor({"gvisor": provider}, settings.health_interval_s)
    await monitor.check_all()
    yield WorkspaceService(settings, store, {"gvisor": provider}, monitor)
    await store.close()


@pytest.fixture
def clocks() -> Clocks:
    """The sampler's clocks."""
    return Clocks()


def sampler_over(service: WorkspaceService, clocks: Clocks, **options: Any) -> MetricsSampler:
    """A sampler every 5 s keeping 4 samples, on the test's clocks."""
    options = {"interval_s": 5.0, "capacity": 4, **options}
    return MetricsSampler(service, clock=lambda: clocks.wall, monotonic=lambda: clocks.mono, **options)


async def _workspace(service: WorkspaceService, cpu: float = 2.0, memory: int = GiB, disk: int = 2 * GiB) -> str:
    limits = ResourceLimits(cpu=cpu, memory_bytes=memory, disk_bytes=disk)
    return (await service.create(CreateWorkspace(limits=limits))).id


async def test_sampler_reports_cpu_memory_and_disk(
    service: WorkspaceService, provider: MeteredFake, clocks: Clocks
) -> None:
    """Each sweep samples every running workspace: CPU count from its limit, the CPU rate between sweeps, memory
    from the runtime bounded by the workspace's limit, disk used (volume plus writable layer) and the disk limit."""
    first = await _workspace(service, cpu=1.5)
    second = await _workspace(service, cpu=1.0)
    sampler = sampler_over(service, clocks)
    provider.mem_limit = 512 * 1024**2
    assert await sampler.sample_all() == 2
    clocks.advance(5)
    provider.cpu_ns[first] = 3_000_000_000  # 3 CPU-seconds in 5 s on 1.5 CPUs: 40 %
    provider.disk[first] = 20 * 1024**2
    provider.layer[first] = 5 * 1024**2  # written outside /workspace (the home directory)
    assert await sampler.sample_all() == 2
    samples = sampler.samples(first)
    assert [s.timestamp for s in samples] == [clocks.wall - 5, clocks.wall]
    assert samples[0].cpu_used_pct == 0.0
    latest = samples[-1]
    assert (latest.cpu_count, latest.cpu_used_pct) == (2, 40.0)
    assert (latest.mem_used, latest.mem_total, latest.mem_cache) == (100 * 1024**2, 512 * 1024**2, 4096)
    assert (latest.disk_used, latest.disk_total) == (25 * 1024**2, 2 * GiB)
    assert sampler.latest(second) is not None
    assert sampler.latest(second).cpu_count == 1  # type: ignore[union-attr]


async def test_sampler_memory_is_bounded_and_follows_the_workspaces(
    service: WorkspaceService, provider: MeteredFake, clocks: Clocks
) -> None:
    """However many sweeps run, a workspace keeps ``capacity`` samples; a destroyed one's are dropped at the next
    sweep, and one ``watch`` does not select is never sampled."""
    kept = await _workspace(service)
    gone = await _workspace(service)
    unwatched = await _workspace(service)
    sampler = sampler_over(service, clocks, watch=lambda record: record.id != unwatched)
    for _ in range(50):
        await sampler.sample_all()
        clocks.advance(5)
    assert len(sampler.samples(kept)) == 4
    assert len(sampler.samples(gone)) == 4
    assert sampler.samples(unwatched) == []
    await service.destroy(gone)
    await sampler.sample_all()
    assert sampler.samples(gone) == []
    assert len(sampler.samples(kept)) == 4


async def test_a_failing_reading_skips_only_that_workspace(
    service: WorkspaceService, provider: MeteredFake, clocks: Clocks
) -> None:
    """A workspace whose runtime refuses a reading gets no sample; the others still do."""
    broken = await _workspace(service)
    healthy = await _workspace(service)
    provider.failing.add(broken)
    sampler = sampler_over(service, clocks)
    assert await sampler.sample_all() == 1
    assert sampler.samples(broken) == []
    assert len(sampler.samples(healthy)) == 1


async def test_fresh_samples_only_when_none_is_recent(
    service: WorkspaceService, provider: MeteredFake, clocks: Clocks
) -> None:
    """A request with no sample younger than the interval takes one; within the interval it gets the kept one."""
    workspace_id = await _workspace(service)
    record = await service.get(workspace_id)
    sampler = sampler_over(service, clocks)
    first = await sampler.fresh(record)
    assert first is not None
    assert provider.reads == 1
    clocks.advance(4)
    assert await sampler.fresh(record) == first
    assert provider.reads == 1
    clocks.advance(1)
    later = await sampler.fresh(record)
    assert later is not None
    assert later.timestamp == first.timestamp + 5
    assert provider.reads == 2


async def test_providers_without_counters_give_no_samples(tmp_path: Path, clocks: Clocks) -> None:
    """On a provider that cannot read CPU and memory the sampler takes nothing rather than zeros."""
    plain = FakeProvider("gvisor")
    settings = Settings(data_dir=tmp_path, providers="gvisor", warm_pool_size=0, e2b_warm_pool_size=0)
    store = await Store.open(settings.sqlalchemy_url())
    try:
        monitor = HealthMonitor({"gvisor": plain}, settings.health_interval_s)
        await monitor.check_all()
        service = WorkspaceService(settings, store, {"gvisor": plain}, monitor)
        workspace_id = await _workspace(service)
        sampler = sampler_over(service, clocks)
        assert await sampler.sample_all() == 0
        assert await sampler.fresh(await service.get(workspace_id)) is None
        assert sampler.samples(workspace_id) == []
    finally:
        await store.close()


async def test_background_sampling_starts_and_stops(service: WorkspaceService, clocks: Clocks) -> None:
    """start() runs the sweeps in a task and stop() ends it."""
    sampler = sampler_over(service, clocks, interval_s=3600.0)
    sampler.start()
    assert sampler._periodic.running
    await sampler.stop()
    assert not sampler._periodic.running
    with pytest.raises(ValueError, match="interval_s"):
        sampler_over(service, clocks, interval_s=0)


# --- the routes ---------------------------------------------------------------------------------------------------


@pytest.fixture
async def app(tmp_path: Path, provider: MeteredFake) -> AsyncIterator[FastAPI]:
    """The app over the metered fake, with its lifespan running."""
    settings = Settings(data_dir=tmp_path, api_token=TOKEN, providers="gvisor", warm_pool_size=0, e2b_warm_pool_size=0)
    application = create_app(settings, providers={"gvisor": provider})
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client carrying the API key, as the SDK sends it."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://corral", headers={"X-API-KEY": TOKEN}) as http:
        yield http


async def _sandbox(client: httpx.AsyncClient) -> str:
    answer = await client.post("/e2b/v2/sandboxes", json={"templateID": "base"})
    assert answer.status_code == 201, answer.text
    sandbox_id: str = answer.json()["sandboxID"]
    return sandbox_id


async def test_metrics_route_answers_e2b_sandbox_metrics(client: httpx.AsyncClient, provider: MeteredFake) -> None:
    """A new sandbox's first call answers one sample in E2B's ``SandboxMetric`` shape, which the SDK parses."""
    sandbox_id = await _sandbox(client)
    provider.disk[sandbox_id] = 12345
    answer = await client.get(f"/e2b/sandboxes/{sandbox_id}/metrics")
    assert answer.status_code == 200, answer.text
    [item] = answer.json()
    assert set(item) == {
        "timestamp",
        "timestampUnix",
        "cpuCount",
        "cpuUsedPct",
        "memUsed",
        "memTotal",
        "memCache",
        "diskUsed",
        "diskTotal",
    }
    parsed = SandboxMetric.from_dict(item)
    assert parsed.disk_used == 12345
    assert parsed.mem_used == provider.mem_used
    assert int(parsed.timestamp.timestamp()) == parsed.timestamp_unix


async def test_metrics_route_filters_and_validates(client: httpx.AsyncClient) -> None:
    """``start``/``end`` bound the samples at whole seconds; start after end, or a bound that is no integer, is a
    400 in E2B's shape; an unknown sandbox is a 404."""
    sandbox_id = await _sandbox(client)
    [item] = (await client.get(f"/e2b/sandboxes/{sandbox_id}/metrics")).json()
    moment = item["timestampUnix"]
    url = f"/e2b/sandboxes/{sandbox_id}/metrics"
    assert len((await client.get(url, params={"start": moment, "end": moment})).json()) == 1
    assert (await client.get(url, params={"start": moment + 1})).json() == []
    assert (await client.get(url, params={"end": moment - 1})).json() == []
    bad = await client.get(url, params={"start": moment, "end": moment - 1})
    assert bad.status_code == 400
    assert bad.json() == {"code": 400, "message": "Invalid time range for metrics: start time cannot be after end time"}
    not_int = await client.get(url, params={"start": "yesterday"})
    assert not_int.status_code == 400
    assert not_int.json()["code"] == 400
    assert '"start"' in not_int.json()["message"]
    missing = await client.get("/e2b/sandboxes/nope/metrics")
    assert missing.status_code == 404
    assert missing.json()["code"] == 404


async def test_list_metrics_route(client: httpx.AsyncClient) -> None:
    """``/sandboxes/metrics`` answers the newest sample of each named sandbox (unknown ones left out), needs
    ``sandbox_ids``, takes at most 100, and wants the API key."""
    first, second = await _sandbox(client), await _sandbox(client)
    answer = await client.get("/e2b/sandboxes/metrics", params={"sandbox_ids": f"{first},{second},nope"})
    assert answer.status_code == 200, answer.text
    assert set(answer.json()["sandboxes"]) == {first, second}
    assert (await client.get("/e2b/sandboxes/metrics")).status_code == 400
    too_many = await client.get("/e2b/sandboxes/metrics", params={"sandbox_ids": ",".join(f"s{i}" for i in range(101))})
    assert too_many.json() == {"code": 400, "message": "Too many sandboxes requested, maximum is 100"}
    unauthenticated = await client.get(
        "/e2b/sandboxes/metrics", params={"sandbox_ids": first}, headers={"X-API-KEY": "x"}
    )
    assert unauthenticated.status_code == 401
