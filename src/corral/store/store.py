"""The store facade: :class:`Store` opens the database (running migrations) and carries one repository per aggregate.

``store.workspaces`` (:mod:`corral.store.workspaces`), ``store.snapshots`` (:mod:`corral.store.snapshots`),
``store.agent_types`` (:mod:`corral.store.agent_types`), ``store.sessions`` (:mod:`corral.store.sessions`) and
``store.audit`` (:mod:`corral.store.audit`) are the only way the rest of Corral reads and writes the database.
Every method is one short transaction and returns frozen dataclasses (:mod:`corral.store.records`), never ORM rows,
so callers hold no session and nothing lazy-loads.

Missing rows and errors: ``get`` methods return ``None`` for an unknown id; each repository's module says what its
updates do on a miss. Constraint violations become :class:`~corral.errors.InvalidRequestError` naming the offending
value; any other database failure becomes a :class:`~corral.errors.CorralError` whose message names the failure
without the URL's password.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from corral.errors import CorralError
from corral.store._common import database_errors, first_line
from corral.store.agent_types import AgentTypeRepository
from corral.store.audit import AuditRepository
from corral.store.db import Transactions, async_url, create_engine, create_session_factory, migrate
from corral.store.sessions import SessionRepository
from corral.store.snapshots import SnapshotRepository
from corral.store.workspaces import WorkspaceRepository

__all__ = ["Store"]


class Store:
    """The database: an engine plus one repository per aggregate.

    Open with ``store = await Store.open(url)`` (or ``async with await Store.open(url) as store:``) and close with
    ``await store.close()``. ``Store(engine)`` wraps an engine you created and migrated yourself.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        sessions = create_session_factory(engine)
        self.transactions = Transactions(engine)
        """For the hot path's short transactions: each in one call (see :class:`Transactions`)."""
        self.workspaces = WorkspaceRepository(sessions, self.transactions)
        self.snapshots = SnapshotRepository(sessions)
        self.agent_types = AgentTypeRepository(sessions)
        self.sessions = SessionRepository(sessions, self.transactions)
        self.audit = AuditRepository(sessions)

    @classmethod
    async def open(cls, url: str | URL, *, run_migrations: bool = True, **engine_options: Any) -> Store:
        """Create the engine for ``url`` (sync or async driver names both work) and migrate the schema to head.

        Args:
            url: ``sqlite:///path/corral.db``, ``postgresql://user:pw@host/db`` or their async forms.
            run_migrations: Upgrade the schema first; turn off only when something else migrates.
            engine_options: Passed to :func:`sqlalchemy.ext.asyncio.create_async_engine`.

        Raises:
            CorralError: The database cannot be reached or migrated; the message hides the password.
        """
        safe = async_url(url).render_as_string(hide_password=True)
        try:
            engine = create_engine(url, **engine_options)
        except OSError as exc:  # the SQLite data directory cannot be created
            raise CorralError(f"cannot open the database {safe}: {exc}") from exc
        try:
            if run_migrations:
                await migrate(engine)
        except (SQLAlchemyError, OSError) as exc:
            await engine.dispose()
            raise CorralError(f"cannot open the database {safe}: {first_line(exc)}") from exc
        except BaseException:
            await engine.dispose()
            raise
        return cls(engine)

    async def checkpoint(self) -> None:
        """SQLite: move the WAL into the database file and truncate it, so overwritten values leave the WAL too
        (freed pages are already zeroed: ``secure_delete``). A no-op on PostgreSQL."""
        if self.engine.dialect.name != "sqlite":
            return
        with database_errors():
            async with self.engine.connect() as connection:
                await connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    async def close(self) -> None:
        """Close every pooled connection. The store must not be used afterwards."""
        await self.transactions.aclose()
        await self.engine.dispose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
