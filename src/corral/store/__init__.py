"""Persistence: SQLAlchemy models, Alembic migrations and the repositories the rest of Corral uses.

SQLite (a file in the data directory) by default, PostgreSQL by URL. Open with ``await Store.open(url)``
(:mod:`corral.store.store`). The values the repositories return are in :mod:`corral.store.records`; each repository
(:mod:`~corral.store.workspaces`, :mod:`~corral.store.snapshots`, :mod:`~corral.store.agent_types`,
:mod:`~corral.store.sessions`, :mod:`~corral.store.audit`) says in its module what it returns and raises.
"""

from corral.store.agent_types import AgentTypeRepository
from corral.store.audit import AuditRepository, ToolCall
from corral.store.db import alembic_config, async_url, create_engine, migrate
from corral.store.records import (
    UNSET,
    AgentTypeRecord,
    AuditEntry,
    ProviderAttempt,
    SessionRecord,
    SessionStatus,
    SnapshotKind,
    SnapshotRecord,
    SnapshotStatus,
    Unset,
    WorkspaceRecord,
    WorkspaceStatus,
)
from corral.store.sessions import SessionRepository
from corral.store.snapshots import SnapshotRepository
from corral.store.store import Store
from corral.store.workspaces import WorkspaceRepository

__all__ = [
    "UNSET",
    "AgentTypeRecord",
    "AgentTypeRepository",
    "AuditEntry",
    "AuditRepository",
    "ProviderAttempt",
    "SessionRecord",
    "SessionRepository",
    "SessionStatus",
    "SnapshotKind",
    "SnapshotRecord",
    "SnapshotRepository",
    "SnapshotStatus",
    "Store",
    "ToolCall",
    "Unset",
    "WorkspaceRecord",
    "WorkspaceRepository",
    "WorkspaceStatus",
    "alembic_config",
    "async_url",
    "create_engine",
    "migrate",
]
