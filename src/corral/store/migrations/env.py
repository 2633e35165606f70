"""Alembic environment for Corral's store.

At runtime :func:`corral.store.db.migrate` passes an open connection in ``config.attributes["connection"]``. For
authoring revisions, build the config with ``corral.store.db.alembic_config(url)`` and call Alembic's ``command``
functions; then this module opens its own async engine from ``sqlalchemy.url`` (or renders SQL offline).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection, pool
from sqlalchemy.ext.asyncio import create_async_engine

from corral.store.models import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def _render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    # New revisions should not import the models: render UTCDateTime as the column type it stands for.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode lets later revisions rebuild tables there.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection and no sqlalchemy.url: build the config with corral.store.db.alembic_config")
    return url


async def _run_with_own_engine() -> None:
    engine = create_async_engine(_url(), poolclass=pool.NullPool)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


def run_migrations_offline() -> None:
    """Render the migration SQL without a database."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against the connection :func:`corral.store.db.migrate` gave, or a fresh engine."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
    else:
        asyncio.run(_run_with_own_engine())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
