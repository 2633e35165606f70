"""Sessions and agent types over fake providers: credentials are sealed or masked, failures that another provider
would not fix are not retried, and provisioning interrupted by a restart is resumed."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.agents.sessions import AgentService, TaskContext
from corral.credentials import SecretBox
from corral.errors import InvalidRequestError
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers.base import WorkspaceProvider
from corral.providers.fake import FakeProvider
from corral.settings import Settings
from corral.store import Store

pytestmark = pytest.mark.unit

KEY = "unit-test-secret-key-0123456789"
UNREACHABLE = "http://x-access-token:TOPSECRET1@127.0.0.1:9/app.git"


@pytest.fixture
def fake() -> FakeProvider:
    return FakeProvider("gvisor")


@pytest.fixture
async def service(tmp_path: Path, fake: FakeProvider) -> AsyncIterator[WorkspaceService]:
    settings = Settings(data_dir=tmp_path, providers="gvisor")
    store = await Store.open(settings.sqlalchemy_url())
    providers: dict[str, WorkspaceProvider] = {"gvisor": fake}
    monitor = HealthMonitor(providers, 30)
    await monitor.check_all()
    yield WorkspaceService(settings, store, providers, monitor)
    await store.close()


@pytest.fixture
async def agents(service: WorkspaceService) -> AsyncIterator[AgentService]:
    agents = AgentService(service, SecretBox.from_secret(KEY))
    yield agents
    await agents.aclose()


def _database_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.glob("corral.db*"))


def _stored_task(tmp_path: Path, session_id: str) -> str:
    with sqlite3.connect(tmp_path / "corral.db") as db:
        row = db.execute("select task_context from sessions where id = ?", (session_id,)).fetchone()
    return str(row[0])


async def test_fixed_repository_credential_is_write_only(agents: AgentService, tmp_path: Path) -> None:
    """A fixed URL's credential is stored sealed and answered masked; the masked URL sent back keeps it, the same
    mask on another host is refused, and a new credential replaces it."""
    source = {"type": "fixed", "url": "https://bot:TOPSECRET3@git.example/org/repo.git"}
    agent_type = await agents.create_type("fixed", {"enabled": True, "repo_source": source})
    stored = agent_type.workspace_config["repo_source"]
    assert stored["url"] == "https://***@git.example/org/repo.git"
    assert agents.box.open(stored["sealed_url"], purpose="repo_source URL") == source["url"]
    assert b"TOPSECRET3" not in _database_bytes(tmp_path)

    kept = await agents.set_config(
        agent_type.id, {"enabled": True, "tools": ["read"], "repo_source": {**source, "url": stored["url"]}}
    )
    assert kept.workspace_config["repo_source"]["sealed_url"] == stored["sealed_url"]
    with pytest.raises(InvalidRequestError, match="masks its credential"):
        await agents.set_config(
            agent_type.id, {"enabled": True, "repo_source": {"type": "fixed", "url": "https://***@evil.example/x"}}
        )
    replaced = await agents.set_config(
        agent_type.id, {"enabled": True, "repo_source": {**source, "url": "https://bot:TOPSECRET4@git.example/o.git"}}
    )
    sealed = replaced.workspace_config["repo_source"]["sealed_url"]
    assert agents.box.open(sealed, purpose="repo_source URL").endswith("TOPSECRET4@git.example/o.git")
    assert b"TOPSECRET4" not in _database_bytes(tmp_path)


async def test_task_credential_is_sealed_only_while_provisioning(agents: AgentService, tmp_path: Path) -> None:
    """The task's URL is stored masked, with a sealed copy while the session provisions that is dropped after."""
    agent_type = await agents.create_type(
        "task",
        {"enabled": True, "repo_source": {"type": "task_context"}, "checkout_on_start": False,
         "setup_commands": ["sleep 0.3"]},
    )  # fmt: skip
    task = TaskContext(repository_url="https://bot:TOPSECRET5@git.example/r.git")
    session = await agents.start(agent_type.id, task)
    assert session.status == "provisioning"
    assert session.task_context["repository_url"] == "https://***@git.example/r.git"
    assert "sealed_repository_url" in _stored_task(tmp_path, session.id)
    assert (await agents.wait_provisioned(session.id)).status == "active"
    assert "sealed_repository_url" not in _stored_task(tmp_path, session.id)
    database = _database_bytes(tmp_path)
    assert b"TOPSECRET5" not in database


async def test_a_checkout_failure_is_not_retried(agents: AgentService, fake: FakeProvider, tmp_path: Path) -> None:
    """A clone that fails degrades the session after one attempt (no second workspace), with a masked reason."""
    agent_type = await agents.create_type("bad", {"enabled": True, "repo_source": {"type": "task_context"}})
    session = await agents.wait_provisioned((await agents.start(agent_type.id, TaskContext(UNREACHABLE))).id)
    assert (session.status, session.degraded, session.workspace_id) == ("active", True, None)
    assert session.degraded_reason is not None
    assert "not retried" in session.degraded_reason and session.degraded_reason.count("attempt") == 1
    assert "cannot reach http://127.0.0.1:9/app.git" in session.degraded_reason
    assert len([call for call in fake.calls if call[0] == "create"]) == 1
    assert b"TOPSECRET" not in _database_bytes(tmp_path)


async def test_sealed_credentials_leave_the_session_when_provisioning_ends(agents: AgentService) -> None:
    """Once provisioning is over (here: failed), neither the task's nor the fixed source's sealed URL stays in the
    session row; while it provisions, both are there for a restart."""
    fixed = await agents.create_type("f", {"enabled": True, "repo_source": {"type": "fixed", "url": UNREACHABLE}})
    session = await agents.start(fixed.id, TaskContext(UNREACHABLE))
    assert "sealed_url" in session.workspace_config["repo_source"]
    assert "sealed_repository_url" in session.task_context
    done = await agents.wait_provisioned(session.id)
    assert done.degraded and "cannot reach" in (done.degraded_reason or "")
    assert "sealed_url" not in done.workspace_config["repo_source"]
    assert "sealed_repository_url" not in done.task_context


async def _crashed_session(agents: AgentService, service: WorkspaceService) -> tuple[str, str]:
    """A session left ``provisioning`` by a server that died right after creating its workspace (the workspace id
    never reached the session; only the workspace's metadata names the session)."""
    agent_type = await agents.create_type(
        "slow",
        {"enabled": True, "provider": "gvisor", "repo_source": {"type": "task_context"}, "checkout_on_start": False,
         "setup_commands": ["true"]},
    )  # fmt: skip
    config = agent_type.workspace_config
    task = TaskContext("https://bot:TOPSECRET7@git.example/r.git", branch="main")
    session = await service.store.sessions.create(
        agent_type.id, task_context=task.sealed_json(agents.box), workspace_config=config, status="provisioning"
    )
    orphan = await service.create(CreateWorkspace(provider="gvisor", metadata={"session_id": session.id}))
    return session.id, orphan.id


async def _wait_active(agents: AgentService, session_id: str) -> None:
    deadline = time.monotonic() + 10
    while (await agents.get(session_id)).status == "provisioning":
        assert time.monotonic() < deadline, "the session stayed provisioning"
        await asyncio.sleep(0.01)


async def test_provisioning_interrupted_by_a_restart_resumes(
    agents: AgentService, service: WorkspaceService, fake: FakeProvider
) -> None:
    """At start-up a provisioning session's old workspace is destroyed and it is provisioned again to active."""
    session_id, orphan = await _crashed_session(agents, service)
    restarted = AgentService(service, SecretBox.from_secret(KEY))
    try:
        assert await restarted.resume_interrupted() == [session_id]
        await restarted.wait_provisioned(session_id)
        await _wait_active(restarted, session_id)
        session = await restarted.get(session_id)
        assert (session.status, session.degraded) == ("active", False)
        assert session.workspace_id not in (None, orphan)
        assert (await service.get(orphan)).status == "destroyed"
        assert orphan not in await fake.list_workspaces()
        assert "sealed_repository_url" not in session.task_context
    finally:
        await restarted.aclose()


async def test_a_session_whose_credential_cannot_be_opened_is_degraded(
    agents: AgentService, service: WorkspaceService, fake: FakeProvider
) -> None:
    """Restarted with another secret key, a provisioning session ends degraded, saying the credential is unreadable,
    and its old workspace is still reclaimed."""
    session_id, orphan = await _crashed_session(agents, service)
    restarted = AgentService(service, SecretBox.from_secret("a-different-secret-key-000"))
    try:
        await restarted.resume_interrupted()
        await restarted.wait_provisioned(session_id)
        await _wait_active(restarted, session_id)
        session = await restarted.get(session_id)
        assert (session.status, session.degraded, session.workspace_id) == ("active", True, None)
        assert session.degraded_reason is not None and "cannot be decrypted" in session.degraded_reason
        assert orphan not in await fake.list_workspaces()
    finally:
        await restarted.aclose()


async def test_shutdown_during_provisioning_leaves_a_resumable_session(
    agents: AgentService, service: WorkspaceService, fake: FakeProvider
) -> None:
    """A clean shutdown cancels provisioning, destroys the half-made workspace and leaves the session provisioning,
    so the next start provisions it again."""
    agent_type = await agents.create_type("setup", {"enabled": True, "setup_commands": ["sleep 30"]})
    session = await agents.start(agent_type.id, TaskContext())
    deadline = time.monotonic() + 10
    while (await agents.get(session.id)).workspace_id is None:
        assert time.monotonic() < deadline, "the workspace id never reached the session"
        await asyncio.sleep(0.01)
    await agents.aclose()
    assert (await agents.get(session.id)).status == "provisioning"
    assert await fake.list_workspaces() == []
    restarted = AgentService(service, agents.box)
    try:
        assert await restarted.resume_interrupted() == [session.id]
        assert (await restarted.get(session.id)).status == "provisioning"  # setup sleeps again; it is running
        assert (await restarted.end(session.id)).status == "ended"
    finally:
        await restarted.aclose()


async def test_credentials_stored_in_clear_by_an_older_version_are_sealed_or_masked(
    agents: AgentService, service: WorkspaceService, tmp_path: Path
) -> None:
    """At start-up, clear-text credentials of older versions are sealed (where still needed) or masked, and gone
    from the database file's bytes; a provisioning session can still resume with its credential."""
    store = service.store
    fixed_url = "https://bot:OLDSECRET1@git.example/fixed.git"
    task_url = "https://bot:OLDSECRET2@git.example/task.git?access_token=OLDSECRET3"
    config = {"enabled": True, "repo_source": {"type": "fixed", "url": fixed_url, "branch": None}}
    agent_type = await store.agent_types.create("old", config)
    old_task = {"repository_url": task_url, "branch": "main", "pull_request_number": None, "base_branch": None}
    provisioning = await store.sessions.create(agent_type.id, task_context=old_task, status="provisioning")
    ended = await store.sessions.create(agent_type.id, task_context=old_task, status="ended")
    old_metadata = {"session_id": ended.id, "task": {"repository_url": "https://git.example/task.git?token=OLDSECRET3"}}
    workspace = await store.workspaces.create(
        requested_provider="gvisor", container_type="agent_workspace", resource_limits={}, network="isolated",
        base_image="img", metadata=old_metadata,
    )  # fmt: skip
    assert b"OLDSECRET" in _database_bytes(tmp_path)

    assert await agents.protect_stored_credentials() == 4
    assert b"OLDSECRET" not in _database_bytes(tmp_path)
    assert await agents.protect_stored_credentials() == 0, "a second start finds nothing to do"
    stored_type = await agents.get_type(agent_type.id)
    assert stored_type.workspace_config["repo_source"]["url"] == "https://***@git.example/fixed.git"
    resumed = TaskContext.from_stored((await agents.get(provisioning.id)).task_context, agents.box)
    assert resumed.repository_url == task_url
    assert "sealed_repository_url" not in (await agents.get(ended.id)).task_context
    assert (await service.get(workspace.id)).metadata["task"]["repository_url"] == "https://git.example/task.git"
