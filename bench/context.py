"""What every scenario shares: the settings, Corral's providers in this process, the plain alternative, the servers,
the rows and notes collected so far, and the clean-up of everything the run created."""

from __future__ import annotations

import contextlib
import logging
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.plain import BENCH_LABEL, PlainDocker
from bench.report import Row
from bench.server import CorralServer
from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.providers.base import ResourceLimits, WorkspaceSpec
from corral.providers.docker import LABEL_OWNER, DockerProvider
from corral.providers.gvisor import GVisorProvider
from corral.settings import Settings

__all__ = ["FULL", "QUICK", "Bench", "Config"]

log = logging.getLogger("bench")


@dataclass(frozen=True, slots=True)
class Config:
    """How much to measure. ``--quick`` shrinks every count; the shapes stay the same."""

    quick: bool
    execs: int
    """Exec round trips per variant."""
    creates: int
    """Creates (and session starts) per variant."""
    files: int
    """10 MB write + read round trips per variant."""
    burst: int
    """Sessions started at once."""
    burst_pool: int
    """CORRAL_WARM_POOL_SIZE of the server the burst goes to (0: every session is a cold start)."""
    idle: int
    """Idle workspaces created for the memory measurement."""
    cycles: int = 20
    """Pause/resume cycles per variant (idle, holding memory; Corral and raw)."""
    fork_rounds: int = 3
    """Rounds of fork x``forks`` and of snapshot create, Corral and raw."""
    setup_s: float = 30.0
    """Setup time (``sleep``) of the agent type whose sessions start from a setup snapshot."""
    later_sessions: int = 5
    """Sessions started from that snapshot after the first one set up."""
    forks: int = 10
    held_mib: int = 100
    """Live memory held by the workspace (and the plain container) of the memory variants."""
    warm_pool: int = 3
    """Pool size of the warm server: a claim takes the oldest, whose agent has long been up."""
    file_bytes: int = 10_000_000
    tool_calls: int = 100
    """Rounds of the tools scenario (each runs every tool-call way once)."""


FULL = Config(quick=False, execs=200, creates=30, files=30, burst=50, burst_pool=0, idle=10)
"""The issue's counts: 200 execs, 30 creates, 50 sessions at once, 10 idle workspaces, 20 pause cycles, 3 fork
rounds, a 30 s setup."""

QUICK = Config(
    quick=True,
    execs=50,
    creates=8,
    files=2,
    burst=10,
    burst_pool=0,
    idle=4,
    cycles=5,
    fork_rounds=1,
    setup_s=3.0,
    later_sessions=3,
    tool_calls=15,
)
"""A smoke-sized run: the same shapes with smaller counts (and a 3 s setup)."""


class Bench:
    """The run's shared state. Use as ``async with Bench(...) as bench``: everything it created is removed on exit,
    including after a failure or Ctrl-C."""

    def __init__(self, config: Config, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.settings = Settings()
        self.run_id = secrets.token_hex(4)
        self.owner = f"bench-{self.run_id}"
        socket_path = self.settings.docker_host.removeprefix("unix://")
        self.image = self.settings.base_image
        self.limits = ResourceLimits.parse(
            {
                "cpu": self.settings.default_cpu,
                "memory": self.settings.default_memory,
                "disk": self.settings.default_disk,
            }
        )
        self.gvisor = GVisorProvider(
            DockerEngine(socket_path),
            runtime=self.settings.gvisor_runtime,
            net_runtime=self.settings.gvisor_net_runtime,
            pids_limit=self.settings.pids_limit,
            owner=self.owner,
        )
        self.runc = DockerProvider(DockerEngine(socket_path), pids_limit=self.settings.pids_limit, owner=self.owner)
        self.plain = PlainDocker(socket_path, image=self.image, run_id=self.run_id)
        self.servers: list[CorralServer] = []
        self._owners: set[str] = {self.owner}
        self.rows: list[Row] = []
        self.notes: list[str] = []

    async def __aenter__(self) -> Bench:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def spec(self) -> WorkspaceSpec:
        """A new workspace of the server's default shape (image, limits, isolated network)."""
        return WorkspaceSpec(id=uuid.uuid4().hex[:16], image=self.image, limits=self.limits)

    async def start_server(self, name: str, env: dict[str, str]) -> CorralServer:
        """A ``corral serve`` subprocess with these overrides, stopped by :meth:`stop_server` or at exit."""
        server = CorralServer(name, self.workdir / name, env)
        self.servers.append(server)
        self._owners.add(server.owner)
        try:
            await server.start()
        except BaseException:
            await self.stop_server(server)
            raise
        return server

    def track_owner(self, owner: str) -> None:
        """Have the final sweep also remove what runtime objects labelled ``corral.owner=owner`` are left."""
        self._owners.add(owner)

    async def stop_server(self, server: CorralServer) -> None:
        """Stop it and remove whatever it left behind."""
        if server in self.servers:
            self.servers.remove(server)
        await server.stop()
        await self.sweep(f"{LABEL_OWNER}={server.owner}")

    async def sweep(self, *labels: str) -> int:
        """Remove every container, volume and image carrying one of ``labels`` (``key=value``); returns how many."""
        removed = 0
        engine = self.plain.engine
        for label in labels:
            for container in await engine.list_containers([label]):
                await engine.remove_container(container["Id"])
                removed += 1
            for volume in await engine.list_volumes([label]):
                await engine.remove_volume(volume["Name"])
                removed += 1
            for image in await engine.list_images([label]):  # snapshot images, committed plain containers
                await engine.remove_image(image["Id"], force=True)
                removed += 1
        return removed

    async def aclose(self) -> None:
        """Stop the servers, then sweep this run's labels: Corral's in-process workspaces, the servers' and the
        plain containers. Every step runs even when an earlier one fails."""
        for server in list(self.servers):
            try:
                await self.stop_server(server)
            except Exception as exc:  # keep cleaning up; the sweep below catches what is left
                log.warning("stopping %s failed: %s", server.name, exc)
        for provider in (self.gvisor, self.runc):
            with contextlib.suppress(Exception):
                await provider.aclose()
        try:
            leftovers = await self.sweep(
                f"{BENCH_LABEL}={self.run_id}", *(f"{LABEL_OWNER}={owner}" for owner in sorted(self._owners))
            )
            if leftovers:
                log.info("removed %d leftover container(s)/volume(s)/image(s)", leftovers)
        except DockerAPIError as exc:
            log.warning("final clean-up sweep failed: %s; remove containers labelled %s", exc, BENCH_LABEL)
        finally:
            await self.plain.aclose()
