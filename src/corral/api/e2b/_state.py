"""What the E2B layer keeps beside the workspace service: per-sandbox extras, access tokens, deadlines, commands.

A sandbox *is* a Corral workspace: the sandbox id is the workspace id, ``running`` is ``ready`` and ``paused`` is
``paused`` (processes and memory kept) or ``stopped`` (a filesystem-only pause). What E2B knows and Corral does not
(template, E2B metadata, environment variables, the timeout, the lifecycle) is kept in the workspace's metadata
under ``"e2b"``, so it survives a restart and shows in Corral's own API.

Envd access tokens are not stored: each is an HMAC of the sandbox id under ``CORRAL_API_TOKEN``, so any server
process holding the token can check one, and rotating the API token revokes them all.

Timeouts are enforced on time. Every running sandbox with a deadline has a timer set for that moment (set again
whenever ``set_timeout``, ``connect`` or a resume moves it); when it fires the sandbox is killed, or paused with
``onTimeout: pause``. From the deadline on the sandbox is refused, as E2B refuses a sandbox that is being killed or
paused: envd answers "was not found" (``/health`` included) and the control plane shows it gone (or paused) while
the kill or pause is still under way. A kill through the API is refused the same way from the moment it is asked
for, before its commands end, so the SDK's health probe after a broken command stream sees the sandbox gone. A
slow reconciler (every few seconds) sets the timers of sandboxes this process has not seen yet (after a restart)
and retries a kill or pause that failed.
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
from datetime import UTC, datetime
from typing import Any, Literal

from corral.api.e2b._processes import ProcessRegistry
from corral.api.e2b._watches import WatchRegistry
from corral.errors import CorralError, WorkspaceDestroyedError, WorkspaceNotFoundError, WorkspaceStateError
from corral.orchestrator.service import WorkspaceService
from corral.orchestrator.snapshots import SnapshotService
from corral.store import WorkspaceRecord

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_TIMEOUT_S",
    "E2BState",
    "SandboxExtras",
    "Transition",
    "auto_resume_timeout",
    "clamp_timeout",
]

log = logging.getLogger(__name__)

METADATA_KEY = "e2b"
DEFAULT_TIMEOUT_S = 300
"""E2B's default sandbox lifetime (the v2 create and connect APIs' default)."""
MAX_TIMEOUT_S = 24 * 3600
"""The longest a sandbox may run from its start (E2B's ``maxLengthHours`` of 24 h)."""
MIN_AUTO_RESUME_TIMEOUT_S = 60
"""An automatic resume runs the sandbox at least this long (E2B's anti-thrash floor)."""
IDEMPOTENCY_TTL_S = 600.0
_GONE = (WorkspaceNotFoundError, WorkspaceDestroyedError, WorkspaceStateError)


@dataclass(frozen=True, slots=True)
class SandboxExtras:
    """What a sandbox carries beyond its workspace record."""

    template: str
    metadata: dict[str, str] = field(default_factory=dict)
    envs: dict[str, str] = field(default_factory=dict)
    end_at: float | None = None
    """``time.time()`` at which a running sandbox times out, or at which a paused one was paused (E2B's ``endAt``);
    None for workspaces created outside the E2B API."""
    auto_pause: bool = False
    """On timeout, pause instead of kill (destroy)."""
    auto_pause_memory: bool = True
    """An automatic pause keeps processes and memory; False makes it filesystem-only (a stop)."""
    auto_resume: bool = False
    """A request to a sandbox paused with its memory resumes it (E2B's ``autoResume``)."""
    started_at: float | None = None
    timeout_s: int = DEFAULT_TIMEOUT_S
    """The timeout the sandbox was created with; an automatic resume runs it that long again, as on E2B."""
    allow_internet_access: bool = True
    allow_public_traffic: bool = True
    """False: requests to the sandbox's ports (preview hosts) need its traffic access token (E2B's
    ``network.allowPublicTraffic``)."""

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


@dataclass(frozen=True, slots=True)
class Transition:
    """A sandbox on its way out of ``running``: E2B's ``killing`` or ``pausing``, with why and since when."""

    action: Literal["kill", "pause"]
    reason: Literal["api", "timeout"]
    started_at: float

    def message(self, sandbox_id: str) -> str:
        """E2B's words for it, e.g. ``Sandbox "x" is being paused (started at ... due to timeout expiration)``."""
        at = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        why = "via API request" if self.reason == "api" else "due to timeout expiration"
        verb = "killed" if self.action == "kill" else "paused"
        return f'Sandbox "{sandbox_id}" is being {verb} (started at {at} {why})'


@dataclass(frozen=True, slots=True)
class _Deadline:
    end_at: float
    pause: bool
    """What happens then: pause (``onTimeout: pause``), else kill."""


class E2BState:
    """The E2B layer's state for one app: extras, tokens, deadlines and their timers, and the command registry."""

    def __init__(
        self,
        service: WorkspaceService,
        api_token: str,
        *,
        snapshots: SnapshotService,
        reconcile_interval_s: float = 5.0,
    ) -> None:
        self.service = service
        self.snapshots = snapshots
        self._key = api_token.encode()
        self.processes = ProcessRegistry()
        self.watches = WatchRegistry()
        self.reconcile_interval_s = reconcile_interval_s
        self._envs: dict[str, dict[str, str]] = {}
        self._idempotency: dict[str, tuple[float, str]] = {}
        self._idempotency_locks: dict[str, asyncio.Lock] = {}
        self._lifecycle_locks: dict[str, asyncio.Lock] = {}
        self._deadlines: dict[str, _Deadline] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._transitions: dict[str, Transition] = {}
        self._expiring: dict[str, asyncio.Task[None]] = {}
        self._reconciler: asyncio.Task[None] | None = None

    # --- tokens ---------------------------------------------------------------------------------------------------

    def access_token(self, sandbox_id: str) -> str:
        """The envd access token of a sandbox (``X-Access-Token``)."""
        digest = hmac.new(self._key, b"corral-e2b-envd:" + sandbox_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    def traffic_token(self, sandbox_id: str) -> str:
        """The traffic access token of a sandbox (``e2b-traffic-access-token``), derived as the envd token is."""
        digest = hmac.new(self._key, b"corral-e2b-traffic:" + sandbox_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    def token_matches(self, sandbox_id: str, token: str) -> bool:
        """Constant-time check of an envd access token."""
        return hmac.compare_digest(self.access_token(sandbox_id).encode(), token.encode())

    def api_key_matches(self, key: str) -> bool:
        """Constant-time check of the API key (``CORRAL_API_TOKEN``)."""
        return hmac.compare_digest(self._key, key.encode())

    # --- extras ---------------------------------------------------------------------------------------------------

    async def save(self, record: WorkspaceRecord, extras: SandboxExtras) -> WorkspaceRecord:
        """Store new extras in the workspace's metadata; a running sandbox's timer follows its ``end_at``."""
        self._envs[record.id] = dict(extras.envs)
        # Read again: another request (update_network, a fork) may have changed the metadata since ``record``.
        current = await self.service.get(record.id)
        metadata = {**current.metadata, METADATA_KEY: extras.to_json()}
        saved = await self.service.set_metadata(record.id, metadata)
        if saved.status == "ready" and saved.pool_key is None and extras.end_at is not None:
            self._arm(saved.id, extras)
        else:
            self._disarm(saved.id)
        return saved

    async def set_timeout(
        self, record: WorkspaceRecord, timeout_s: int, *, only_extend: bool = False
    ) -> WorkspaceRecord:
        """Make the sandbox time out ``timeout_s`` from now, but no later than 24 h after it started (E2B's
        maximum length); with ``only_extend``, never sooner than before. Returns the record as saved."""
        extras = SandboxExtras.of(record)
        now = time.time()
        started = extras.started_at if extras.started_at is not None else now
        end_at = now + max(0.0, min(float(timeout_s), started + MAX_TIMEOUT_S - now))
        if only_extend and extras.end_at is not None and extras.end_at >= end_at:
            return record
        if only_extend and record.metadata.get(METADATA_KEY) is None:
            return record  # a workspace created through Corral's API has no E2B timeout; connecting gives it none
        return await self.save(record, replace(extras, end_at=end_at))

    async def envs(self, sandbox_id: str) -> dict[str, str]:
        """The sandbox's environment variables (given at create), applied to every command."""
        envs = self._envs.get(sandbox_id)
        if envs is None:
            envs = dict(SandboxExtras.of(await self.service.get(sandbox_id)).envs)
            self._envs[sandbox_id] = envs
        return envs

    def forget(self, sandbox_id: str) -> None:
        """Drop everything kept about a killed sandbox."""
        self._envs.pop(sandbox_id, None)
        self._lifecycle_locks.pop(sandbox_id, None)
        self._disarm(sandbox_id)

    # --- where a sandbox stands -------------------------------------------------------------------------------------

    def transition(self, sandbox_id: str) -> Transition | None:
        """The kill or pause the sandbox is going through: one asked for, or the one its deadline calls for once
        the deadline has passed (even before its timer has run). None for a sandbox that may take requests."""
        current = self._transitions.get(sandbox_id)
        if current is not None:
            return current
        deadline = self._deadlines.get(sandbox_id)
        if deadline is not None and deadline.end_at <= time.time():
            return Transition("pause" if deadline.pause else "kill", "timeout", deadline.end_at)
        return None

    async def admit(self, sandbox_id: str) -> bool:
        """Whether a request to the sandbox's envd is served: it runs and has not reached its deadline, or it was
        paused with ``autoResume`` and this request resumed it. False means "the sandbox was not found"."""
        if self.transition(sandbox_id) is None:
            try:
                await self.service.ensure_ready(sandbox_id)
            except _GONE:
                pass
            else:
                if self.transition(sandbox_id) is None:  # ensure_ready may have waited out a lifecycle change
                    return True
        return await self.auto_resume(sandbox_id)

    # --- kill, pause and resume -------------------------------------------------------------------------------------

    def lifecycle_lock(self, sandbox_id: str) -> asyncio.Lock:
        """Serialises kill, pause, resume, connect and the timeout of one sandbox, so two connects resume it once."""
        return self._lifecycle_locks.setdefault(sandbox_id, asyncio.Lock())

    async def kill(self, sandbox_id: str) -> None:
        """Kill the sandbox (destroy its workspace). It is refused from this moment on, before its commands end."""
        transition = Transition("kill", "api", time.time())
        self._transitions[sandbox_id] = transition
        try:
            async with self.lifecycle_lock(sandbox_id):
                await self._destroy(sandbox_id, transition)
        finally:
            self._end(sandbox_id, transition)

    async def _destroy(self, sandbox_id: str, transition: Transition) -> None:
        self._transitions[sandbox_id] = transition
        self._disarm(sandbox_id)
        try:
            await self.processes.forget(sandbox_id)  # command streams end; the health probe already says "gone"
            await self.watches.forget(sandbox_id)
            await self.service.destroy(sandbox_id)
        finally:
            self._end(sandbox_id, transition)  # the record says destroyed now (or the kill failed: it is reported)
        self.forget(sandbox_id)

    async def pause(
        self, sandbox_id: str, *, memory: bool, reason: Literal["api", "timeout"] = "api", since: float | None = None
    ) -> WorkspaceRecord:
        """Pause a running sandbox (call it holding :meth:`lifecycle_lock`): with ``memory``, its processes and
        memory are kept where the provider can (else its whole disk); without, it is stopped and a resume cold-boots
        it from its disk. Tracked commands end. It is refused while the pause runs, as E2B's ``pausing``."""
        transition = Transition("pause", reason, since if since is not None else time.time())
        self._transitions[sandbox_id] = transition
        try:
            await self.processes.forget(sandbox_id)
            await self.watches.forget(sandbox_id)
            if memory:
                record, _ = await self.service.pause(sandbox_id)
            else:
                record = await self.service.stop(sandbox_id)
            self._disarm(sandbox_id)
            if record.metadata.get(METADATA_KEY) is not None:  # E2B's endAt of a paused sandbox: when it paused
                record = await self.save(record, replace(SandboxExtras.of(record), end_at=time.time()))
        finally:
            self._end(sandbox_id, transition)
        return record

    async def wake(self, sandbox_id: str, timeout_s: int, *, memory: bool = True) -> WorkspaceRecord:
        """Resume a paused sandbox (call it holding :meth:`lifecycle_lock`); it runs ``timeout_s`` from now, and its
        start (and so its 24 h maximum) counts from now, as a resumed E2B sandbox's. Without ``memory`` a sandbox
        paused with its memory cold-boots from its disk instead (E2B's ``memory: false``): the memory is dropped,
        never restored."""
        record = await self.service.get(sandbox_id)
        if record.status == "paused" and not memory:
            await self.service.stop(sandbox_id)
        record = await self.service.resume(sandbox_id)
        now = time.time()
        extras = replace(SandboxExtras.of(record), started_at=now)
        return await self.save(record, replace(extras, end_at=now + min(timeout_s, MAX_TIMEOUT_S)))

    async def auto_resume(self, sandbox_id: str) -> bool:
        """Resume a sandbox created with ``autoResume`` that is paused with its memory, because a request reached it
        (E2B resumes such a sandbox on traffic; a filesystem-only pause needs an explicit connect). One past its
        deadline whose timer has not paused it yet is paused first, as E2B's proxy waits out ``pausing``. True if it
        is running now."""
        if not await self._resumable(sandbox_id):
            return False
        async with self.lifecycle_lock(sandbox_id):
            await self.settle(sandbox_id)
            if not await self._resumable(sandbox_id):
                return False
            record = await self.service.get(sandbox_id)
            if record.status == "ready":
                return self.transition(sandbox_id) is None  # it became ready while this request waited for the lock
            if record.status != "paused":
                return False  # paused without its memory: only an explicit connect resumes it
            log.info("e2b: sandbox %s got a request while paused; resuming it (autoResume)", sandbox_id)
            await self.wake(sandbox_id, auto_resume_timeout(SandboxExtras.of(record)))
            return True

    async def _resumable(self, sandbox_id: str) -> bool:
        """Whether traffic may resume the sandbox: created with ``autoResume`` and not being killed. Read without
        the lifecycle lock, so a request to a sandbox being killed (which holds the lock until it is gone) is
        answered at once."""
        current = self.transition(sandbox_id)
        if current is not None and current.action == "kill":
            return False
        try:
            record = await self.service.get(sandbox_id)
        except CorralError:
            return False
        return record.pool_key is None and SandboxExtras.of(record).auto_resume

    async def settle(self, sandbox_id: str) -> None:
        """Carry out now (holding :meth:`lifecycle_lock`) the kill or pause that a sandbox past its deadline is due,
        which its timer would a moment later; nothing for a sandbox within its deadline."""
        deadline = self._deadlines.get(sandbox_id)
        if deadline is not None and deadline.end_at <= time.time() and sandbox_id not in self._transitions:
            await self._end_of_life(sandbox_id, deadline)

    def _end(self, sandbox_id: str, transition: Transition) -> None:
        if self._transitions.get(sandbox_id) is transition:  # a later kill may have taken its place
            del self._transitions[sandbox_id]

    # --- deadlines --------------------------------------------------------------------------------------------------

    def _arm(self, sandbox_id: str, extras: SandboxExtras) -> None:
        assert extras.end_at is not None
        self._deadlines[sandbox_id] = _Deadline(extras.end_at, extras.auto_pause)
        self._schedule(sandbox_id, extras.end_at)

    def _schedule(self, sandbox_id: str, end_at: float) -> None:
        old = self._timers.pop(sandbox_id, None)
        if old is not None:
            old.cancel()
        delay = max(0.0, end_at - time.time())
        self._timers[sandbox_id] = asyncio.get_running_loop().call_later(delay, self._fire, sandbox_id)

    def _disarm(self, sandbox_id: str) -> None:
        self._deadlines.pop(sandbox_id, None)
        timer = self._timers.pop(sandbox_id, None)
        if timer is not None:
            timer.cancel()

    def _fire(self, sandbox_id: str) -> None:
        self._timers.pop(sandbox_id, None)
        if sandbox_id in self._expiring:
            return
        task = asyncio.create_task(self._expire(sandbox_id), name=f"e2b-timeout-{sandbox_id}")
        self._expiring[sandbox_id] = task
        task.add_done_callback(lambda done: self._expired(sandbox_id, done))

    def _expired(self, sandbox_id: str, task: asyncio.Task[None]) -> None:
        if self._expiring.get(sandbox_id) is task:
            del self._expiring[sandbox_id]

    async def _expire(self, sandbox_id: str) -> None:
        try:
            async with self.lifecycle_lock(sandbox_id):
                deadline = self._deadlines.get(sandbox_id)
                if deadline is None:
                    return  # paused or killed meanwhile
                if deadline.end_at > time.time():
                    if sandbox_id not in self._timers:  # moved later meanwhile, or the timer ran a hair early
                        self._schedule(sandbox_id, deadline.end_at)
                    return
                await self._end_of_life(sandbox_id, deadline)
        except CorralError as exc:
            log.warning("e2b: could not end sandbox %s after its timeout: %s", sandbox_id, exc.message)
        except Exception:
            log.exception("e2b: ending sandbox %s after its timeout failed", sandbox_id)

    async def _end_of_life(self, sandbox_id: str, deadline: _Deadline) -> None:
        """Kill or pause a sandbox that reached its deadline (holding its lifecycle lock)."""
        record = await self.service.get(sandbox_id)
        if record.status != "ready" or record.pool_key is not None:
            self._disarm(sandbox_id)
            return
        if deadline.pause:
            log.info("e2b: sandbox %s reached its timeout; pausing it", sandbox_id)
            memory = SandboxExtras.of(record).auto_pause_memory
            await self.pause(sandbox_id, memory=memory, reason="timeout", since=deadline.end_at)
        else:
            log.info("e2b: sandbox %s reached its timeout; killing it", sandbox_id)
            await self._destroy(sandbox_id, Transition("kill", "timeout", deadline.end_at))

    async def reconcile(self) -> list[str]:
        """Set the timer of every running E2B sandbox this process does not track yet (after a restart, or one
        resumed through Corral's own API), and end again each past its deadline with no kill or pause under way
        (one that failed). Returns the ids found past their deadline."""
        now = time.time()
        overdue = []
        for record in await self.service.store.workspaces.list(status="ready"):
            if record.metadata.get(METADATA_KEY) is None or record.pool_key is not None:
                continue
            extras = SandboxExtras.of(record)
            if extras.end_at is None:
                continue
            if record.id not in self._deadlines:
                self._arm(record.id, extras)
            elif extras.end_at <= now and record.id not in self._timers and record.id not in self._expiring:
                self._fire(record.id)
            if extras.end_at <= now:
                overdue.append(record.id)
        return overdue

    async def _reconcile_forever(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:
                log.exception("e2b: timeout reconciliation failed")
            await asyncio.sleep(self.reconcile_interval_s)

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

    # --- running ----------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the reconciler; its first pass sets the timers of the sandboxes already running."""
        if self._reconciler is None:
            self._reconciler = asyncio.create_task(self._reconcile_forever(), name="e2b-timeout-reconciler")

    async def aclose(self) -> None:
        """Stop the reconciler, the timers and every tracked command."""
        if self._reconciler is not None:
            self._reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconciler
            self._reconciler = None
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        expiring = list(self._expiring.values())
        for task in expiring:
            task.cancel()
        await asyncio.gather(*expiring, return_exceptions=True)
        await self.processes.aclose()
        await self.watches.aclose()


def clamp_timeout(timeout_s: int) -> int:
    """A sandbox timeout between 1 s and 24 h."""
    return max(1, min(int(timeout_s), MAX_TIMEOUT_S))


def auto_resume_timeout(extras: SandboxExtras) -> int:
    """How long an automatic resume runs the sandbox: its create timeout, at least a minute, at most 24 h."""
    return max(MIN_AUTO_RESUME_TIMEOUT_S, min(extras.timeout_s, MAX_TIMEOUT_S))
