"""Stateful workspaces against raw Docker checkpoints, each measured in the same run on a plain runsc container of
the same image:

* pause and resume of an idle gVisor workspace and of one holding live memory (``GVisorProvider.pause`` /
  ``.resume``), against ``docker checkpoint create`` + ``docker start --checkpoint``;
* snapshot create and size (``SnapshotService.create``), against ``docker checkpoint create --leave-running`` +
  ``docker commit`` and the checkpoint directory's size;
* fork x10 of an idle workspace (``SnapshotService.fork``), against ``docker checkpoint create --leave-running`` +
  ``docker commit`` + 10 x (``docker create`` + copying the checkpoint into it + ``docker start --checkpoint``);
* session start of an agent type with a long setup and ``snapshot_after_setup`` (``AgentService``): the first
  session (sets up, then snapshots) against later ones (restore the snapshot).

Corral runs in this process: the bench's provider for pause and resume; for the rest a WorkspaceService on a SQLite
file with SnapshotService and AgentService, built as the app's lifespan builds them. Where the time goes inside
Corral is read from outside by :class:`CallClock`, which times its Docker Engine calls and host copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import shlex
import statistics
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.context import Bench
from bench.latency import TRUE
from bench.plain import BENCH_LABEL, PlainContainer
from bench.report import Row, Target
from bench.stats import Measure, Samples
from corral.agents.sessions import AgentService, TaskContext
from corral.errors import CorralError
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.orchestrator.snapshots import SnapshotService
from corral.providers import docker as docker_module
from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.providers._host_copy import tree_size
from corral.providers.base import ExecRequest
from corral.providers.docker import PAUSE_CHECKPOINT, DockerProvider, container_name
from corral.providers.gvisor import GVisorProvider
from corral.settings import Settings
from corral.store import Store
from corral.values import parse_size

__all__ = ["CallClock", "forks_and_snapshots", "pause_resume", "setup_sessions"]

MIB = 1024**2
READY_TIMEOUT_S = 120.0
RAW_REPO = "corral-bench-raw"
RAW_CHECKPOINT = "bench"

ENGINE_CALLS = (
    "create_checkpoint",
    "start_container",
    "remove_checkpoint",
    "list_checkpoints",
    "exec_running",
    "exec_attached",
    "exec_privileged",
    "inspect_container",
    "inspect_volume",
    "inspect_image",
    "create_container",
    "create_volume",
    "commit",
    "remove_image",
    "remove_volume",
    "remove_container",
    "info",
)
"""The Docker Engine calls :class:`CallClock` times in Corral's provider."""
HOST_CALLS = ("copy_tree", "link_tree")
"""The host copies the docker provider makes (of /workspace volumes and checkpoint images)."""


def holder_program(mib: int) -> str:
    """A Python program holding ``mib`` MiB of random (incompressible) memory; writes its pid to /tmp/held once it
    does, then sleeps."""
    return (
        f"import os, signal; held = bytearray(os.urandom({mib} << 20)); "
        "open('/tmp/held.tmp', 'w').write(str(os.getpid())); os.rename('/tmp/held.tmp', '/tmp/held'); signal.pause()"
    )


def holder_shell(mib: int) -> str:
    """Start the holder in a workspace through an exec: in a session of its own (the agent ends an exec's process
    group when the exec ends), detached from the exec's output."""
    return f"setsid python3 -c {shlex.quote(holder_program(mib))} >/dev/null 2>&1 </dev/null & sleep 1"


HOLDER_ALIVE = "test -s /tmp/held && kill -0 $(cat /tmp/held)"


# --- instrumentation ---------------------------------------------------------------------------------------------


class CallClock:
    """Wall time spent in chosen calls, summed by name since the last :meth:`lap`, in milliseconds.

    Bench instrumentation only: the calls are wrapped on their owner (an engine instance, a module) for the clock's
    life and put back by :meth:`close`; Corral's code is unchanged. A call with a ``checkpoint`` argument counts
    under ``NAME --checkpoint``. Calls that overlap (a fork's concurrent restores) each count in full, so the parts
    can add up to more than the wall time.
    """

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        """How many calls of each name, since the clock started (never reset by a lap)."""
        self._lock = threading.Lock()  # host copies run in worker threads
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: object, names: tuple[str, ...], prefix: str = "") -> None:
        """Time ``owner.NAME`` for each name (sync or async)."""
        for name in names:
            self._wrap(owner, name, prefix + name)

    def _wrap(self, owner: object, name: str, label: str) -> None:
        original = getattr(owner, name)

        def key(kwargs: dict[str, Any]) -> str:
            return f"{label} --checkpoint" if kwargs.get("checkpoint") else label

        timed: Callable[..., Any]
        if inspect.iscoroutinefunction(original):

            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    self._add(key(kwargs), started)

            timed = timed_async
        else:

            def timed_sync(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    self._add(key(kwargs), started)

            timed = timed_sync
        own = name in vars(owner)  # a module's function, or an instance attribute (not a method of its class)
        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original) if own else delattr(owner, name))

    def _add(self, key: str, started: float) -> None:
        elapsed = (time.perf_counter() - started) * 1000
        with self._lock:
            self._totals[key] = self._totals.get(key, 0.0) + elapsed
            self.calls[key] = self.calls.get(key, 0) + 1

    def lap(self) -> dict[str, float]:
        """The totals since the last lap, and start again from zero."""
        with self._lock:
            totals, self._totals = self._totals, {}
        return totals

    def close(self) -> None:
        """Put every wrapped call back."""
        while self._undo:
            self._undo.pop()()


@dataclass
class Parts:
    """Per-round laps of a :class:`CallClock` for one operation, and its wall times."""

    wall: Samples = field(default_factory=Samples)
    laps: list[dict[str, float]] = field(default_factory=list)

    def add(self, wall_ms: float, lap: dict[str, float]) -> None:
        """Record one round."""
        self.wall.add(wall_ms)
        self.laps.append(lap)

    def describe(self) -> str:
        """``1234 ms = create_checkpoint 800 + exec_running 300 + rest 134`` (medians over rounds; the rest is the
        wall time outside the timed calls, negative when timed calls overlapped). Calls named ``Phase.name`` wrap
        others: they are listed apart, in brackets, and left out of the sum."""
        if not self.laps:
            return "not measured"
        names = sorted({n for lap in self.laps for n in lap}, key=lambda n: -statistics.median(_get(self.laps, n)))
        medians = {n: statistics.median(_get(self.laps, n)) for n in names}
        phases = [n for n in names if "." in n]
        leaves = [n for n in names if n not in phases]
        rest = statistics.median(
            w - sum(lap.get(n, 0.0) for n in leaves) for w, lap in zip(self.wall.values, self.laps, strict=True)
        )
        shown = [f"{n} {medians[n]:.0f}" for n in leaves if medians[n] >= 1]
        text = f"{statistics.median(self.wall.values):.0f} ms = " + " + ".join([*shown, f"rest {rest:.0f}"])
        if phases:
            text += " [" + ", ".join(f"{n} {medians[n]:.0f}" for n in phases) + "]"
        return text


def _get(laps: list[dict[str, float]], name: str) -> list[float]:
    return [lap.get(name, 0.0) for lap in laps]


@contextlib.contextmanager
def clocked(engine: DockerEngine, *extra: tuple[object, tuple[str, ...], str]) -> Iterator[CallClock]:
    """A :class:`CallClock` on a provider's engine (and ``extra`` owners), closed on exit."""
    clock = CallClock()
    try:
        clock.wrap(engine, ENGINE_CALLS)
        for owner, names, prefix in extra:
            clock.wrap(owner, names, prefix)
        yield clock
    finally:
        clock.close()


# --- helpers -------------------------------------------------------------------------------------------------------


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll ``check`` every 0.1 s until it is true; raise naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: still not so after {timeout_s:g} s")
        await asyncio.sleep(0.1)


async def provider_sh(provider: DockerProvider, workspace_id: str, script: str) -> int:
    """Exit code of a shell command run through the provider."""
    return (await provider.exec(workspace_id, ExecRequest(script))).exit_code


async def provider_true(provider: DockerProvider, workspace_id: str) -> None:
    """``true`` through the provider; raises unless it exits 0."""
    result = await provider.exec(workspace_id, TRUE)
    if result.exit_code != 0:
        raise RuntimeError(f"workspace {workspace_id}: true exited with {result.exit_code}")


async def plain_sh(bench: Bench, container: PlainContainer, script: str) -> int:
    """Exit code of ``docker exec CONTAINER sh -c SCRIPT``."""
    return await bench.plain.exec(container, ["sh", "-c", script])


async def plain_holder(bench: Bench) -> PlainContainer:
    """``docker run --runtime=runsc`` whose main command is the holder (gVisor restores only processes of the
    container's own tree, not those ``docker exec`` started); returns once it holds the memory."""
    mib = bench.config.held_mib
    container = await bench.plain.run(bench.settings.gvisor_runtime, cmd=["python3", "-c", holder_program(mib)])
    await until(lambda: _zero(plain_sh(bench, container, "test -s /tmp/held")), "the plain holder's memory")
    return container


async def _zero(code: Awaitable[int]) -> bool:
    return await code == 0


async def docker_root(bench: Bench) -> Path:
    """dockerd's data directory, where containers keep their checkpoints."""
    return Path((await bench.plain.engine.info()).get("DockerRootDir") or "/var/lib/docker")


@dataclass
class RawRestarts:
    """``docker start --checkpoint`` as an operator would run it: dockerd uploads the checkpoint into containerd's
    content store, and an upload whose content (digest) is still there from an earlier restore fails with "already
    exists" until containerd drops it; Corral's provider retries then (0.2 s, 0.4 s...), and so does this, the
    same way. The waits count in the raw time; :attr:`retries` says how many there were."""

    calls: int = 0
    retries: int = 0

    async def start(self, bench: Bench, container: PlainContainer, checkpoint: str) -> None:
        """Restore ``container`` from ``checkpoint``."""
        self.calls += 1
        for attempt in range(6):
            try:
                await bench.plain.engine.start_container(container.id, checkpoint=checkpoint)
            except DockerAPIError as exc:
                if "already exists" not in exc.message or attempt == 5:
                    raise
                self.retries += 1
                await asyncio.sleep(0.2 * (attempt + 1))
            else:
                return


def _collisions(raw: RawRestarts, corral_calls: int, corral_restores: int) -> str:
    """What the containerd upload collisions (see :class:`RawRestarts`) cost each side, as a sentence."""
    return (
        f'Restores retried after an "already exists" collision in containerd: raw {raw.retries} of {raw.calls}, '
        f"Corral {max(corral_calls - corral_restores, 0)} of {corral_restores} (its provider retries the same way)."
    )


async def copy_dir(source: Path, target: Path) -> None:
    """``cp -a SOURCE TARGET`` (what an operator restoring a checkpoint into another container would run)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec("cp", "-a", str(source), str(target), stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"cp -a {source} {target}: {err.decode(errors='replace').strip()}")


def within(ratio: float | None, limit: float = 1.2) -> Target:
    """``<= 1.2x raw (p50)`` and whether it holds."""
    if ratio is None:
        return Target(f"<= {limit:g}x raw (p50)", False, "no ratio")
    return Target(f"<= {limit:g}x raw (p50)", ratio <= limit, f"{ratio:.2f}x")


def ratio_of(corral: Measure, plain: Measure) -> float | None:
    """Corral p50 / plain p50, as the table computes it."""
    return corral.p50 / plain.p50 if plain.p50 > 0 and corral.p50 > 0 else None


# --- pause and resume --------------------------------------------------------------------------------------------


@dataclass
class _RawPause:
    """Raw checkpoint/restore samples of one plain container."""

    label: str
    pause: Samples = field(default_factory=Samples)
    resume: Samples = field(default_factory=Samples)
    to_exec: Samples = field(default_factory=Samples)
    size: Samples = field(default_factory=lambda: Samples("MiB"))
    lost: list[str] = field(default_factory=list)
    """Restores after which the container had exited (the round is dropped, the container replaced)."""


@dataclass
class _PauseSamples:
    pause: Parts = field(default_factory=Parts)
    resume: Parts = field(default_factory=Parts)
    first_exec: Parts = field(default_factory=Parts)
    to_exec: Samples = field(default_factory=Samples)
    warm_exec: Samples = field(default_factory=Samples)
    size: Samples = field(default_factory=lambda: Samples("MiB"))
    lost: list[str] = field(default_factory=list)
    """Resumes after which the workspace's container had exited (the round is dropped, the workspace replaced)."""
    raw: list[_RawPause] = field(default_factory=list)


async def pause_resume(bench: Bench) -> None:
    """Pause/resume cycles of an idle workspace and of one holding memory, Corral and raw interleaved round by
    round (round 0 is the warm-up); then a check that the holders still hold their memory."""
    restarts = RawRestarts()
    with clocked(bench.gvisor.engine) as clock:
        idle = await _pause_variant(bench, clock, restarts, held=False)
        held = await _pause_variant(bench, clock, restarts, held=True)
        corral_starts = clock.calls.get("start_container --checkpoint", 0)
    mib, n = bench.config.held_mib, bench.config.cycles
    for label, s in (("idle", idle), (f"holding {mib} MB", held)):
        pause, to_exec, resume = s.pause.wall.measure(), s.to_exec.measure(), s.resume.wall.measure()
        for raw in s.raw:
            raw_pause, raw_to_exec, raw_resume = raw.pause.measure(), raw.to_exec.measure(), raw.resume.measure()
            resume_target = within(ratio_of(to_exec, raw_to_exec))
            if label == "idle":
                ok = resume_target.met and to_exec.p50 <= 500
                resume_target = Target("<= 1.2x raw and p50 <= 500 ms", ok, resume_target.detail)
            on = f" ({raw.label})" if len(s.raw) > 1 else ""
            bench.rows += [
                Row(
                    f"pause, gVisor, {label} (provider.pause)",
                    pause,
                    raw_pause,
                    f"docker checkpoint create{on}",
                    within(ratio_of(pause, raw_pause)),
                ),
                Row(
                    f"resume, gVisor, {label}, until it answers an exec (provider.resume + exec true)",
                    to_exec,
                    raw_to_exec,
                    f"docker start --checkpoint + docker exec true{on}",
                    resume_target,
                ),
                Row(
                    f"resume, gVisor, {label}, provider.resume only (agent not yet back)",
                    resume,
                    raw_resume,
                    f"docker start --checkpoint{on}",
                    within(ratio_of(resume, raw_resume)),
                ),
                Row(
                    f"pause checkpoint size, gVisor, {label} (du)",
                    s.size.measure(),
                    raw.size.measure(),
                    f"checkpoint directory (du){on}",
                ),
            ]
    restores = sum(1 + len(s.raw) for s in (idle, held)) * (n + 1)
    corral_restores = 2 * (n + 1)
    bench.notes.append(
        f"Pause/resume: {n} cycles per variant on one workspace (and each plain container), after one warm-up "
        "cycle, Corral and raw interleaved. Corral = GVisorProvider.pause / .resume in the bench process on a "
        "workspace whose agent is connected (it ran `true` just before); pause first ends the agent's docker-exec "
        "stream and waits for its process to exit (gVisor cannot checkpoint a process holding docker-exec FDs), and "
        "the next exec starts a new agent, so the resume that counts ends when `true` has answered through it. "
        "Idle: the plain container runs `sleep infinity` (the plain container of every other row); Corral's holds "
        "docker-init and its static spawner (src/corral/guest/spawner.c). Holding memory: a "
        f"process started through an exec with setsid keeps bytearray(os.urandom({mib} MiB)); the plain "
        "container's main command is that process (gVisor does not restore what `docker exec` started). Raw = "
        "`docker checkpoint create` (exit), `docker start --checkpoint` (the checkpoint is removed after the clock; "
        "Corral's resume removes its own inside it), then `docker exec true`. Both holders were alive after the "
        "last cycle. Sizes: du of the checkpoint directory after each pause. "
        f"{_collisions(restarts, corral_starts, corral_restores)} ({restores} restores in all)"
    )
    for label, s in (("idle", idle), (f"{mib} MB", held)):
        bench.notes.append(
            f"Where Corral's time goes, {label} (medians of engine calls timed from outside): pause "
            f"{s.pause.describe()}; resume {s.resume.describe()}; first exec after resume (new agent) "
            f"{s.first_exec.describe()}, against {s.warm_exec.measure().p50:.0f} ms for the next exec."
        )
        lost = [*(f"Corral {m}" for m in s.lost), *(f"{r.label} {m}" for r in s.raw for m in r.lost)]
        if lost:
            bench.notes.append(
                f"Restores that reported success but left the container exited ({label}; the round was dropped "
                f"and a fresh workspace or container taken): " + "; ".join(lost)[:600]
            )


async def _pause_variant(bench: Bench, clock: CallClock, restarts: RawRestarts, *, held: bool) -> _PauseSamples:
    gvisor, plain, engine = bench.gvisor, bench.plain, bench.plain.engine
    root = await docker_root(bench)
    samples = _PauseSamples()
    workspace: str | None = None
    containers: list[PlainContainer | None] = []
    cmds: dict[str, list[str] | None] = (
        {"holder": ["python3", "-c", holder_program(bench.config.held_mib)]} if held else {"sleep infinity": None}
    )

    async def new_workspace() -> tuple[str, str]:
        spec = bench.spec()
        await gvisor.create(spec)
        await provider_true(gvisor, spec.id)
        if held:
            await hold_in(gvisor, spec.id, bench.config.held_mib)
        return spec.id, str((await engine.request("GET", f"/containers/{container_name(spec.id)}/json"))["Id"])

    async def new_container(cmd: list[str] | None) -> PlainContainer:
        container = await plain.run(bench.settings.gvisor_runtime, cmd=cmd)
        if held:
            await until(lambda: _zero(plain_sh(bench, container, "test -s /tmp/held")), "the plain holder's memory")
        return container

    try:
        workspace, corral_id = await new_workspace()
        for label, cmd in cmds.items():
            samples.raw.append(_RawPause(label))
            containers.append(await new_container(cmd))
        for round_ in range(bench.config.cycles + 1):
            clock.lap()
            t0 = time.perf_counter()
            kept = await gvisor.pause(workspace)
            t1 = time.perf_counter()
            pause_lap = clock.lap()
            if kept != "memory":
                raise RuntimeError(f"pause kept {kept!r}, not memory")
            size = tree_size(root / "containers" / corral_id / "checkpoints" / PAUSE_CHECKPOINT)
            t2 = time.perf_counter()
            await gvisor.resume(workspace)
            t3 = time.perf_counter()
            resume_lap = clock.lap()
            try:
                await provider_true(gvisor, workspace)
            except CorralError as exc:
                if await running(bench, container_name(workspace)):
                    raise
                samples.lost.append(f"round {round_}: {exc.message}")
                await gvisor.destroy(workspace)
                workspace = None
                workspace, corral_id = await new_workspace()
                continue
            t4 = time.perf_counter()
            exec_lap = clock.lap()
            await provider_true(gvisor, workspace)
            t5 = time.perf_counter()
            if round_:  # round 0 is the warm-up
                samples.pause.add((t1 - t0) * 1000, pause_lap)
                samples.resume.add((t3 - t2) * 1000, resume_lap)
                samples.first_exec.add((t4 - t3) * 1000, exec_lap)
                samples.to_exec.add((t4 - t2) * 1000)
                samples.warm_exec.add((t5 - t4) * 1000)
                samples.size.add(size / MIB)
            for index, raw in enumerate(samples.raw):
                container = containers[index]
                assert container is not None
                r0 = time.perf_counter()
                await engine.create_checkpoint(container.id, RAW_CHECKPOINT, exit=True)
                r1 = time.perf_counter()
                raw_size = tree_size(root / "containers" / container.id / "checkpoints" / RAW_CHECKPOINT)
                r2 = time.perf_counter()
                await restarts.start(bench, container, RAW_CHECKPOINT)
                r3 = time.perf_counter()
                try:
                    await plain.exec_true(container)
                except (RuntimeError, DockerAPIError) as exc:
                    if await running(bench, container.id):
                        raise
                    raw.lost.append(f"round {round_}: {exc}")
                    containers[index] = None
                    await plain.remove(container)
                    containers[index] = await new_container(cmds[raw.label])
                    continue
                r4 = time.perf_counter()
                await engine.remove_checkpoint(container.id, RAW_CHECKPOINT)
                if round_:
                    raw.pause.add((r1 - r0) * 1000)
                    raw.resume.add((r3 - r2) * 1000)
                    raw.to_exec.add((r4 - r2) * 1000)
                    raw.size.add(raw_size / MIB)
        if held:
            if await provider_sh(gvisor, workspace, HOLDER_ALIVE) != 0:
                raise RuntimeError("the workspace's memory holder did not survive pause/resume")
            for container in containers:
                if container is not None and await plain_sh(bench, container, HOLDER_ALIVE) != 0:
                    raise RuntimeError("the plain container's memory holder did not survive checkpoint/restore")
    finally:
        if workspace is not None:
            await gvisor.destroy(workspace)
        for container in containers:
            if container is not None:
                await plain.remove(container)
    return samples


async def running(bench: Bench, container: str) -> bool:
    """Whether the container exists and runs."""
    info = await bench.plain.engine.inspect_container(container)
    return info is not None and bool(info["State"].get("Running"))


async def hold_in(provider: DockerProvider, workspace_id: str, mib: int) -> None:
    """Start the memory holder in the workspace through an exec and wait until it holds the memory."""
    if await provider_sh(provider, workspace_id, holder_shell(mib)) != 0:
        raise RuntimeError("starting the memory holder in the workspace failed")
    await until(lambda: _zero(provider_sh(provider, workspace_id, "test -s /tmp/held")), "the workspace's holder")


# --- Corral in this process: service, snapshots, agents ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CorralStack:
    """A WorkspaceService (gVisor only, SQLite in the bench's work directory) with SnapshotService and
    AgentService, wired as ``corral.api.app``'s lifespan wires them."""

    provider: GVisorProvider
    service: WorkspaceService
    snapshots: SnapshotService
    agents: AgentService

    async def create(self) -> str:
        """A new gVisor workspace whose agent is up; returns its id."""
        record = await self.service.create(CreateWorkspace(provider="gvisor"))
        await provider_true(self.provider, record.id)
        return record.id


@contextlib.asynccontextmanager
async def corral_stack(bench: Bench, name: str) -> AsyncIterator[CorralStack]:
    """Build a :class:`CorralStack`; on exit end its sessions, delete its snapshots, destroy its workspaces."""
    data_dir = bench.workdir / name
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        data_dir=data_dir,
        database_url=f"sqlite:///{(data_dir / 'corral.db').resolve()}",  # never the operator's database
        providers="gvisor",
    )
    bench.track_owner(settings.owner_id())
    provider = GVisorProvider(
        DockerEngine(settings.docker_host.removeprefix("unix://")),
        runtime=settings.gvisor_runtime,
        net_runtime=settings.gvisor_net_runtime,
        pids_limit=settings.pids_limit,
        owner=settings.owner_id(),
        agent_image=settings.base_image,
        agent_runtime_dir=settings.agent_runtime_dir,
        snapshot_dir=settings.snapshot_dir,
    )
    store = await Store.open(settings.sqlalchemy_url())
    monitor = HealthMonitor({"gvisor": provider}, settings.health_interval_s)
    await monitor.check_all()
    service = WorkspaceService(settings, store, {"gvisor": provider}, monitor)
    snapshots = SnapshotService(
        service, store, storage_limit=parse_size(settings.snapshot_storage_limit, field_name="snapshot limit")
    )
    agents = AgentService(service, snapshots=snapshots)
    try:
        yield CorralStack(provider, service, snapshots, agents)
    finally:
        await agents.aclose()
        for session in await store.sessions.list():
            if session.status != "ended":
                with contextlib.suppress(Exception):
                    await agents.end(session.id)
        for snapshot in await snapshots.find():
            with contextlib.suppress(Exception):
                await snapshots.delete(snapshot.id)
        for snapshot_id in await provider.list_snapshots():  # written without a record (an interrupted run)
            await provider.delete_snapshot(snapshot_id)
        for workspace in await service.list_workspaces():
            if workspace.status != "destroyed":
                await service.destroy(workspace.id)
        await service.aclose()
        await store.close()


# --- raw snapshots and forks ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RawSnapshot:
    """A plain container's checkpoint (left running) and its committed image."""

    source: PlainContainer
    checkpoint: Path
    image: str


async def raw_snapshot(bench: Bench, source: PlainContainer, tag: str) -> RawSnapshot:
    """``docker checkpoint create --leave-running`` + ``docker commit``."""
    engine = bench.plain.engine
    await engine.create_checkpoint(source.id, RAW_CHECKPOINT, exit=False)
    try:
        image = await engine.commit(source.id, RAW_REPO, tag, labels={BENCH_LABEL: bench.run_id})
    except BaseException:
        await engine.remove_checkpoint(source.id, RAW_CHECKPOINT)
        raise
    path = await docker_root(bench) / "containers" / source.id / "checkpoints" / RAW_CHECKPOINT
    return RawSnapshot(source, path, image)


async def raw_restore(
    bench: Bench, snapshot: RawSnapshot, made: list[PlainContainer], restarts: RawRestarts
) -> PlainContainer:
    """``docker create`` from the snapshot's image, ``cp -a`` of its checkpoint into the new container's
    directory, ``docker start --checkpoint``. The container is appended to ``made`` as soon as it exists."""
    container = await bench.plain.create(bench.settings.gvisor_runtime, image=snapshot.image)
    made.append(container)
    target = await docker_root(bench) / "containers" / container.id / "checkpoints" / RAW_CHECKPOINT
    await copy_dir(snapshot.checkpoint, target)
    await restarts.start(bench, container, RAW_CHECKPOINT)
    return container


async def drop_raw_snapshot(bench: Bench, snapshot: RawSnapshot) -> None:
    """Remove the checkpoint and the image (after the containers restored from it)."""
    await bench.plain.engine.remove_checkpoint(snapshot.source.id, RAW_CHECKPOINT)
    await bench.plain.engine.remove_image(snapshot.image, force=True)


async def remove_all(bench: Bench, containers: list[PlainContainer]) -> None:
    """Remove the containers, four at a time."""
    slots = asyncio.Semaphore(4)

    async def one(container: PlainContainer) -> None:
        async with slots:
            await bench.plain.remove(container)

    await asyncio.gather(*(one(c) for c in containers))
    containers.clear()


# --- snapshots and forks -----------------------------------------------------------------------------------------


async def forks_and_snapshots(bench: Bench) -> None:
    """Snapshot create (time and size) of an idle workspace and of one holding memory, and fork x``forks`` of the
    idle one, against the raw equivalents; rounds interleaved, round 0 the warm-up (a fork of 2)."""
    mib, n, rounds = bench.config.held_mib, bench.config.forks, bench.config.fork_rounds
    restarts = RawRestarts()
    plain: list[PlainContainer] = []
    async with corral_stack(bench, "snapshots") as stack:
        with clocked(stack.provider.engine, (docker_module, HOST_CALLS, "")) as clock:
            clock.wrap(stack.snapshots, ("create", "restore", "delete"), "SnapshotService.")
            idle_ws = await stack.create()
            held_ws = await stack.create()
            await hold_in(stack.provider, held_ws, mib)
            try:
                runtime = bench.settings.gvisor_runtime
                plain.append(await bench.plain.run(runtime))
                plain.append(await plain_holder(bench))
                idle_plain = {"sleep infinity": plain[0]}
                snaps = {
                    "idle": await _snapshot_rounds(bench, stack, clock, idle_ws, idle_plain, rounds),
                    f"holding {mib} MB": await _snapshot_rounds(
                        bench, stack, clock, held_ws, {"holder": plain[1]}, rounds
                    ),
                }
                fork = await _fork_rounds(bench, stack, clock, restarts, idle_ws, idle_plain, rounds, n)
                corral_starts = clock.calls.get("start_container --checkpoint", 0)
                if await provider_sh(stack.provider, held_ws, HOLDER_ALIVE) != 0:
                    raise RuntimeError("the workspace's memory holder did not survive its snapshots")
            finally:
                for container in plain:
                    await bench.plain.remove(container)

    sizes = []
    for label, s in snaps.items():
        corral = s.create.wall.measure()
        for raw_label, raw in s.raw.items():
            on = f" ({raw_label})" if len(s.raw) > 1 else ""
            bench.rows += [
                Row(
                    f"snapshot create, gVisor, {label} (SnapshotService.create)",
                    corral,
                    raw.create.measure(),
                    f"checkpoint --leave-running + commit{on}",
                ),
                Row(
                    f"snapshot size, gVisor, {label} (SnapshotInfo.size_bytes)",
                    Measure.single(statistics.median(s.size) / MIB, "MiB", text=_mib(s.size)),
                    Measure.single(statistics.median(raw.size) / MIB, "MiB", text=_mib(raw.size)),
                    f"checkpoint directory (du){on}",
                ),
            ]
            sizes.append(
                f"{label} {statistics.median(s.size):.0f} bytes against {raw_label} {statistics.median(raw.size):.0f}"
            )
    corral_fork = fork.corral.wall.measure()
    for raw_label, raw_fork in fork.raw.items():
        on = f" ({raw_label})" if len(fork.raw) > 1 else ""
        bench.rows.append(
            Row(
                f"fork x{n}, gVisor, idle (SnapshotService.fork), total",
                corral_fork,
                raw_fork.measure(),
                f"checkpoint + commit + {n} x (create + cp + start --checkpoint){on}",
                Target("<= 6 s total (p50)", corral_fork.p50 <= 6000, f"{corral_fork.p50 / 1000:.2f} s"),
            )
        )
    bench.notes += [
        f"Snapshots: {rounds} round(s) after a warm-up. Corral = SnapshotService.create on a WorkspaceService in "
        "the bench process (SQLite store, gVisor only): the workspace is checkpointed and stopped, its root "
        "filesystem committed, its /workspace volume copied, the checkpoint hard-linked into the snapshot "
        "directory, and the workspace restored from that checkpoint; then deleted (untimed). size_bytes = the "
        "image's layer on top of the base image + the volume copy + the memory checkpoint. Raw = `docker "
        "checkpoint create --leave-running` + `docker commit` of plain runsc containers (idle: `sleep infinity`; "
        "memory: the holder as main command); size = du of the checkpoint directory only. Sizes "
        f"(p50 bytes): {'; '.join(sizes)}.",
        f"Fork x{n}: {rounds} round(s) after a warm-up fork of 2. Corral = SnapshotService.fork (one snapshot, "
        f"{n} restores four at a time, the snapshot deleted at the end), each fork checked ready and one answering "
        f"`true`, destroyed after the clock. Raw = checkpoint --leave-running + commit, then {n} times in a row: "
        "`docker create` from the image, `cp -a` of the checkpoint into the new container's checkpoints directory, "
        "`docker start --checkpoint`; the last one answering `docker exec true` after the clock. Forks whose "
        f"container had exited right after the fork: Corral {fork.corral_dead}, raw {fork.raw_dead}.",
        "Where Corral's snapshot and fork time goes (medians; engine calls and host copies timed from outside; "
        "the restores overlap, so their calls add up to more than the wall time; the SnapshotService phases in "
        "brackets): "
        + "; ".join(f"snapshot {label}: {s.create.describe()}" for label, s in snaps.items())
        + f"; fork x{n}: {fork.corral.describe()}. "
        # Each snapshot restores its source from its checkpoint; each fork is a restore.
        + _collisions(restarts, corral_starts, 3 * (rounds + 1) + 2 + n * rounds),
    ]


def _mib(values: list[float]) -> str:
    return f"{statistics.median(values) / MIB:.1f} MiB"


@dataclass
class _RawSnapshots:
    create: Samples = field(default_factory=Samples)
    size: list[float] = field(default_factory=list)


@dataclass
class _SnapshotSamples:
    create: Parts = field(default_factory=Parts)
    size: list[float] = field(default_factory=list)
    raw: dict[str, _RawSnapshots] = field(default_factory=dict)


async def _snapshot_rounds(
    bench: Bench,
    stack: CorralStack,
    clock: CallClock,
    workspace: str,
    plain: dict[str, PlainContainer],
    rounds: int,
) -> _SnapshotSamples:
    samples = _SnapshotSamples(raw={label: _RawSnapshots() for label in plain})
    for round_ in range(rounds + 1):
        clock.lap()
        started = time.perf_counter()
        record = await stack.snapshots.create(workspace)
        elapsed = (time.perf_counter() - started) * 1000
        lap = clock.lap()
        await stack.snapshots.delete(record.id)
        await provider_true(stack.provider, workspace)  # the source carries on, and its agent is back
        if record.kind != "memory":
            raise RuntimeError(f"snapshot {record.id} kept {record.kind}, not memory")
        if round_:
            samples.create.add(elapsed, lap)
            samples.size.append(record.size_bytes)
        for index, (label, container) in enumerate(plain.items()):
            started = time.perf_counter()
            raw = await raw_snapshot(bench, container, f"{bench.run_id}-snap-{round_}-{index}")
            raw_elapsed = (time.perf_counter() - started) * 1000
            raw_bytes = tree_size(raw.checkpoint)
            await drop_raw_snapshot(bench, raw)
            if round_:
                samples.raw[label].create.add(raw_elapsed)
                samples.raw[label].size.append(raw_bytes)
    return samples


@dataclass
class _ForkSamples:
    corral: Parts = field(default_factory=Parts)
    raw: dict[str, Samples] = field(default_factory=dict)
    corral_dead: int = 0
    raw_dead: int = 0


async def _fork_rounds(
    bench: Bench,
    stack: CorralStack,
    clock: CallClock,
    restarts: RawRestarts,
    workspace: str,
    plain: dict[str, PlainContainer],
    rounds: int,
    n: int,
) -> _ForkSamples:
    samples = _ForkSamples(raw={label: Samples() for label in plain})
    for round_ in range(rounds + 1):
        count = n if round_ else 2
        clock.lap()
        started = time.perf_counter()
        forks = await stack.snapshots.fork(workspace, count)
        elapsed = (time.perf_counter() - started) * 1000
        lap = clock.lap()
        try:
            if len(forks) != count or any(f.status != "ready" for f in forks):
                raise RuntimeError(f"fork x{count} gave {[f.status for f in forks]}")
            alive = [r.id for r in forks if await running(bench, container_name(r.id))]
            samples.corral_dead += count - len(alive)
            if alive:
                await provider_true(stack.provider, alive[-1])
        finally:
            for record in forks:
                await stack.service.destroy(record.id)
        await provider_true(stack.provider, workspace)
        if round_:
            samples.corral.add(elapsed, lap)

        for index, (label, container) in enumerate(plain.items()):
            made: list[PlainContainer] = []
            try:
                started = time.perf_counter()
                snapshot = await raw_snapshot(bench, container, f"{bench.run_id}-fork-{round_}-{index}")
                try:
                    for _ in range(count):
                        await raw_restore(bench, snapshot, made, restarts)
                    raw_elapsed = (time.perf_counter() - started) * 1000
                    up = [c for c in made if await running(bench, c.id)]
                    samples.raw_dead += count - len(up)
                    if up:
                        await bench.plain.exec_true(up[-1])
                finally:
                    await remove_all(bench, made)
                    await drop_raw_snapshot(bench, snapshot)
            finally:
                await remove_all(bench, made)
            if round_:
                samples.raw[label].add(raw_elapsed)
    return samples


# --- set up once, start many ---------------------------------------------------------------------------------------


async def _session(stack: CorralStack, agent_type: str) -> tuple[float, str, dict[str, Any]]:
    """Start a session and wait until provisioning ends; returns ms to active, its id, its workspace's metadata."""
    started = time.perf_counter()
    session = await stack.agents.start(agent_type, TaskContext())
    session = await stack.agents.wait_provisioned(session.id)
    elapsed = (time.perf_counter() - started) * 1000
    if session.status != "active" or session.degraded or session.workspace_id is None:
        raise RuntimeError(f"session {session.id}: {session.status}, {session.degraded_reason or 'no workspace'}")
    workspace = await stack.service.get(session.workspace_id)
    return elapsed, session.id, dict(workspace.metadata)


async def setup_sessions(bench: Bench) -> None:
    """The first session of an agent type with a ``sleep SETUP`` setup and ``snapshot_after_setup`` (sets up,
    snapshots), then later sessions (restore), against raw: run + exec the setup + checkpoint + commit, then
    create + cp + start --checkpoint per later session."""
    setup_s, n = bench.config.setup_s, bench.config.later_sessions
    config = {
        "enabled": True,
        "provider": "gvisor",
        "repo_source": {"type": "none"},
        "setup_commands": [f"sleep {setup_s:g}"],
        "setup_timeout_s": setup_s * 4 + 60,
        "snapshot_after_setup": True,
    }
    later = Parts()
    async with corral_stack(bench, "setup") as stack:
        with clocked(stack.provider.engine, (docker_module, HOST_CALLS, "")) as clock:
            clock.wrap(stack.snapshots, ("create", "restore"), "SnapshotService.")
            agent_type = (await stack.agents.create_type("bench-setup", config)).id
            first_ms, first_id, metadata = await _session(stack, agent_type)
            if (metadata.get("setup") or {}).get("source") != "ran":
                raise RuntimeError(f"the first session did not run its setup: {metadata.get('setup')}")
            await stack.agents.end(first_id)
            for _ in range(n):
                clock.lap()
                elapsed, session_id, metadata = await _session(stack, agent_type)
                lap = clock.lap()
                if (metadata.get("setup") or {}).get("source") != "snapshot":
                    raise RuntimeError(f"a later session did not restore the setup snapshot: {metadata.get('setup')}")
                await stack.agents.end(session_id)
                later.add(elapsed, lap)
    raw_first, raw_later, restarts = await _raw_setup(bench, setup_s, n)

    first = Measure.single(first_ms, "ms")
    later_measure = later.wall.measure()
    speedup = first_ms / later_measure.p50
    ok = later_measure.p50 <= 1500 and (speedup >= 20 or bench.config.quick)
    detail = f"{speedup:.0f}x faster than the first" + (
        f"; 20x needs the 30 s setup, this run's is {setup_s:g} s" if bench.config.quick else ""
    )
    setup = f"`sleep {setup_s:g}` setup"
    bench.rows += [
        Row(
            f"session start, {setup} + snapshot_after_setup, first session (sets up, snapshots)",
            first,
            Measure.single(raw_first, "ms"),
            "run + exec setup + checkpoint + commit",
        ),
        Row(
            f"session start, {setup} + snapshot_after_setup, later sessions (restore)",
            later_measure,
            raw_later.measure(),
            "create + cp checkpoint + start --checkpoint",
            Target("p50 <= 1.5 s and >= 20x faster than setup", ok, detail),
        ),
    ]
    bench.notes.append(
        "Set up once, start many: AgentService (with SnapshotService, as the app builds it) on the in-process "
        f"WorkspaceService; an agent type with repo_source none, setup `sleep {setup_s:g}` and "
        f"snapshot_after_setup. Start = AgentService.start until its provisioning task ended (active, not degraded); "
        f"the first session ran its setup and snapshotted the workspace, the {n} later ones each restored the "
        "snapshot (their workspaces' metadata say so), one after another, each ended after the clock. Raw: `docker "
        f"run` + `docker exec sleep {setup_s:g}` + checkpoint --leave-running + commit, then per later session "
        f"create + cp -a of the checkpoint + start --checkpoint ({restarts.retries} retried after a containerd "
        f"collision). Where a later session's time goes (medians, timed from outside): {later.describe()}."
    )


async def _raw_setup(bench: Bench, setup_s: float, n: int) -> tuple[float, Samples, RawRestarts]:
    later = Samples()
    restarts = RawRestarts()
    made: list[PlainContainer] = []
    started = time.perf_counter()
    source = await bench.plain.run(bench.settings.gvisor_runtime)
    try:
        if await bench.plain.exec(source, ["sleep", f"{setup_s:g}"]) != 0:
            raise RuntimeError("the plain setup failed")
        snapshot = await raw_snapshot(bench, source, f"{bench.run_id}-setup")
        first = (time.perf_counter() - started) * 1000
        try:
            for _ in range(n):
                restored = time.perf_counter()
                await raw_restore(bench, snapshot, made, restarts)
                later.add((time.perf_counter() - restored) * 1000)
                await remove_all(bench, made)
        finally:
            await remove_all(bench, made)
            await drop_raw_snapshot(bench, snapshot)
    finally:
        await bench.plain.remove(source)
    return first, later, restarts
