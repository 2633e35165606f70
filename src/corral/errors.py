"""Corral's error tree: every error a client of the HTTP API (or the SDK) can see.

Every error Corral raises on purpose derives from :class:`CorralError`. Leaves also inherit the builtin they
resemble, so ``except TimeoutError`` or ``except LookupError`` keeps working for callers who do not know Corral.
Each class carries ``code`` (the stable snake_case code of the HTTP API) and ``http_status``::

    class                                      status  code                      meaning
    CorralError                                500     internal_error            the root; a failure nobody expected
    ├── InvalidRequestError (ValueError)       400     invalid_request           bad input: names the field and rule
    ├── ProviderNotFoundError (LookupError)    400     provider_not_found        a provider name not registered
    ├── ProviderNotAllowedError                403     provider_not_allowed      not enabled (plain docker by default)
    ├── ProviderUnavailableError               503     provider_unavailable      daemon down, runtime missing, KVM...
    │   └── AllProvidersFailedError            503     all_providers_failed      auto selection: every reason listed
    ├── WorkspaceNotFoundError (LookupError)   404     workspace_not_found       no such workspace (or it vanished)
    ├── SnapshotNotFoundError (LookupError)    404     snapshot_not_found        no snapshot with that id
    ├── WorkspaceDestroyedError                410     workspace_destroyed       it existed and has been destroyed
    ├── WorkspaceStateError                    409     workspace_state_conflict  wrong state (exec on stopped)
    ├── WorkspaceBrokenError                   502     workspace_broken          its agent broke the protocol
    ├── TooManyRequestsError                   429     too_many_requests         the exec queue is full; retry later
    ├── ExecTimeoutError (TimeoutError)        504     exec_timeout              a command passed its deadline
    ├── ResourceLimitError                     422     resource_limit            a limit hit, or more than can be given
    ├── FileOperationError (OSError)           400     file_operation_failed     a file operation failed (errno text)
    │   └── WorkspaceFileNotFoundError         404     file_not_found            no such path (a FileNotFoundError)
    ├── ToolError                              400     tool_error                an agent tool refused or failed
    │   ├── ToolNotAllowedError                403     tool_not_allowed          not enabled for the agent type
    │   └── UnknownToolError                   404     unknown_tool              no tool of that name
    ├── AgentTypeNotFoundError (LookupError)   404     agent_type_not_found      no agent type with that id
    ├── AgentTypeInUseError                    409     agent_type_in_use         live sessions: cannot delete it
    ├── SessionNotFoundError (LookupError)     404     session_not_found         no session with that id
    ├── NoWorkspaceError                       404     no_workspace              the agent type has no workspace
    ├── SessionStateError                      409     session_state_conflict    provisioning or ended: no tool calls
    ├── SessionDegradedError                   409     session_degraded          runs without its workspace
    ├── CheckoutError                          422     checkout_failed           the repository could not be checked out
    └── CredentialUnavailableError             409     credential_unavailable    a sealed credential cannot be opened

The SDK (:mod:`corral.client`) maps each code back to its class and adds three errors of its own (connection,
timeout, 401). Vendor errors (Docker, httpx, SQLAlchemy, git) are translated at the provider, store or checkout
boundary with ``raise ... from exc``. The Firecracker manager (:mod:`corral.microvm`) keeps its own internal errors
(``FirecrackerAPIError``, ``VsockConnectError``, ``NetworkError``, ``DiskError``...): its only client is the
Firecracker provider, which turns them into :class:`ProviderUnavailableError`. The E2B-compatible API answers in
E2B's own error shapes.

``SandboxNotFoundError`` and ``SandboxDestroyedError`` are the old names of :class:`WorkspaceNotFoundError` and
:class:`WorkspaceDestroyedError`: still importable for one release, with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final

__all__ = [
    "AgentTypeInUseError",
    "AgentTypeNotFoundError",
    "AllProvidersFailedError",
    "CheckoutError",
    "CorralError",
    "CredentialUnavailableError",
    "ExecTimeoutError",
    "FileOperationError",
    "InvalidRequestError",
    "NoWorkspaceError",
    "ProviderNotAllowedError",
    "ProviderNotFoundError",
    "ProviderUnavailableError",
    "ResourceLimitError",
    "SessionDegradedError",
    "SessionNotFoundError",
    "SessionStateError",
    "SnapshotNotFoundError",
    "TooManyRequestsError",
    "ToolError",
    "ToolNotAllowedError",
    "UnknownToolError",
    "WorkspaceBrokenError",
    "WorkspaceDestroyedError",
    "WorkspaceFileNotFoundError",
    "WorkspaceNotFoundError",
    "WorkspaceStateError",
]

_RENAMED: Final[Mapping[str, str]] = {
    "SandboxNotFoundError": "WorkspaceNotFoundError",
    "SandboxDestroyedError": "WorkspaceDestroyedError",
}
"""Old error names (old -> new), importable from here and from :mod:`corral.client` until the next release."""


class CorralError(Exception):
    """Root of every error Corral raises on purpose."""

    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}

    def to_json(self) -> dict[str, Any]:
        """The body the HTTP API sends for this error."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidRequestError(CorralError, ValueError):
    """The request is malformed; the message says which field and what is allowed."""

    code = "invalid_request"
    http_status = 400


class ProviderNotFoundError(CorralError, LookupError):
    """No provider is registered under that name."""

    code = "provider_not_found"
    http_status = 400


class ProviderNotAllowedError(CorralError):
    """The provider is registered but this server does not allow it (plain Docker without
    CORRAL_ALLOW_DOCKER_FALLBACK=true); the message names the setting that enables it."""

    code = "provider_not_allowed"
    http_status = 403


class ProviderUnavailableError(CorralError):
    """The provider exists but cannot serve now (runtime missing, daemon unreachable, KVM unusable)."""

    code = "provider_unavailable"
    http_status = 503

    def __init__(self, provider: str, reason: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{provider}: {reason}", details={"provider": provider, "reason": reason, **(details or {})})
        self.provider = provider
        self.reason = reason


class AllProvidersFailedError(ProviderUnavailableError):
    """Every provider in the fallback chain failed; ``attempts`` holds each provider and its reason."""

    code = "all_providers_failed"

    def __init__(self, attempts: list[tuple[str, str]]) -> None:
        listing = "; ".join(f"{name}: {reason}" for name, reason in attempts) or (
            "no provider that auto selection may use is configured"
        )
        CorralError.__init__(
            self,
            f"no provider could create the workspace ({listing})",
            details={"attempts": [{"provider": n, "error": r} for n, r in attempts]},
        )
        self.provider = "auto"
        self.reason = listing
        self.attempts = attempts


class WorkspaceNotFoundError(CorralError, LookupError):
    """The workspace does not exist (or its runtime object vanished)."""

    code = "workspace_not_found"
    http_status = 404


class SnapshotNotFoundError(CorralError, LookupError):
    """No snapshot with that id (never taken, or deleted)."""

    code = "snapshot_not_found"
    http_status = 404


class WorkspaceDestroyedError(CorralError):
    """The workspace existed and has been destroyed."""

    code = "workspace_destroyed"
    http_status = 410


class WorkspaceStateError(CorralError):
    """The operation does not fit the workspace's current state, e.g. exec on a stopped workspace."""

    code = "workspace_state_conflict"
    http_status = 409


class WorkspaceBrokenError(CorralError):
    """The workspace's agent broke the protocol (an oversized or garbage frame): something inside drives it.

    The connection was closed and the workspace is marked ``error``; resuming it restarts it with a fresh agent.
    """

    code = "workspace_broken"
    http_status = 502


class TooManyRequestsError(CorralError):
    """More concurrent work was asked of one workspace than it queues; retry later."""

    code = "too_many_requests"
    http_status = 429


class ExecTimeoutError(CorralError, TimeoutError):
    """A command ran past its deadline; its process group was killed. Partial output is kept."""

    code = "exec_timeout"
    http_status = 504

    def __init__(self, message: str, *, stdout: bytes = b"", stderr: bytes = b"", duration_ms: float = 0.0) -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr
        self.duration_ms = duration_ms


class ResourceLimitError(CorralError):
    """A resource limit was reached, or a request asks for more than the provider can give."""

    code = "resource_limit"
    http_status = 422


class FileOperationError(CorralError, OSError):
    """A file operation inside the workspace failed; the message carries the path and the reason."""

    code = "file_operation_failed"
    http_status = 400


class WorkspaceFileNotFoundError(FileOperationError, FileNotFoundError):
    """The path does not exist inside the workspace."""

    code = "file_not_found"
    http_status = 404


class ToolError(CorralError):
    """An agent tool refused the call or could not complete it."""

    code = "tool_error"
    http_status = 400


class ToolNotAllowedError(ToolError):
    """The tool exists but the session's agent type does not enable it."""

    code = "tool_not_allowed"
    http_status = 403

    def __init__(self, tool: str) -> None:
        super().__init__(f"Tool '{tool}' is not enabled for this agent type", details={"tool": tool})
        self.tool = tool


class UnknownToolError(ToolError):
    """No tool of that name exists."""

    code = "unknown_tool"
    http_status = 404

    def __init__(self, tool: str, valid: Iterable[str]) -> None:
        valid = list(valid)
        super().__init__(
            f"Unknown tool {tool!r}; valid tools: {', '.join(valid)}", details={"tool": tool, "valid_tools": valid}
        )
        self.tool = tool


class AgentTypeNotFoundError(CorralError, LookupError):
    """No agent type with that id."""

    code = "agent_type_not_found"
    http_status = 404


class AgentTypeInUseError(CorralError):
    """The agent type has sessions still provisioning or active; ``details.sessions`` names them."""

    code = "agent_type_in_use"
    http_status = 409


class SessionNotFoundError(CorralError, LookupError):
    """No session with that id."""

    code = "session_not_found"
    http_status = 404


class NoWorkspaceError(CorralError):
    """The session's agent type has no workspace, so there are no tools to call."""

    code = "no_workspace"
    http_status = 404


class SessionStateError(CorralError):
    """The session cannot take tool calls now (provisioning, ended)."""

    code = "session_state_conflict"
    http_status = 409


class SessionDegradedError(CorralError):
    """The session runs without its workspace (provisioning failed); the message says why."""

    code = "session_degraded"
    http_status = 409


class CheckoutError(CorralError):
    """The repository could not be checked out; the message says why (bad URL, missing branch, auth)."""

    code = "checkout_failed"
    http_status = 422


class CredentialUnavailableError(CorralError):
    """A sealed credential cannot be opened: the key changed (``CORRAL_SECRET_KEY``, ``secret-key``) or it was
    tampered with. The credential must be given again."""

    code = "credential_unavailable"
    http_status = 409


# --- old names --------------------------------------------------------------------------------------------------------


def _deprecated(module: str, name: str) -> type[CorralError]:
    """The class an old name stands for, after a DeprecationWarning; for the ``__getattr__`` of the modules that
    exported the old names (this one and :mod:`corral.client`)."""
    new = _RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is deprecated and goes away in the next release; use {module}.{new}",
        DeprecationWarning,
        stacklevel=3,  # the code that named the old attribute, past this helper and the module's __getattr__
    )
    cls: type[CorralError] = globals()[new]
    return cls


def __getattr__(name: str) -> type[CorralError]:
    """The old names (``SandboxNotFoundError``...), with a DeprecationWarning."""
    return _deprecated(__name__, name)
