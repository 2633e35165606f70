"""What the E2B layer keeps beside the workspace service: per-sandbox extras, access tokens, timeouts, commands.

A sandbox *is* a Corral workspace: the sandbox id is the workspace id, ``running`` is ``ready`` and ``paused`` is
``paused`` (processes and memory kept) or ``stopped`` (a filesystem-only pause). What E2B knows and Corral does not
(template, E2B metadata, environment variables, the timeout, the lifecycle) is kept in the workspace's metadata
under ``"e2b"``, so it survives a restart and shows in Corral's own API.

Envd access tokens are not stored: each is an HMAC of the sandbox id under ``CORRAL_API_TOKEN``, so any server
process holding the token can check one, and rotating the API token revokes them all.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from corral.api.e2b._processes import ProcessRegistry
from corral.errors import CorralError
from corral.orchestrator.service import WorkspaceService
from corral.orchestrator.snapshots import SnapshotService
from corral.store import WorkspaceRecord

__all__ = ["DEFAULT_TIMEOUT_S", "E2BState", "SandboxExtras", "clamp_timeout"]

log = logging.getLogger(__name__)

METADATA_KEY = "e2b"
DEFAULT_TIMEOUT_S = 300
"""E2B's default sandbox lifetime (the v2 create API's default)."""
MAX_TIMEOUT_S = 24 * 3600
IDEMPOTENCY_TTL_S = 600.0


@dataclass(frozen=True, slots=True)
class SandboxExtras:
    """What a sandbox carries beyond its workspace record."""

    template: str
    metadata: dict[str, str] = field(default_factory=dict)
    envs: dict[str, str] = field(default_factory=dict)
    end_at: float | None = None
    """``time.time()`` at which the sandbox times out; None for workspaces created outside the E2B API."""
    auto_pause: bool = False
    """On timeout, pause instead of kill (destroy)."""
    auto_pause_memory: bool = True
    """An automatic pause keeps processes and memory; False makes it filesystem-only (a stop)."""
    auto_resume: bool = False
    """A request to a sandbox paused with its memory resumes it (E2B's ``autoResume``)."""
    started_at: float | None = None
    timeout_s: int = DEFAULT_TIMEOUT_S
    """The timeout the sandbox was created with; a resume without one (an auto-resume) restarts it, as on E2B."""
    allow_internet_access: bool = True

    def to_json(self) -> dict[str, Any]:
        """The value stored under ``metadata["e2b"]``."""
        return asdict(self)

    @classmethod
    def of(cls, record: WorkspaceRecord) -> SandboxExtras:
        """The extras of a workspace; defaults for one created through Corral's own API."""
        raw = record.metadata.get(METADATA_KEY)
        if isinstance(raw, Mapping) and isinstance(raw.get("template"), str):
            known = {f.name: raw[f.name] for f in fields(cls) if f.name in raw}
            with contextlib.suppress(TypeError, ValueError):
                return cls(**known)
        metadata = {str(k): v for k, v in record.metadata.items() if isinstance(v, str)}
        return cls(
            template=record.base_image,
            metadata=metadata,
            started_at=record.created_at.timestamp(),
            allow_internet_access=record.network == "default",
        )


class E2BState:
    """The E2B layer's state for one app: extras, tokens, the timeout sweeper and the command registry."""

    def __init__(
        self,
        service: WorkspaceService,
        api_token: str,
        *,
        snapshots: SnapshotService,
        sweep_interval_s: float = 1.0,
    ) -> None:
        self.service = service
        self.snapshots = snapshots
        self._key = api_token.encode()
        self.processes = ProcessRegistry()
        self.sweep_interval_s = sweep_interval_s
        self._envs: dict[str, dict[str, str]] = {}
        self._idempotency: dict[str, tuple[float, str]] = {}
        self._idempotency_locks: dict[str, asyncio.Lock] = {}
        self._lifecycle_locks: dict[str, asyncio.Lock] = {}
        self._sweeper: asyncio.Task[None] | None = None

    # --- tokens ---------------------------------------------------------------------------------------------------

    def access_token(self, sandbox_id: str) -> str:
        """The envd access token of a sandbox (``X-Access-Token``)."""
        digest = hmac.new(self._key, b"corral-e2b-envd:" + sandbox_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    def token_matches(self, sandbox_id: str, token: str) -> bool:
        """Constant-time check of an envd access token."""
        return hmac.compare_digest(self.access_token(sandbox_id).encode(), token.encode())

    def api_key_matches(self, key: str) -> bool:
        """Constant-time check of the API key (``CORRAL_API_TOKEN``)."""
        return hmac.compare_digest(self._key, key.encode())

    # --- extras ---------------------------------------------------------------------------------------------------

    async def save(self, record: WorkspaceRecord, extras: SandboxExtras) -> WorkspaceRecord:
        """Store new extras in the workspace's metadata."""
        self._envs[record.id] = dict(extras.envs)
        metadata = {**record.metadata, METADATA_KEY: extras.to_json()}
        return await self.service.set_metadata(record.id, metadata)

    async def set_timeout(self, record: WorkspaceRecord, timeout_s: int, *, only_extend: bool = False) -> None:
        """Make the sandbox time out ``timeout_s`` from now (with ``only_extend``, never sooner than before)."""
        extras = SandboxExtras.of(record)
        end_at = time.time() + clamp_timeout(timeout_s)
        if only_extend and extras.end_at is not None and extras.end_at >= end_at:
            return
        if only_extend and extras.end_at is None and record.metadata.get(METADATA_KEY) is None:
            return  # a workspace created through Corral's API has no E2B timeout; connecting gives it none
        await self.save(record, replace(extras, end_at=end_at))

    async def envs(self, sandbox_id: str) -> dict[str, str]:
        """The sandbox's environment variables (given at create), applied to every command."""
        envs = self._envs.get(sandbox_id)
        if envs is None:
            envs = dict(SandboxExtras.of(await self.service.get(sandbox_id)).envs)
            self._envs[sandbox_id] = envs
        return envs

    def forget(self, sandbox_id: str) -> None:
        """Drop cached values of a killed sandbox."""
        self._envs.pop(sandbox_id, None)
        self._lifecycle_locks.pop(sandbox_id, None)

    # --- pause and resume -------------------------------------------------------------------------------------------

    def lifecycle_lock(self, sandbox_id: str) -> asyncio.Lock:
        """Serialises pause, resume and connect of one sandbox, so two connects resume it once."""
        return self._lifecycle_locks.setdefault(sandbox_id, asyncio.Lock())

    async def pause(self, sandbox_id: str, *, memory: bool) -> WorkspaceRecord:
        """Pause a running sandbox: with ``memory``, its processes and memory are kept where the provider can (else
        its whole disk); without, it is stopped and a resume cold-boots it from its disk. Tracked commands end."""
        await self.processes.forget(sandbox_id)
        if memory:
            record, _ = await self.service.pause(sandbox_id)
            return record
        return await self.service.stop(sandbox_id)

    async def wake(self, sandbox_id: str, timeout_s: int | None, *, memory: bool = True) -> WorkspaceRecord:
        """Resume a paused sandbox (call it holding :meth:`lifecycle_lock`) and restart its timeout: ``timeout_s``
        from now, or the timeout it was created with. Without ``memory`` a sandbox paused with its memory cold-boots
        from its disk instead (E2B's ``memory: false``): the memory is dropped, never restored."""
        record = await self.service.get(sandbox_id)
        if record.status == "paused" and not memory:
            await self.service.stop(sandbox_id)
        record = await self.service.resume(sandbox_id)
        await self.set_timeout(record, timeout_s if timeout_s is not None else SandboxExtras.of(record).timeout_s)
        return await self.service.get(sandbox_id)

    async def auto_resume(self, sandbox_id: str) -> bool:
        """Resume a sandbox created with ``autoResume`` that is paused with its memory, because a request reached it
        (E2B resumes such a sandbox on traffic; a filesystem-only pause needs an explicit connect). True if it is
        running now."""
        async with self.lifecycle_lock(sandbox_id):
            try:
                record = await self.service.get(sandbox_id)
            except CorralError:
                return False
            if record.status == "ready":
                return True
            if record.status != "paused" or record.pool_key is not None or not SandboxExtras.of(record).auto_resume:
                return False
            log.info("e2b: sandbox %s got a request while paused; resuming it (autoResume)", sandbox_id)
            await self.wake(sandbox_id, None)
            return True

    # --- idempotent create ------------------------------------------------------------------------------------------

    def idempotency_lock(self, key: str) -> asyncio.Lock:
        """Serialises creates that carry the same ``Idempotency-Key``."""
        return self._idempotency_locks.setdefault(key, asyncio.Lock())

    def remembered(self, key: str) -> str | None:
        """The sandbox a create with this ``Idempotency-Key`` made in the last ten minutes."""
        now = time.monotonic()
        for stale in [k for k, (at, _) in self._idempotency.items() if now - at > IDEMPOTENCY_TTL_S]:
            self._idempotency.pop(stale, None)
            self._idempotency_locks.pop(stale, None)
        entry = self._idempotency.get(key)
        return None if entry is None else entry[1]

    def remember(self, key: str, sandbox_id: str) -> None:
        """Record which sandbox a create with this ``Idempotency-Key`` made."""
        self._idempotency[key] = (time.monotonic(), sandbox_id)

    # --- the timeout sweeper ----------------------------------------------------------------------------------------

    async def sweep(self) -> list[str]:
        """Kill (or pause, with ``autoPause``) every running sandbox past its timeout; returns their ids."""
        now = time.time()
        expired = []
        for record in await self.service.store.workspaces.list(status="ready"):
            if record.metadata.get(METADATA_KEY) is None or record.pool_key is not None:
                continue
            extras = SandboxExtras.of(record)
            if extras.end_at is None or extras.end_at > now:
                continue
            try:
                if extras.auto_pause:
                    log.info("e2b: sandbox %s reached its timeout; pausing it", record.id)
                    async with self.lifecycle_lock(record.id):
                        await self.pause(record.id, memory=extras.auto_pause_memory)
                else:
                    await self.processes.forget(record.id)
                    log.info("e2b: sandbox %s reached its timeout; killing it", record.id)
                    await self.service.destroy(record.id)
                    self.forget(record.id)
            except CorralError as exc:
                log.warning("e2b: could not end sandbox %s after its timeout: %s", record.id, exc.message)
                continue
            expired.append(record.id)
        return expired

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("e2b: timeout sweep failed")

    def start(self) -> None:
        """Start the timeout sweeper."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="e2b-timeout-sweeper")

    async def aclose(self) -> None:
        """Stop the sweeper and every tracked command."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await self.processes.aclose()


def clamp_timeout(timeout_s: int) -> int:
    """A sandbox timeout between 1 s and 24 h."""
    return max(1, min(int(timeout_s), MAX_TIMEOUT_S))
