"""Memory of idle gVisor workspaces, three ways, and how many idle workspaces fit on this machine.

* cgroup: the container's memory cgroup through the Docker stats API, as ``docker stats`` shows it;
* host PSS: the proportional set size of every host process serving the container (its containerd shim and what
  that runs: runsc's sandbox, gofer and ptrace stubs, and for Corral the ``runsc exec`` holding the agent's stream);
  exact and unaffected by other work on the machine;
* MemAvailable drop: what /proc/meminfo loses with N of them running, divided by N; everything included (kernel
  memory, page tables, caches that cannot be dropped) but noisy when other work runs on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from bench.context import Bench
from bench.latency import TRUE
from bench.plain import memory_usage
from bench.report import Row, Target
from bench.stats import Measure, Samples
from corral.providers.docker import container_name

__all__ = ["idle_memory"]

SETTLE_S = 1.0
"""Pause before reading MemAvailable, so starting and exiting processes are done."""
MIB = 1024**2
IDLE_CLOSE_S = 1.0
"""CORRAL_AGENT_IDLE_CLOSE_S of the workspaces measured with their agent closed for idleness (servers default to
60 s; the bench waits a shorter while)."""
TARGET_ABOVE_PLAIN_MIB = 5.0
"""The issue's target: an idle workspace costs at most this much host PSS above plain runsc."""


def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


async def settled_mem_available() -> int:
    """MemAvailable after a pause: the median of five reads a tenth of a second apart."""
    await asyncio.sleep(SETTLE_S)
    reads = []
    for _ in range(5):
        reads.append(mem_available())
        await asyncio.sleep(0.1)
    return int(statistics.median(reads))


def host_pss(container_ids: list[str]) -> dict[str, int]:
    """Bytes of PSS of each container's host processes: its containerd shim (found by ``-id <container id>`` on
    its command line) and all the shim's descendants."""
    children: dict[int, list[int]] = {}
    shims: dict[str, int] = {}
    wanted = set(container_ids)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # processes come and go while we look
            stat = (proc / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(proc.name))
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and b"-id" in argv:
                container = argv[argv.index(b"-id") + 1].decode()
                if container in wanted:
                    shims[container] = int(proc.name)
    result = {}
    for container, shim in shims.items():
        total, todo = 0, [shim]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        result[container] = total
    return result


@dataclass
class _Group:
    """What one kind of workspace costs: per-container samples and the machine-wide drop."""

    cgroup: Samples
    pss: Samples
    available_before: int
    drop_each: float


async def _idle_group(
    bench: Bench,
    n: int,
    create: Callable[[], Awaitable[str]],
    remove: Callable[[str], Awaitable[None]],
    container_of: Callable[[str], str],
    idle: Callable[[list[str]], Awaitable[None]] | None = None,
) -> _Group:
    """Create ``n`` idle workspaces, measure them, remove them. No warm-up round: the scenarios before this one
    created plenty of both kinds, so images and binaries are in the page cache.

    The MemAvailable drop is taken against the mean of before creating and after removing them all, which cancels
    a steady drift of everything else on the machine. ``idle`` runs on the handles once all are created, before
    anything is measured, and again (to time the next call, say) once measured."""
    engine = bench.plain.engine
    before = await settled_mem_available()
    created: list[str] = []
    try:
        for _ in range(n):
            created.append(await create())
        if idle is not None:
            await idle(created)
        during = await settled_mem_available()
        containers = [container_of(handle) for handle in created]
        usages = await asyncio.gather(*(memory_usage(engine, c) for c in containers))
        ids = [str((await engine.request("GET", f"/containers/{c}/json"))["Id"]) for c in containers]
        pss = host_pss(ids)
        if idle is not None:
            await idle(created)
    finally:
        while created:
            await remove(created.pop())
    after = await settled_mem_available()
    if len(pss) != len(ids):
        raise RuntimeError(f"found the containerd shim of {len(pss)} of {len(ids)} containers in /proc")
    return _Group(
        cgroup=Samples("MiB", [u / MIB for u in usages]),
        pss=Samples("MiB", [p / MIB for p in pss.values()]),
        available_before=before,
        drop_each=((before + after) / 2 - during) / n / MIB,
    )


def _drop(group: _Group) -> Measure:
    """The drop per workspace; one at or below zero means other work on the machine outweighed the signal."""
    text = f"{group.drop_each:.1f} MiB (noise)" if group.drop_each <= 0 else None
    return Measure.single(group.drop_each, "MiB", text=text)


async def idle_memory(bench: Bench) -> None:
    """N idle Corral workspaces (gVisor, agent up) against N plain runsc containers running ``sleep infinity``."""
    n = bench.config.idle
    runtime = bench.settings.gvisor_runtime
    gvisor = bench.gvisor

    async def corral_create() -> str:
        spec = bench.spec()
        await gvisor.create(spec)
        await gvisor.exec(spec.id, TRUE)  # the agent is up, as in a workspace that has been used
        return spec.id

    async def plain_create() -> str:
        return (await bench.plain.run(runtime)).name

    async def plain_remove(container: str) -> None:
        await bench.plain.engine.remove_container(container)

    after_close, agent_up = Samples(), Samples()
    waited = False

    async def idle_close(created: list[str]) -> None:
        """First: wait until every agent was closed for idleness. Then: time the next call (it starts an agent) and
        the one after it (agent up)."""
        nonlocal waited
        if not waited:
            waited = True
            await asyncio.sleep(2 * IDLE_CLOSE_S + SETTLE_S)
            return
        for workspace_id in created:
            with after_close.time():
                await gvisor.exec(workspace_id, TRUE)
            with agent_up.time():
                await gvisor.exec(workspace_id, TRUE)

    corral = await _idle_group(bench, n, corral_create, gvisor.destroy, container_name)
    gvisor.agent_idle_close_s = IDLE_CLOSE_S
    try:
        closed = await _idle_group(bench, n, corral_create, gvisor.destroy, container_name, idle_close)
    finally:
        gvisor.agent_idle_close_s = 0.0
    plain = await _idle_group(bench, n, plain_create, plain_remove, str)
    available = corral.available_before
    above = closed.pss.measure().p50 - plain.pss.measure().p50

    def fits(group: _Group) -> Measure:
        """MemAvailable over the larger (more cautious) of the two host-side figures per workspace."""
        each = max(group.pss.measure().p50, group.drop_each)
        return Measure.single(available / MIB / each, "")

    plain_label = f"runsc `sleep infinity`, no agent (N={n})"
    prefix = "idle gVisor workspace memory"
    bench.rows += [
        Row(f"{prefix}: cgroup (docker stats), agent up", corral.cgroup.measure(), plain.cgroup.measure(), plain_label),
        Row(f"{prefix}: host PSS of its processes, agent up", corral.pss.measure(), plain.pss.measure(), plain_label),
        Row(
            f"{prefix}: host PSS of its processes, agent closed (idle)",
            closed.pss.measure(),
            plain.pss.measure(),
            plain_label,
            Target(
                f"<= plain + {TARGET_ABOVE_PLAIN_MIB:g} MiB (p50)", above <= TARGET_ABOVE_PLAIN_MIB, f"+{above:.1f} MiB"
            ),
        ),
        Row(f"{prefix}: MemAvailable drop / N, agent up", _drop(corral), _drop(plain), plain_label),
        Row(f"{prefix}: MemAvailable drop / N, agent closed (idle)", _drop(closed), _drop(plain), plain_label),
        Row(
            "idle gVisor workspaces that fit in MemAvailable, agent up",
            fits(corral),
            fits(plain),
            plain_label,
            show_ratio=False,
        ),
        Row(
            "idle gVisor workspaces that fit in MemAvailable, agent closed (idle)",
            fits(closed),
            fits(plain),
            plain_label,
            show_ratio=False,
        ),
        Row(
            "exec `true` after the agent was closed (idle), gVisor, provider",
            after_close.measure(),
            agent_up.measure(),
            "the next exec `true` (agent up)",
        ),
    ]
    bench.notes.append(
        f"Memory: N={n} idle workspaces created one after another by GVisorProvider in the bench process (each ran "
        "one `true`, so its agent is up), against N plain runsc containers (`sleep infinity`, no agent). cgroup = "
        "usage minus inactive page cache, as `docker stats` shows it (under runsc it misses the host-side "
        "processes); host PSS = the containerd shim and all its descendants (runsc sandbox, gofer, ptrace stubs, "
        "and for Corral the `runsc exec` process that carries the agent's stream); MemAvailable drop = /proc/meminfo "
        "with all N running against the mean of before creating and after removing them "
        f"({SETTLE_S:g} s settle, median of 5 reads), divided by N, noisy when other work runs on the machine. Fit "
        f"= MemAvailable at the start of this step ({available / 1024**3:.1f} GiB) / the larger of host PSS p50 and "
        'the MemAvailable drop; memory limits (4G by default) are ceilings, not reservations. "Agent closed '
        f'(idle)": another N workspaces that each ran one `true` and then none for CORRAL_AGENT_IDLE_CLOSE_S '
        f"({IDLE_CLOSE_S:g} s here, 60 s by default), so their agent and its `runsc exec` ended; then each ran "
        "`true` twice: the first call starts a fresh agent, the second finds it up."
    )
