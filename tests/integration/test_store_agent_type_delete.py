"""Deleting an agent type in the store, on SQLite and PostgreSQL: refused while sessions of it are live, and taking
its ended sessions and their audit entries with it in one transaction."""

from __future__ import annotations

from corral.store import Store
from tests.integration.test_store import database_url, store  # noqa: F401  # the parametrized fixtures

LIVE = ("provisioning", "active")


async def test_delete_is_refused_while_sessions_are_live_and_names_them(store: Store) -> None:  # noqa: F811
    """Live sessions block the delete (their ids come back, oldest first) and nothing is removed."""
    agent_type = await store.agent_types.create("reviewer", {})
    first = await store.sessions.create(agent_type.id)
    second = await store.sessions.create(agent_type.id, status="active")
    await store.sessions.create(agent_type.id, status="ended")

    assert await store.agent_types.delete(agent_type.id, live=LIVE) == [first.id, second.id]
    assert await store.agent_types.get(agent_type.id) == agent_type
    assert len(await store.sessions.list(agent_type_id=agent_type.id)) == 3


async def test_delete_removes_the_type_its_ended_sessions_and_their_audit(store: Store) -> None:  # noqa: F811
    """With only ended sessions the type goes, with them and their audit entries; other types are untouched; the
    name can be taken again; an unknown id answers None."""
    doomed = await store.agent_types.create("reviewer", {})
    kept = await store.agent_types.create("coder", {})
    ended = await store.sessions.create(doomed.id, status="ended")
    other = await store.sessions.create(kept.id, status="ended")
    for session in (ended, other):
        await store.audit.append(session.id, tool="bash", arguments_summary="ls", status="ok", duration_ms=1.0)

    assert await store.agent_types.delete(doomed.id, live=LIVE) == []

    assert await store.agent_types.get(doomed.id) is None
    assert await store.sessions.get(ended.id) is None
    assert await store.audit.list(ended.id) == []
    assert await store.sessions.get(other.id) == other
    assert len(await store.audit.list(other.id)) == 1
    assert (await store.agent_types.create("reviewer", {})).name == "reviewer"
    assert await store.agent_types.delete("missing", live=LIVE) is None
