"""The ``firecracker`` provider, for now only its honest half: it knows whether microVMs can run on this host.

``health`` and ``capabilities`` report the real answer of :func:`corral.microvm.readiness.probe`; ``create``
refuses with that reason (it begins "KVM not available", the phrase seed 004 asks for, so the orchestrator falls
back to the next provider). Even on a host where the probe passes, ``create`` refuses: the microVM manager arrives
in issue [5/7], and until then no Firecracker workspace can exist, so every workspace call says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import TYPE_CHECKING

from corral.errors import ProviderUnavailableError, SandboxNotFoundError
from corral.microvm.readiness import Readiness, ReadinessConfig, probe
from corral.providers.base import (
    WORKSPACE_ROOT,
    Capabilities,
    ExecEvent,
    ExecRequest,
    ExecResult,
    FileInfo,
    Health,
    SandboxState,
    WorkspaceSpec,
)

if TYPE_CHECKING:
    from corral.settings import Settings

__all__ = ["FirecrackerProvider", "from_settings"]

READINESS_CACHE_S = 10.0
"""How long one probe answer is reused, so ``health`` stays fast."""

NOT_IMPLEMENTED_REASON = "the microVM manager is not implemented yet (issue [5/7])"


def _missing(workspace_id: str) -> SandboxNotFoundError:
    return SandboxNotFoundError(f"workspace {workspace_id} does not exist", details={"workspace_id": workspace_id})


class FirecrackerProvider:
    """Firecracker microVMs: real readiness reporting; workspace operations wait for the microVM manager."""

    name = "firecracker"

    def __init__(
        self,
        config: ReadinessConfig,
        *,
        probe: Callable[[ReadinessConfig], Readiness] = probe,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._probe = probe
        self._clock = clock
        self._cached: Readiness | None = None
        self._cached_at = float("-inf")
        self._lock = asyncio.Lock()

    async def readiness(self) -> Readiness:
        """The probe's answer, computed at most once every :data:`READINESS_CACHE_S` seconds."""
        async with self._lock:
            if self._cached is None or self._clock() - self._cached_at >= READINESS_CACHE_S:
                # The probe may run `firecracker --version` (up to 5 s), so it stays off the event loop.
                self._cached = await asyncio.to_thread(self._probe, self.config)
                self._cached_at = self._clock()
            return self._cached

    # --- lifecycle ----------------------------------------------------------------------------------------------

    async def create(self, spec: WorkspaceSpec) -> None:
        """Refuse: with the probe's reason when the host cannot run microVMs, else because the manager is missing."""
        readiness = await self.readiness()
        details = {"workspace_id": spec.id, "checks": {c.name: c.ok for c in readiness.checks}}
        if not readiness.usable:
            raise ProviderUnavailableError(self.name, readiness.reason, details=details)
        raise ProviderUnavailableError(self.name, NOT_IMPLEMENTED_REASON, details=details)

    async def destroy(self, workspace_id: str) -> None:
        """Nothing to remove: no Firecracker workspace can exist yet (idempotent, as the contract asks)."""
        del workspace_id

    async def stop(self, workspace_id: str) -> None:
        """No such workspace."""
        raise _missing(workspace_id)

    async def resume(self, workspace_id: str) -> None:
        """No such workspace."""
        raise _missing(workspace_id)

    async def state(self, workspace_id: str) -> SandboxState:
        """Always missing: this provider holds no runtime objects yet."""
        del workspace_id
        return SandboxState.MISSING

    async def list_workspaces(self) -> list[str]:
        """None yet."""
        return []

    # --- exec ---------------------------------------------------------------------------------------------------

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """No such workspace."""
        del request
        raise _missing(workspace_id)

    def exec_stream(self, workspace_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        """No such workspace: raised at once, before any iteration."""
        del request
        raise _missing(workspace_id)

    # --- files --------------------------------------------------------------------------------------------------

    async def read_file(self, workspace_id: str, path: str) -> AsyncIterator[bytes]:
        """No such workspace."""
        del path
        raise _missing(workspace_id)

    async def write_file(
        self, workspace_id: str, path: str, data: bytes | AsyncIterable[bytes], *, mode: int | None = None
    ) -> int:
        """No such workspace."""
        del path, data, mode
        raise _missing(workspace_id)

    async def list_dir(self, workspace_id: str, path: str) -> list[FileInfo]:
        """No such workspace."""
        del path
        raise _missing(workspace_id)

    async def delete(self, workspace_id: str, path: str, *, recursive: bool = False) -> None:
        """No such workspace."""
        del path, recursive
        raise _missing(workspace_id)

    async def move(self, workspace_id: str, src: str, dst: str) -> None:
        """No such workspace."""
        del src, dst
        raise _missing(workspace_id)

    async def chmod(self, workspace_id: str, path: str, mode: int) -> None:
        """No such workspace."""
        del path, mode
        raise _missing(workspace_id)

    async def stat(self, workspace_id: str, path: str) -> FileInfo:
        """No such workspace."""
        del path
        raise _missing(workspace_id)

    async def glob(
        self, workspace_id: str, pattern: str, *, root: str = WORKSPACE_ROOT, limit: int = 10_000
    ) -> list[str]:
        """No such workspace."""
        del pattern, root, limit
        raise _missing(workspace_id)

    async def realpath(self, workspace_id: str, path: str) -> str:
        """No such workspace."""
        del path
        raise _missing(workspace_id)

    # --- health -------------------------------------------------------------------------------------------------

    async def health(self) -> Health:
        """Healthy only when every readiness check passes; the error is the probe's one-sentence reason."""
        started = time.perf_counter()
        readiness = await self.readiness()
        return Health(
            healthy=readiness.usable,
            error=None if readiness.usable else readiness.reason,
            latency_ms=(time.perf_counter() - started) * 1000,
            details={
                check.name: {"ok": check.ok, "detail": check.detail, "skipped": check.skipped}
                for check in readiness.checks
            },
        )

    async def capabilities(self) -> Capabilities:
        """What Firecracker workspaces will offer, and whether this host's KVM can serve them."""
        readiness = await self.readiness()
        return Capabilities(
            isolation="microvm",
            persistence=True,
            snapshots=True,
            warm_pool=True,
            streaming=True,
            disk_limit="enforced",
            requirements=("kvm", "firecracker"),
            startup_latency_ms=125.0,
            resources={"kvm_usable": readiness.usable, "reason": readiness.reason},
        )

    async def aclose(self) -> None:
        """Nothing to release."""


def from_settings(settings: Settings) -> FirecrackerProvider:
    """Build the provider from ``CORRAL_FIRECRACKER_BIN``, ``_KERNEL`` and ``_ROOTFS``."""
    return FirecrackerProvider(
        ReadinessConfig(
            firecracker_bin=settings.firecracker_bin,
            kernel_path=settings.firecracker_kernel,
            rootfs_path=settings.firecracker_rootfs,
        )
    )
