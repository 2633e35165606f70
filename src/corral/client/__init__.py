"""The Python SDK for Corral's HTTP API: :class:`AsyncCorral` first, and :class:`Corral`, its synchronous twin.

Example::

    from corral.client import AsyncCorral

    async with AsyncCorral() as corral:  # CORRAL_URL and CORRAL_API_TOKEN from the environment
        async with await corral.workspaces.create(provider="gvisor") as ws:
            result = await ws.exec("echo hi")
            await ws.files.write("notes/todo.txt", "ship it\\n")

Errors the server reports come back as Corral's typed errors (``SandboxNotFoundError``, ``ToolNotAllowedError``,
``ProviderUnavailableError``...), mapped from the API's error codes through one table (:data:`ERROR_CODES`); they are
re-exported here, so ``from corral.client import SandboxNotFoundError`` works.
"""

from corral.client._api import DEFAULT_URL
from corral.client._async import (
    AsyncAgentTypes,
    AsyncCorral,
    AsyncFiles,
    AsyncSession,
    AsyncSessions,
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
    WorkspaceInfo,
)
from corral.client._sync import AgentTypes, Corral, Files, Session, Sessions, Tools, Workspace, Workspaces
from corral.errors import (
    AllProvidersFailedError,
    CorralError,
    ExecTimeoutError,
    FileOperationError,
    InvalidRequestError,
    ProviderNotFoundError,
    ProviderUnavailableError,
    ResourceLimitError,
    SandboxDestroyedError,
    SandboxNotFoundError,
    ToolError,
    WorkspaceFileNotFoundError,
    WorkspaceStateError,
)
from corral.tools.errors import ToolNotAllowedError, UnknownToolError

__all__ = [
    "DEFAULT_URL",
    "ERROR_CODES",
    "AgentType",
    "AgentTypes",
    "AllProvidersFailedError",
    "AsyncAgentTypes",
    "AsyncCorral",
    "AsyncFiles",
    "AsyncSession",
    "AsyncSessions",
    "AsyncTools",
    "AsyncWorkspace",
    "AsyncWorkspaces",
    "AuditEntry",
    "AuthenticationError",
    "BashResult",
    "Corral",
    "CorralConnectionError",
    "CorralError",
    "CorralTimeoutError",
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
    "PoolReport",
    "PoolStatus",
    "ProviderAttempt",
    "ProviderNotFoundError",
    "ProviderStatus",
    "ProviderUnavailableError",
    "ReadResult",
    "ResourceLimitError",
    "SandboxDestroyedError",
    "SandboxNotFoundError",
    "Session",
    "SessionInfo",
    "Sessions",
    "ToolError",
    "ToolNotAllowedError",
    "Tools",
    "UnknownToolError",
    "Workspace",
    "WorkspaceFileNotFoundError",
    "WorkspaceInfo",
    "WorkspaceStateError",
    "Workspaces",
    "error_class",
]
