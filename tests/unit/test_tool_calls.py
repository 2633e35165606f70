"""The agent's hot path: tool calls read the session row once and keep it, yet an ended session, a tool the policy
does not enable and a lost workspace are refused on every call; every call, refused ones included, reaches the audit
log, which is written behind the answers and complete once the service has closed. Starting a session keeps its
type's config, and a change of the type is seen by the next start."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from corral.agents.sessions import AgentService, TaskContext
from corral.errors import (
    AgentTypeNotFoundError,
    SessionNotFoundError,
    SessionStateError,
    ToolNotAllowedError,
    UnknownToolError,
    WorkspaceDestroyedError,
)
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.service import WorkspaceService
from corral.providers.base import WorkspaceProvider
from corral.providers.fake import FakeProvider
from corral.settings import Settings
from corral.store import Store, ToolCall

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CORRAL_* variables out of Settings."""
    for name in list(os.environ):
        if name.startswith(("CORRAL_", "WORKSPACE_DEFAULT_")) or name == "E2B_API_KEY":
            monkeypatch.delenv(name)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A SQLite store in the test's directory."""
    opened = await Store.open(f"sqlite:///{tmp_path / 'corral.db'}")
    yield opened
    await opened.close()


def _service(tmp_path: Path, store: Store) -> AgentService:
    settings = Settings(data_dir=tmp_path, providers="gvisor")
    providers: dict[str, WorkspaceProvider] = {"gvisor": FakeProvider("gvisor", isolation="gvisor")}
    return AgentService(WorkspaceService(settings, store, providers, HealthMonitor(providers, 30)))


@pytest.fixture
async def agents(tmp_path: Path, store: Store) -> AsyncIterator[AgentService]:
    """An agent service over a gVisor fake."""
    service = _service(tmp_path, store)
    await service.workspaces.health.check_all()
    yield service
    await service.aclose()


async def _session(agents: AgentService, tools: list[str]) -> str:
    agent_type = await agents.create_type(f"t-{len(tools)}-{id(tools)}", {"enabled": True, "tools": tools})
    session = await agents.wait_provisioned((await agents.start(agent_type.id, TaskContext())).id)
    assert session.status == "active"
    return session.id


async def test_the_policy_is_enforced_on_every_call_and_refusals_are_audited(agents: AgentService) -> None:
    """After an allowed call (the session is kept from then on), a tool outside the policy and an unknown tool are
    still refused, and every call is in the audit log the moment the next read of it comes."""
    session_id = await _session(agents, ["write", "read"])
    await agents.call_tool(session_id, "write", {"path": "a.txt", "content": "one"})
    with pytest.raises(ToolNotAllowedError):
        await agents.call_tool(session_id, "bash", {"command": "true"})
    with pytest.raises(UnknownToolError):
        await agents.call_tool(session_id, "rm", {})
    assert (await agents.call_tool(session_id, "read", {"path": "a.txt"}))["content"] == "one"
    entries = await agents.audit(session_id)
    assert [(e.tool, e.status) for e in entries] == [
        ("write", "ok"),
        ("bash", "refused"),
        ("rm", "refused"),
        ("read", "ok"),
    ]
    assert entries[0].arguments_summary == "a.txt (3 bytes)"


async def test_an_ended_session_refuses_calls_after_it_was_kept(agents: AgentService) -> None:
    """Ending a session drops what tool calls kept of it: the next call is refused and audited as an error."""
    session_id = await _session(agents, ["write"])
    await agents.call_tool(session_id, "write", {"path": "a.txt", "content": "x"})
    await agents.end(session_id)
    with pytest.raises(SessionStateError, match="has ended"):
        await agents.call_tool(session_id, "write", {"path": "b.txt", "content": "x"})
    assert [(e.tool, e.status) for e in await agents.audit(session_id)] == [("write", "ok"), ("write", "error")]


async def test_a_workspace_gone_behind_the_session_is_noticed_on_the_next_call(agents: AgentService) -> None:
    """The workspace's state is checked on every call, whatever the session's kept row says."""
    session_id = await _session(agents, ["write"])
    await agents.call_tool(session_id, "write", {"path": "a.txt", "content": "x"})
    workspace_id = (await agents.get(session_id)).workspace_id
    assert workspace_id is not None
    await agents.workspaces.destroy(workspace_id)
    with pytest.raises(WorkspaceDestroyedError):
        await agents.call_tool(session_id, "write", {"path": "a.txt", "content": "x"})


async def test_calls_of_unknown_sessions_are_refused_and_write_nothing(agents: AgentService, store: Store) -> None:
    """No audit entry is written for a session that does not exist, whatever the call."""
    with pytest.raises(SessionNotFoundError):
        await agents.call_tool("nobody", "write", {"path": "a.txt", "content": "x"})
    await agents.aclose()
    assert await store.audit.list("nobody") == []


async def test_every_answered_call_is_in_the_log_after_a_clean_shutdown(
    tmp_path: Path, agents: AgentService, store: Store
) -> None:
    """Entries still queued when the service closes are written before it returns: a fresh service over the same
    database reads every one."""
    session_id = await _session(agents, ["write"])
    for n in range(20):
        await agents.call_tool(session_id, "write", {"path": f"f{n}.txt", "content": "x"})
    await agents.aclose()
    assert len(await store.audit.list(session_id)) == 20
    assert [e.arguments_summary for e in await _service(tmp_path, store).audit(session_id)][-1] == "f19.txt (1 bytes)"


async def test_record_writes_a_batch_in_order_and_skips_unknown_sessions(agents: AgentService, store: Store) -> None:
    """``AuditRepository.record`` writes the calls of existing sessions in the order given, credentials masked."""
    session_id = await _session(agents, ["write"])
    at = datetime.now(UTC)
    calls = [
        ToolCall(session_id, at, "bash", "git clone https://user:hunter2@example.com/r.git", "ok", 2.5),
        ToolCall("nobody", at, "bash", "true", "ok", 1.0),
        ToolCall(session_id, at, "read", "a.txt", "refused", 0.5),
    ]
    await store.audit.record(calls)
    await store.audit.record([])
    entries = await store.audit.list(session_id)
    assert [(e.tool, e.arguments_summary, e.status, e.at) for e in entries] == [
        ("bash", "git clone https://***@example.com/r.git", "ok", at),
        ("read", "a.txt", "refused", at),
    ]


async def test_sessions_start_with_the_type_config_of_the_moment(agents: AgentService) -> None:
    """The config kept for starting sessions follows every change: a new config applies to the next session, and a
    deleted type starts none."""
    agent_type = await agents.create_type("kept", {"enabled": True, "tools": ["write"]})
    first = await agents.wait_provisioned((await agents.start(agent_type.id, TaskContext())).id)
    await agents.set_config(agent_type.id, {"enabled": True, "tools": ["read", "grep"]})
    second = await agents.wait_provisioned((await agents.start(agent_type.id, TaskContext())).id)
    assert first.workspace_config["tools"] == ["write"]
    assert second.workspace_config["tools"] == ["read", "grep"]
    for session in (first, second):
        await agents.end(session.id)
    await agents.delete_type(agent_type.id)
    with pytest.raises(AgentTypeNotFoundError):
        await agents.start(agent_type.id, TaskContext())


async def test_a_session_ended_while_a_call_reads_it_is_not_kept_as_active(
    agents: AgentService, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that read the session just before it was ended elsewhere does not keep that stale row: the next call
    reads the session again and is refused because it has ended."""
    session_id = await _session(agents, ["write"])
    read = store.sessions.get
    ending = True

    async def read_then_end(wanted: str) -> object:
        nonlocal ending
        row = await read(wanted)
        if ending:
            ending = False
            await agents.end(wanted)  # lands between this call's read and its use of the row
        return row

    monkeypatch.setattr(store.sessions, "get", read_then_end)
    with pytest.raises(WorkspaceDestroyedError):  # the stale row still names the workspace, which is gone now
        await agents.call_tool(session_id, "write", {"path": "a.txt", "content": "x"})
    with pytest.raises(SessionStateError, match="has ended"):
        await agents.call_tool(session_id, "write", {"path": "a.txt", "content": "x"})
