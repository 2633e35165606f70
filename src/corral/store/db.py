"""Engines, sessions and migrations.

:func:`create_engine` turns a database URL into an async engine (SQLite through aiosqlite, PostgreSQL through
asyncpg) tuned for how Corral uses it; :func:`migrate` brings the schema to the newest Alembic revision. Alembic is
configured in code (:func:`alembic_config`), so no ``alembic.ini`` is needed at runtime.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

__all__ = [
    "MIGRATIONS_DIR",
    "SQLITE_BUSY_TIMEOUT_MS",
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
