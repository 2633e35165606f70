"""Idle lifetimes: sessions end and workspaces stop after the idle timeout, answers say when, the CLI warns ahead.

Fake providers over a real SQLite store. The fake-clock tests move time by hand; the background test uses a small
real timeout and polls with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from corral.agents.sessions import AgentService, TaskContext
from corral.cli._lifetimes import expiry_warning
from corral.orchestrator import reaper as reaper_module
from corral.orchestrator import service as service_module
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.reaper import Reaper
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers.base import ExecRequest, WorkspaceProvider, WorkspaceState
from corral.providers.fake import FakeProvider
from corral.settings import Settings
from corral.store import Store, _common, agent_types, audit, sessions, workspaces

pytestmark = pytest.mark.unit

IDLE_S = 600.0


class FakeClock:
    """Wall-clock time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        """Stands in for ``time.time()``."""
        return self.now

    def utcnow(self) -> datetime:
        """Stands in for the store's ``utcnow()``."""
        return datetime.fromtimestamp(self.now, UTC)

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now += seconds


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CORRAL_* variables out of Settings and of the CLI's warning window."""
    for name in list(os.environ):
        if name.startswith(("CORRAL_", "WORKSPACE_DEFAULT_")) or name == "E2B_API_KEY":
            monkeypatch.delenv(name)


@pytest.fixture
def provider() -> FakeProvider:
    """The one backend: a gVisor fake."""
    return FakeProvider("gvisor", isolation="gvisor")


async def _agents(tmp_path: Path, provider: FakeProvider, idle_s: float) -> AgentService:
    settings = Settings(data_dir=tmp_path, providers="gvisor", idle_timeout_s=idle_s)
    store = await Store.open(settings.sqlalchemy_url())
    providers: dict[str, WorkspaceProvider] = {"gvisor": provider}
    monitor = HealthMonitor(providers, 30)
    await monitor.check_all()
    return AgentService(WorkspaceService(settings, store, providers, monitor))


async def _close(agents: AgentService) -> None:
    await agents.aclose()
    await agents.workspaces.store.close()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """One fake clock for the reaper, the service's last-use stamps and the store's timestamps."""
    fake = FakeClock()
    monkeypatch.setattr(reaper_module, "time", fake)
    monkeypatch.setattr(service_module, "time", fake)
    for store_module in (_common, workspaces, agent_types, sessions, audit):
        monkeypatch.setattr(store_module, "utcnow", fake.utcnow)
    return fake


@pytest.fixture
async def agents(tmp_path: Path, provider: FakeProvider, clock: FakeClock) -> AsyncIterator[AgentService]:
    """Sessions over a service with a 600 s idle timeout, on the fake clock."""
    service = await _agents(tmp_path, provider, IDLE_S)
    yield service
    await _close(service)


async def _active_session(agents: AgentService) -> tuple[str, str]:
    """Start a session with a workspace; return (session id, workspace id) once it is active."""
    agent_type = await agents.create_type(f"t{time.monotonic_ns()}", {"enabled": True})
    session = await agents.wait_provisioned((await agents.start(agent_type.id, TaskContext())).id)
    assert session.status == "active" and session.workspace_id is not None
    return session.id, session.workspace_id


async def test_an_idle_session_ends_and_its_workspace_goes_while_a_used_one_stays(
    agents: AgentService, provider: FakeProvider, clock: FakeClock
) -> None:
    """A session with no tool call for longer than the idle timeout is ended (its workspace destroyed, as ending it
    does); one whose tool call came later stays active, and its workspace is not stopped on its own."""
    idle, idle_ws = await _active_session(agents)
    used, used_ws = await _active_session(agents)
    sweeper = Reaper(agents.workspaces, ttl_s=0, idle_s=IDLE_S, interval_s=60, sessions=agents)
    clock.advance(IDLE_S - 100)
    await agents.call_tool(used, "write", {"path": "notes.txt", "content": "still here"})
    assert [(e.tool, e.status) for e in await agents.audit(used)] == [("write", "ok")]
    clock.advance(101)
    assert await sweeper.sweep() == [idle]
    assert (await agents.get(idle)).status == "ended"
    assert (await agents.workspaces.get(idle_ws)).status == "destroyed"
    assert await provider.state(idle_ws) is WorkspaceState.MISSING
    assert (await agents.get(used)).status == "active"
    assert (await agents.workspaces.get(used_ws)).status == "ready"
    clock.advance(IDLE_S)
    assert await sweeper.sweep() == [used]
    assert (await agents.workspaces.get(used_ws)).status == "destroyed"


async def test_answers_say_when_the_idle_timeout_strikes(agents: AgentService, clock: FakeClock) -> None:
    """expires_at is the last use plus the idle timeout, moves on with each call, and is null once nothing expires."""
    service = agents.workspaces
    record = await service.create(CreateWorkspace())
    lifetime = service.workspace_lifetime(record)
    assert lifetime.idle_timeout_s == IDLE_S
    assert lifetime.expires_at == datetime.fromtimestamp(clock.now + IDLE_S, UTC)
    clock.advance(30)
    await service.exec(record.id, ExecRequest("true"))
    moved = service.workspace_lifetime(await service.get(record.id))
    assert moved.expires_at == datetime.fromtimestamp(clock.now + IDLE_S, UTC)
    assert moved.to_json()["expires_at"].endswith("Z")
    stopped = await service.stop(record.id)
    assert service.workspace_lifetime(stopped).to_json() == {"idle_timeout_s": IDLE_S, "expires_at": None}

    session_id, _ = await _active_session(agents)
    session = await agents.get(session_id)
    assert service.session_lifetime(session).expires_at == datetime.fromtimestamp(clock.now + IDLE_S, UTC)
    ended = await agents.end(session_id)
    assert service.session_lifetime(ended).to_json() == {"idle_timeout_s": IDLE_S, "expires_at": None}


async def test_e2b_sandboxes_keep_their_own_timeout(agents: AgentService, clock: FakeClock) -> None:
    """A workspace made through the E2B layer has no idle timeout: the reaper leaves it running past it."""
    service = agents.workspaces
    record = await service.create(CreateWorkspace(metadata={"e2b": {"timeout_s": 86400}}))
    assert service.workspace_lifetime(record).to_json() == {"idle_timeout_s": None, "expires_at": None}
    clock.advance(10 * IDLE_S)
    assert await Reaper(service, ttl_s=0, idle_s=IDLE_S, interval_s=60, sessions=agents).sweep() == []
    assert (await service.get(record.id)).status == "ready"


async def test_zero_turns_the_idle_timeout_off(tmp_path: Path, provider: FakeProvider) -> None:
    """CORRAL_IDLE_TIMEOUT_S=0: answers carry null idle_timeout_s and expires_at, and nothing idles out."""
    agents = await _agents(tmp_path, provider, 0)
    try:
        service = agents.workspaces
        record = await service.create(CreateWorkspace())
        assert service.workspace_lifetime(record).to_json() == {"idle_timeout_s": None, "expires_at": None}
        session_id, _ = await _active_session(agents)
        assert service.session_lifetime(await agents.get(session_id)).expires_at is None
        assert Reaper(service, ttl_s=0, idle_s=0, interval_s=60, sessions=agents).enabled is False
    finally:
        await _close(agents)


async def test_failed_provisioning_keeps_the_session_error_and_no_workspace_record(
    tmp_path: Path, provider: FakeProvider
) -> None:
    """A session whose workspace cannot be created anywhere is degraded with the reason, and leaves no error
    workspace record behind."""
    agents = await _agents(tmp_path, provider, IDLE_S)
    try:
        provider.fail_create = "runsc vanished"
        agent_type = await agents.create_type("failing", {"enabled": True})
        session = await agents.wait_provisioned((await agents.start(agent_type.id, TaskContext())).id)
        assert session.degraded and session.workspace_id is None
        assert session.degraded_reason is not None and "runsc vanished" in session.degraded_reason
        assert await agents.workspaces.store.workspaces.list(include_destroyed=True) == []
    finally:
        await _close(agents)


async def test_the_background_reaper_ends_an_idle_session(tmp_path: Path, provider: FakeProvider) -> None:
    """With a small real idle timeout, the running reaper ends an unused session and destroys its workspace."""
    agents = await _agents(tmp_path, provider, 0.3)
    sweeper = Reaper(agents.workspaces, ttl_s=0, idle_s=0.3, interval_s=0.05, sessions=agents)
    try:
        session_id, workspace_id = await _active_session(agents)
        await sweeper.start()
        deadline = time.monotonic() + 20
        while (await agents.get(session_id)).status != "ended":
            assert time.monotonic() < deadline, "the idle session was never ended"
            await asyncio.sleep(0.05)
        assert (await agents.workspaces.get(workspace_id)).status == "destroyed"
    finally:
        await sweeper.stop()
        await _close(agents)


def test_the_cli_warns_only_within_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's warning appears within CORRAL_IDLE_WARNING_S of expires_at (default 300 s) and names the item."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    soon = now + timedelta(minutes=3, seconds=30)
    assert expiry_warning("workspace", "ab12", soon, ends="stops", now=now) == (
        "workspace ab12 stops in 4 minutes unless used (idle timeout)"
    )
    assert expiry_warning("workspace", "ab12", now + timedelta(minutes=6), ends="stops", now=now) is None
    assert expiry_warning("workspace", "ab12", None, ends="stops", now=now) is None
    assert "next sweep" in (expiry_warning("session", "s1", now - timedelta(seconds=1), ends="ends", now=now) or "")
    monkeypatch.setenv("CORRAL_IDLE_WARNING_S", "600")
    assert expiry_warning("session", "s1", now + timedelta(minutes=6), ends="ends", now=now) is not None
