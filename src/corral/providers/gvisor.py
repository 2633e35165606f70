"""The ``gvisor`` provider: the docker provider's containers, run by gVisor's ``runsc`` (a user-space kernel).

Two dockerd runtimes are used, both registered by ``make bootstrap`` (the README's "Two commands"):

* ``runsc`` with ``--network=none`` for ``isolated`` workspaces (the default): no network stack at all;
* ``runsc-net`` with ``--network=host`` for ``default`` workspaces. "host" here is the container's own network
  namespace that Docker created, so the sandbox gets its own eth0, not the host's interfaces. (runsc cannot join
  Docker's bridge from the root network namespace on kernels like the CI machines'.)

Both run gVisor 20240729 (``make bootstrap`` installs it from bookworm-backports) with ``--platform=ptrace`` (its
default, systrap, spawns processes 2.6x slower on these hosts; KVM hangs on PVM hosts) and ``--overlay2=none`` (root
filesystem writes go to the container's own layer, so a stop keeps them and ``docker commit`` sees them). gVisor
checkpoints processes and memory, so pause keeps memory and snapshots and forks carry running processes.
"""

from __future__ import annotations

import time
from pathlib import Path

from corral.errors import ProviderUnavailableError
from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.providers.base import NetworkMode, WorkspaceSpec
from corral.providers.docker import (
    DEFAULT_AGENT_IMAGE,
    DEFAULT_AGENT_RUNTIME_DIR,
    DEFAULT_SNAPSHOT_DIR,
    DockerProvider,
)

__all__ = ["GVisorProvider"]

_RUNTIME_CACHE_S = 10.0


class GVisorProvider(DockerProvider):
    """Docker containers under runsc; same layout, limits and hardening as :class:`DockerProvider`."""

    name = "gvisor"
    isolation = "gvisor"
    default_startup_ms = 350.0
    memory_checkpoints = True

    def __init__(
        self,
        engine: DockerEngine,
        *,
        runtime: str = "runsc",
        net_runtime: str = "runsc-net",
        pids_limit: int = 1024,
        output_limit: int = 16 * 1024 * 1024,
        owner: str | None = None,
        agent_image: str = DEFAULT_AGENT_IMAGE,
        agent_runtime_dir: Path = DEFAULT_AGENT_RUNTIME_DIR,
        snapshot_dir: Path = DEFAULT_SNAPSHOT_DIR,
    ) -> None:
        super().__init__(
            engine,
            pids_limit=pids_limit,
            output_limit=output_limit,
            owner=owner,
            agent_image=agent_image,
            agent_runtime_dir=agent_runtime_dir,
            snapshot_dir=snapshot_dir,
        )
        self.runtime = runtime
        self.net_runtime = net_runtime
        self._runtimes_checked_at = float("-inf")

    def runtime_for(self, network: NetworkMode) -> str:
        """runsc without a network for isolated workspaces, runsc-net for networked ones."""
        return self.runtime if network == "isolated" else self.net_runtime

    def keeps_memory(self, network: NetworkMode) -> bool:
        """Only isolated workspaces: networked ones run with ``--network=host`` (the sandbox's sockets are the host
        kernel's, in the container's namespace), and runsc cannot checkpoint host sockets ("checkpoint not supported
        when using hostinet"). Their pause and snapshots keep the whole disk, and they start cold."""
        return network == "isolated"

    async def check_runtime(self) -> None:
        """Both runtimes must be registered with dockerd (the answer is cached for a few seconds)."""
        if time.monotonic() - self._runtimes_checked_at < _RUNTIME_CACHE_S:
            return
        try:
            info = await self.engine.info()
        except DockerAPIError as exc:
            raise ProviderUnavailableError(self.name, exc.message) from exc
        registered = set(info.get("Runtimes") or {})
        missing = [r for r in (self.runtime, self.net_runtime) if r not in registered]
        if missing:
            raise ProviderUnavailableError(
                self.name,
                f"gVisor runtime not available: dockerd has no runtime named {', '.join(missing)} "
                f"(registered: {', '.join(sorted(registered))}); run `make bootstrap` to register runsc",
            )
        self._runtimes_checked_at = time.monotonic()

    def on_create(self, spec: WorkspaceSpec) -> None:
        """gVisor is the intended isolation; nothing to warn about."""
        del spec

    def requirements(self) -> tuple[str, ...]:
        """Docker with runsc registered."""
        return ("docker", "runsc")
