"""The Python SDK for Corral's HTTP API: :class:`AsyncCorral` first, and :class:`Corral`, its synchronous twin.

Example::

    from corral.client import AsyncCorral

    async with AsyncCorral() as corral:  # CORRAL_URL and CORRAL_API_TOKEN from the environment
        async with await corral.workspaces.create(provider="gvisor") as ws:
            result = await ws.exec("echo hi")
            await ws.files.write("notes/todo.txt", "ship it\\n")

Errors the server reports come back as Corral's typed errors (``WorkspaceNotFoundError``, ``ToolNotAllowedError``,
``ProviderUnavailableError``...), mapped from the API's error codes through one table (:data:`ERROR_CODES`); every
class of :mod:`corral.errors` is re-exported here, so ``from corral.client import WorkspaceNotFoundError`` works.
The old names ``SandboxNotFoundError`` and ``SandboxDestroyedError`` still work for one release, with a
:class:`DeprecationWarning`.
"""

from typing import Any

from corral.client._api import DEFAULT_URL
from corral.client._async import (
    AsyncAgentTypes,
    AsyncCorral,
    AsyncFiles,
    AsyncSession,
    AsyncSessions,
    AsyncSnapshots,
    AsyncTools,
    AsyncWorkspace,
    AsyncWorkspaces,
)
from corral.client._errors import (
    ERROR_CODES,
    AuthenticationError,
    CorralConnectionError,
    CorralTimeoutError,
    error_class,
)
from corral.client._models import (
    AgentType,
    AuditEntry,
    BashResult,
    ExecChunk,
    ExecResult,
    FileInfo,
    GitResult,
    GlobResult,
    GrepMatch,
    GrepResult,
    PoolReport,
    PoolStatus,
    ProviderAttempt,
    ProviderStatus,
    ReadResult,
    SessionInfo,
    Snapshot,
    WorkspaceInfo,
)
from corral.client._sync import (
    AgentTypes,
    Corral,
    Files,
    Session,
    Sessions,
    Snapshots,
    Tools,
    Workspace,
    Workspaces,
)
from corral.errors import (
    AgentTypeInUseError,
    AgentTypeNotFoundError,
    AllProvidersFailedError,
    CheckoutError,
    CorralError,
    CredentialUnavailableError,
    ExecTimeoutError,
    FileOperationError,
    InvalidRequestError,
    NoWorkspaceError,
    ProviderNotAllowedError,
    ProviderNotFoundError,
    ProviderUnavailableError,
    ResourceLimitError,
    SessionDegradedError,
    SessionNotFoundError,
    SessionStateError,
    SnapshotNotFoundError,
    ToolError,
    ToolNotAllowedError,
    TooManyRequestsError,
    UnknownToolError,
    WorkspaceBrokenError,
    WorkspaceDestroyedError,
    WorkspaceFileNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
    _deprecated,
)

__all__ = [
    "DEFAULT_URL",
    "ERROR_CODES",
    "AgentType",
    "AgentTypeInUseError",
    "AgentTypeNotFoundError",
    "AgentTypes",
    "AllProvidersFailedError",
    "AsyncAgentTypes",
    "AsyncCorral",
    "AsyncFiles",
    "AsyncSession",
    "AsyncSessions",
    "AsyncSnapshots",
    "AsyncTools",
    "AsyncWorkspace",
    "AsyncWorkspaces",
    "AuditEntry",
    "AuthenticationError",
    "BashResult",
    "CheckoutError",
    "Corral",
    "CorralConnectionError",
    "CorralError",
    "CorralTimeoutError",
    "CredentialUnavailableError",
    "ExecChunk",
    "ExecResult",
    "ExecTimeoutError",
    "FileInfo",
    "FileOperationError",
    "Files",
    "GitResult",
    "GlobResult",
    "GrepMatch",
    "GrepResult",
    "InvalidRequestError",
    "NoWorkspaceError",
    "PoolReport",
    "PoolStatus",
    "ProviderAttempt",
    "ProviderNotAllowedError",
    "ProviderNotFoundError",
    "ProviderStatus",
    "ProviderUnavailableError",
    "ReadResult",
    "ResourceLimitError",
    "Session",
    "SessionDegradedError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionStateError",
    "Sessions",
    "Snapshot",
    "SnapshotNotFoundError",
    "Snapshots",
    "TooManyRequestsError",
    "ToolError",
    "ToolNotAllowedError",
    "Tools",
    "UnknownToolError",
    "Workspace",
    "WorkspaceBrokenError",
    "WorkspaceDestroyedError",
    "WorkspaceFileNotFoundError",
    "WorkspaceInfo",
    "WorkspaceNotFoundError",
    "WorkspaceStateError",
    "Workspaces",
    "error_class",
]


def __getattr__(name: str) -> Any:
    """The deprecated error names (``SandboxNotFoundError``...), with a DeprecationWarning."""
    return _deprecated(__name__, name)
