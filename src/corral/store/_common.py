"""What every repository shares: new ids, database error translation, SET clauses and two shared statements.

:func:`database_errors` turns a constraint violation into :class:`~corral.errors.InvalidRequestError` naming the
offending value (a duplicate agent-type name, a duplicate id, an unknown agent type) and any other database failure
into a :class:`~corral.errors.CorralError` whose message names the failure without the URL's password.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import ColumnElement, Label, Table, inspect, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from corral.errors import CorralError, InvalidRequestError
from corral.store.models import AgentTypeRow, SessionRow, SnapshotRow, WorkspaceRow, utcnow
from corral.store.records import UNSET, ProviderAttempt, Unset

__all__ = [
    "append_warnings",
    "attempt_dicts",
    "database_errors",
    "finish_when_cancelled",
    "first_line",
    "given",
    "new_id",
    "plain",
    "row_columns",
    "status_list",
    "table",
    "update_returning",
]


P = ParamSpec("P")
R = TypeVar("R")


def finish_when_cancelled(write: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Run a repository write to its commit or rollback even when the caller is cancelled, then re-raise.

    Cancelling a coroutine in the middle of an aiosqlite transaction leaves the connection out of the pool with the
    transaction open, and SQLite's write lock held until garbage collection: every later writer then waits its busy
    timeout and fails with "database is locked" (a session ended while its provisioning task was writing did). The
    write runs in its own task, shielded; a cancelled caller waits for it (a repeated cancel too) and then raises.
    """

    @functools.wraps(write)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        task = asyncio.ensure_future(write(*args, **kwargs))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            while not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    continue
                except BaseException:  # the caller was cancelled: that is what it hears, not the failure
                    break
            raise

    return wrapper


def new_id() -> str:
    """A new 32-character hex id."""
    return uuid.uuid4().hex


# --- error translation ----------------------------------------------------------------------------------------------


@contextmanager
def database_errors(integrity: Mapping[str, str] | None = None) -> Iterator[None]:
    """Translate SQLAlchemy errors raised inside the block into Corral errors.

    Args:
        integrity: For an ``IntegrityError``: the first entry whose key occurs (case-insensitively) in the driver's
            message gives the :class:`InvalidRequestError` message. Keys are constraint or column names, which
            SQLite (``table.column``) and PostgreSQL (constraint name) put in their messages. Without a match the
            message reports the driver's own text.
    """
    try:
        yield
    except IntegrityError as exc:
        text = str(exc.orig).lower()
        for needle, message in (integrity or {}).items():
            if needle.lower() in text:
                raise InvalidRequestError(message) from exc
        raise InvalidRequestError(f"the change breaks a database constraint: {first_line(exc)}") from exc
    except SQLAlchemyError as exc:
        raise CorralError(f"database operation failed: {type(exc).__name__}: {first_line(exc)}") from exc
    except OSError as exc:  # asyncpg raises the socket error itself when the server is unreachable
        raise CorralError(f"cannot reach the database: {exc}") from exc


def first_line(exc: BaseException) -> str:
    """The first line of the driver's message (or of ``exc``'s), for error messages."""
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0] if text else type(exc).__name__


def given(
    fields: Mapping[InstrumentedAttribute[Any], Any], *, updated_at: InstrumentedAttribute[datetime], now: datetime
) -> dict[InstrumentedAttribute[Any], Any]:
    """The SET clause of an update: the fields given (not :data:`UNSET`), plus ``updated_at``."""
    values = {column: value for column, value in fields.items() if value is not UNSET}
    values[updated_at] = now
    return values


def plain(value: Any) -> Any:
    """A fresh JSON-ready copy: mappings become dicts and sequences lists; :data:`UNSET` passes through."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return value


def attempt_dicts(attempts: Sequence[ProviderAttempt] | Unset) -> list[dict[str, str]] | Unset:
    """The JSON form of ``provider_attempts``; :data:`UNSET` passes through."""
    if isinstance(attempts, Unset):
        return attempts
    return [{"provider": a.provider, "error": a.error} for a in attempts]


def status_list(status: str | Collection[str] | None) -> list[str] | None:
    """A ``status`` filter (one status or several) as a list; ``None`` means no filter."""
    if status is None:
        return None
    return [status] if isinstance(status, str) else list(status)


# --- shared statements ----------------------------------------------------------------------------------------------

_RowT = TypeVar("_RowT", WorkspaceRow, AgentTypeRow, SessionRow, SnapshotRow)
_WarnedRowT = TypeVar("_WarnedRowT", WorkspaceRow, SessionRow)


@functools.cache
def row_columns(model: type[_RowT]) -> tuple[Label[Any], ...]:
    """Every column of ``model``'s table labelled with its attribute's name, for a Core statement's ``RETURNING``:
    the rows it returns read like the model's (``row.metadata_``), so a record's ``_from_row`` takes either."""
    return tuple(attribute.columns[0].label(attribute.key) for attribute in inspect(model).column_attrs)


def table(model: type[_RowT]) -> Table:
    """``model``'s table, for Core statements."""
    return model.metadata.tables[model.__tablename__]


async def update_returning(
    session: AsyncSession, model: type[_RowT], where: ColumnElement[bool], values: Mapping[Any, Any]
) -> _RowT | None:
    """``UPDATE model SET values WHERE where RETURNING *`` as one statement; the first updated row or ``None``."""
    statement = update(model).where(where).values(dict(values)).returning(model)
    result = await session.scalars(statement, execution_options={"synchronize_session": False})
    return result.first()


async def append_warnings(
    session: AsyncSession, model: type[_WarnedRowT], row_id: str, warnings: Sequence[str]
) -> _WarnedRowT | None:
    # Touch the row first: that takes its lock (PostgreSQL) or the database write lock (SQLite) before the read, so
    # the warnings read below are the latest and nobody can append between our read and our write.
    current = await session.scalar(
        update(model).where(model.id == row_id).values(updated_at=utcnow()).returning(model.warnings),
        execution_options={"synchronize_session": False},
    )
    if current is None:
        return None
    existing: list[str] = list(current)
    merged = existing + [w for w in dict.fromkeys(warnings) if w not in existing]
    return await update_returning(session, model, model.id == row_id, {model.warnings: merged})
