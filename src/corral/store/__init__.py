"""Persistence: SQLAlchemy models, Alembic migrations and the repositories the rest of Corral uses.

SQLite (a file in the data directory) by default, PostgreSQL by URL. Open with ``await Store.open(url)``; see
:mod:`corral.store.repository` for what each repository returns and raises.
"""

from corral.store.db import alembic_config, async_url, create_engine, migrate
from corral.store.repository import (
    UNSET,
    AgentTypeRecord,
    AgentTypeRepository,
    AuditEntry,
    AuditRepository,
    ProviderAttempt,
    SessionRecord,
    SessionRepository,
    SessionStatus,
    Store,
    Unset,
    WorkspaceRecord,
    WorkspaceRepository,
    WorkspaceStatus,
)

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
    "Store",
    "Unset",
    "WorkspaceRecord",
    "WorkspaceRepository",
    "WorkspaceStatus",
    "alembic_config",
    "async_url",
    "create_engine",
    "migrate",
]
