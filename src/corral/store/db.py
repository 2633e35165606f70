"""Engines, sessions and migrations.

:func:`create_engine` turns a database URL into an async engine (SQLite through aiosqlite, PostgreSQL through
asyncpg) tuned for how Corral uses it; :func:`migrate` brings the schema to the newest Alembic revision. Alembic is
configured in code (:func:`alembic_config`), so no ``alembic.ini`` is needed at runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

__all__ = [
    "MIGRATIONS_DIR",
    "SQLITE_BUSY_TIMEOUT_MS",
    "Transactions",
    "alembic_config",
    "async_url",
    "create_engine",
    "create_session_factory",
    "migrate",
    "private_sqlite_file",
]

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
"""The Alembic script directory shipped inside the package."""

SQLITE_BUSY_TIMEOUT_MS = 15_000
"""How long a SQLite writer waits for another writer's lock before failing with "database is locked"."""

T = TypeVar("T")

_MIGRATION_LOCK_KEY = 0x636F7272616C  # "corral" in ASCII: an arbitrary key no other application is likely to use

_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}


def async_url(url: str | URL) -> URL:
    """The URL with an async driver: ``sqlite://`` becomes aiosqlite, ``postgresql://`` becomes asyncpg.

    URLs that already name a driver are kept as they are.
    """
    parsed = make_url(url)
    driver = _ASYNC_DRIVERS.get(parsed.drivername)
    return parsed.set(drivername=driver) if driver else parsed


def create_engine(url: str | URL, **options: Any) -> AsyncEngine:
    """An async engine for ``url``; extra keyword arguments go to :func:`~sqlalchemy.ext.asyncio.create_async_engine`.

    For a SQLite file the parent directory is created if missing (mode 0700), the file is made private (mode 0600,
    see :func:`private_sqlite_file`), and every connection turns on WAL (readers never block the writer), a busy
    timeout (concurrent writers wait instead of failing) and foreign keys.
    """
    parsed = async_url(url)
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite and parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
        private_sqlite_file(Path(parsed.database).expanduser())
    if not is_sqlite:
        # A connection dropped by a server restart is noticed when checked out, not by the query that follows.
        options.setdefault("pool_pre_ping", True)
    engine = create_async_engine(parsed, **options)
    if is_sqlite:
        event.listen(engine.sync_engine, "connect", _configure_sqlite_connection)
    return engine


def private_sqlite_file(path: Path) -> None:
    """Make the SQLite database ``path`` readable by its owner only (0600), before anything opens it.

    SQLite gives the ``-wal`` and ``-shm`` files it creates the main file's mode, so the main file is created (empty
    is a valid new database) or tightened first; those of an older install are tightened too.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for file in (path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal"))):
        with contextlib.suppress(FileNotFoundError):
            if file.stat().st_mode & 0o077:
                file.chmod(0o600)


def _configure_sqlite_connection(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        # Overwritten and deleted values (a credential masked after an upgrade) are zeroed, not left in free pages.
        cursor.execute("PRAGMA secure_delete=ON")
        # WAL makes NORMAL durable against application crashes; only a power loss can drop the last commits.
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


class Transactions:
    """Runs a whole short transaction, written as a plain function of a sync Core :class:`Connection`, in one call.

    aiosqlite runs every DBAPI call (cursor, execute, fetch, close, commit, the rollback on return to the pool) on
    its connection's thread and wakes the event loop after each: a one-statement transaction is five or six thread
    round trips, most of a warm start's time on these machines (measured: claim plus session insert 3.9 ms that
    way, 1.3 ms as one call). For a SQLite file, :meth:`run` hands the whole function to one worker thread with a
    sync engine on the same file (the same pragmas, so the same locking: WAL, busy timeout); the event loop waits
    once. For PostgreSQL and in-memory SQLite (which a second engine would not share) it runs the function through
    the async engine (:meth:`AsyncConnection.run_sync`), each statement one network round trip as before.

    The work gets a Core connection, not an ORM session: the ORM's bulk UPDATE and its unit of work cost about twice
    the statements themselves here (claim plus insert, after the machine sat idle 0.2 s: 2.4 ms through a sync ORM
    session, 1.0 ms through the connection).

    Only for transactions that do not wait on anything but the database: the worker thread is single, so the
    transactions it runs queue behind each other (SQLite has one writer anyway).
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._sync: Engine | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._closed = False
        url = engine.url
        database = url.database or ""
        # A URI name ("file:...") may be a shared in-memory database, which a second engine would not see.
        if url.get_backend_name() == "sqlite" and database not in ("", ":memory:") and not database.startswith("file:"):
            self._sync = create_sync_engine(url.set(drivername="sqlite+pysqlite"))
            event.listen(self._sync, "connect", _configure_sqlite_connection)
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="corral-db")

    @property
    def one_call(self) -> bool:
        """Whether :meth:`run` runs the transaction in one call (a SQLite file), not statement by statement."""
        return self._sync is not None

    async def run(self, work: Callable[[Connection], T]) -> T:
        """``work(connection)`` inside a transaction, committed when it returns and rolled back when it raises."""
        if self._sync is None or self._worker is None or self._closed:
            # After close (a shutdown's stragglers) too: the async engine reconnects, the worker is gone.
            async with self._engine.begin() as connection:
                return await connection.run_sync(work)
        return await asyncio.get_running_loop().run_in_executor(self._worker, self._in_thread, work)

    def _in_thread(self, work: Callable[[Connection], T]) -> T:
        assert self._sync is not None
        with self._sync.begin() as connection:
            return work(connection)

    async def aclose(self) -> None:
        """Let queued transactions finish (waiting off the event loop, which may hold the lock they wait for), then
        close the sync engine's connections. Later :meth:`run` calls go through the async engine."""
        self._closed = True
        if self._worker is not None:
            await asyncio.to_thread(self._worker.shutdown, wait=True)
        if self._sync is not None:
            self._sync.dispose()


def create_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions whose loaded rows stay readable after commit (the repositories copy them into dataclasses)."""
    return async_sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic configuration pointing at the packaged migrations, built without any ini file.

    Args:
        url: Only needed to run Alembic commands outside :func:`migrate` (e.g. ``command.revision(...,
            autogenerate=True)`` from a Python shell); :func:`migrate` hands Alembic its open connection instead.
    """
    config = Config()
    # ConfigParser interpolates "%"; escape it so unusual install paths or passwords survive.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if url is not None:
        rendered = async_url(url).render_as_string(hide_password=False)
        config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


async def migrate(engine: AsyncEngine) -> None:
    """Upgrade the database behind ``engine`` to the newest revision; a no-op when it is already there."""
    async with engine.begin() as connection:
        await connection.run_sync(_upgrade_to_head)


def _upgrade_to_head(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        # Several servers starting at once on one database migrate one after another; the lock ends with the
        # transaction. (SQLite's single writer lock already serializes them.)
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
