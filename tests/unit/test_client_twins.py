"""The SDK's shape: every async class has a sync twin with the same methods and signatures, every public member is
documented (Google style), and the package exports exactly its public names."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

import corral.client
from corral.client import (
    AgentTypes,
    AsyncAgentTypes,
    AsyncCorral,
    AsyncFiles,
    AsyncSession,
    AsyncSessions,
    AsyncSnapshots,
    AsyncTools,
    AsyncWorkspace,
    AsyncWorkspaces,
    Corral,
    Files,
    Session,
    Sessions,
    Snapshots,
    Tools,
    Workspace,
    Workspaces,
)
from corral.client._sync import ASYNC_NAMES

pytestmark = pytest.mark.unit

TWINS = [
    (AsyncCorral, Corral),
    (AsyncWorkspaces, Workspaces),
    (AsyncWorkspace, Workspace),
    (AsyncFiles, Files),
    (AsyncSnapshots, Snapshots),
    (AsyncAgentTypes, AgentTypes),
    (AsyncSessions, Sessions),
    (AsyncSession, Session),
    (AsyncTools, Tools),
]
IDS = [sync.__name__ for _, sync in TWINS]
DUNDERS = {"__init__", "__repr__", "__enter__", "__exit__", "__aenter__", "__aexit__"}


def _members(cls: type) -> dict[str, Any]:
    """Public methods and properties defined on the class, plus the dunders that make up its behaviour."""
    return {
        name: member
        for name, member in vars(cls).items()
        if (not name.startswith("_") or name in DUNDERS) and (callable(member) or isinstance(member, property))
    }


def _sync_name(name: str) -> str:
    return {v: k for k, v in ASYNC_NAMES.items()}.get(name, name)


def _normalise(annotation: object) -> str:
    """An annotation with the async spelling removed: ``AsyncWorkspace`` reads ``Workspace``,
    ``httpx.AsyncBaseTransport`` reads ``httpx.BaseTransport``."""
    return re.sub(r"Async(?=[A-Z])", "", str(annotation))


def _shape(function: Any) -> list[tuple[str, str, object, str]]:
    signature = inspect.signature(function)
    parameters = [(p.name, p.kind.name, p.default, _normalise(p.annotation)) for p in signature.parameters.values()]
    return [*parameters, ("return", "", None, _normalise(signature.return_annotation))]


@pytest.mark.parametrize(("async_cls", "sync_cls"), TWINS, ids=IDS)
def test_sync_twin_has_the_same_members(async_cls: type, sync_cls: type) -> None:
    """The sync class has exactly the async class's methods and properties (aclose is close, __aenter__ is
    __enter__)."""
    assert {_sync_name(n) for n in _members(async_cls)} == set(_members(sync_cls))


@pytest.mark.parametrize(("async_cls", "sync_cls"), TWINS, ids=IDS)
def test_sync_twin_signatures_match(async_cls: type, sync_cls: type) -> None:
    """Every method takes the same parameters (names, kinds, defaults, types) and returns the same type as its
    async twin, modulo async: async ones are coroutine functions and sync ones are not."""
    sync_members = _members(sync_cls)
    for name, member in _members(async_cls).items():
        twin = sync_members[_sync_name(name)]
        if isinstance(member, property):
            assert isinstance(twin, property), name
            assert _shape(member.fget) == _shape(twin.fget), f"{sync_cls.__name__}.{name}"
            continue
        assert _shape(member) == _shape(twin), f"{sync_cls.__name__}.{name}"
        is_async = inspect.iscoroutinefunction(member)
        assert is_async == (name not in {"__init__", "__repr__"}), f"{async_cls.__name__}.{name} async-ness"
        assert not inspect.iscoroutinefunction(twin), f"{sync_cls.__name__}.{name} must not be async"


@pytest.mark.parametrize("cls", [c for pair in TWINS for c in pair], ids=lambda c: c.__name__)
def test_every_public_member_is_documented_google_style(cls: type) -> None:
    """Classes, methods and properties have docstrings; public methods with parameters describe them under
    ``Args:`` and those returning a value under ``Returns:`` (sync twins share their async twin's text)."""
    assert cls.__doc__, cls.__name__
    for name, member in _members(cls).items():
        doc = (member.fget if isinstance(member, property) else member).__doc__
        assert doc, f"{cls.__name__}.{name} has no docstring"
        if name.startswith("_") or isinstance(member, property):
            continue
        signature = inspect.signature(member)
        if len(signature.parameters) > 1:
            assert "Args:" in doc, f"{cls.__name__}.{name}: no Args section"
        if signature.return_annotation not in ("None", None):
            assert "Returns:" in doc, f"{cls.__name__}.{name}: no Returns section"


def test_package_exports_exactly_its_public_api() -> None:
    """``corral.client.__all__`` lists the clients, their resources, the result values and the typed errors (all of
    corral.errors), and every listed name exists."""
    expected = {
        "DEFAULT_URL", "ERROR_CODES", "error_class",
        "AsyncCorral", "Corral",
        "AsyncWorkspaces", "Workspaces", "AsyncWorkspace", "Workspace", "AsyncFiles", "Files",
        "AsyncSnapshots", "Snapshots", "Snapshot",
        "AsyncAgentTypes", "AgentTypes", "AsyncSessions", "Sessions", "AsyncSession", "Session", "AsyncTools", "Tools",
        "AgentType", "AuditEntry", "BashResult", "ExecResult", "FileInfo", "GitResult", "GlobResult", "GrepMatch",
        "GrepResult", "PoolReport", "PoolStatus", "ProviderAttempt", "ProviderStatus", "ReadResult", "SessionInfo",
        "WorkspaceInfo", "ExecChunk",
        "AuthenticationError", "CorralConnectionError", "CorralTimeoutError",
        "CorralError", "InvalidRequestError", "ProviderNotFoundError", "ProviderNotAllowedError",
        "ProviderUnavailableError", "AllProvidersFailedError", "WorkspaceNotFoundError", "WorkspaceDestroyedError",
        "WorkspaceStateError", "WorkspaceBrokenError", "TooManyRequestsError", "ExecTimeoutError", "ResourceLimitError",
        "FileOperationError", "WorkspaceFileNotFoundError", "ToolError", "ToolNotAllowedError", "UnknownToolError",
        "AgentTypeNotFoundError", "AgentTypeInUseError", "SessionNotFoundError", "NoWorkspaceError",
        "SessionStateError", "SessionDegradedError", "CheckoutError", "CredentialUnavailableError",
        "SnapshotNotFoundError",
    }  # fmt: skip
    assert set(corral.client.__all__) == expected
    assert len(corral.client.__all__) == len(expected), "no duplicates"
    for name in expected:
        assert hasattr(corral.client, name), name
