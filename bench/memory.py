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
from bench.report import Row
from bench.stats import Measure, Samples
from corral.providers.docker import container_name

__all__ = ["idle_memory"]

SETTLE_S = 1.0
"""Pause before reading MemAvailable, so starting and exiting processes are done."""
MIB = 1024**2


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
) -> _Group:
    """Create ``n`` idle workspaces, measure them, remove them. No warm-up round: the scenarios before this one
    created plenty of both kinds, so images and binaries are in the page cache.

    The MemAvailable drop is taken against the mean of before creating and after removing them all, which cancels
    a steady drift of everything else on the machine."""
    engine = bench.plain.engine
    before = await settled_mem_available()
    created: list[str] = []
    try:
        for _ in range(n):
            created.append(await create())
        during = await settled_mem_available()
        containers = [container_of(handle) for handle in created]
        usages = await asyncio.gather(*(memory_usage(engine, c) for c in containers))
        ids = [str((await engine.request("GET", f"/containers/{c}/json"))["Id"]) for c in containers]
        pss = host_pss(ids)
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

    corral = await _idle_group(bench, n, corral_create, gvisor.destroy, container_name)
    plain = await _idle_group(bench, n, plain_create, plain_remove, str)
    available = corral.available_before

    def fits(group: _Group) -> Measure:
        """MemAvailable over the larger (more cautious) of the two host-side figures per workspace."""
        each = max(group.pss.measure().p50, group.drop_each)
        return Measure.single(available / MIB / each, "")

    plain_label = f"runsc `sleep infinity`, no agent (N={n})"
    bench.rows += [
        Row(
            "idle gVisor workspace memory: cgroup (docker stats)",
            corral.cgroup.measure(),
            plain.cgroup.measure(),
            plain_label,
        ),
        Row(
            "idle gVisor workspace memory: host PSS of its processes",
            corral.pss.measure(),
            plain.pss.measure(),
            plain_label,
        ),
        Row("idle gVisor workspace memory: MemAvailable drop / N", _drop(corral), _drop(plain), plain_label),
        Row(
            "idle gVisor workspaces that fit in MemAvailable", fits(corral), fits(plain), plain_label, show_ratio=False
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
        "the MemAvailable drop; memory limits (4G by default) are ceilings, not reservations."
    )
