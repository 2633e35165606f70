"""Corral's error tree.

Every error Corral raises on purpose derives from :class:`CorralError`. Leaves also inherit the builtin they
resemble, so ``except TimeoutError`` or ``except LookupError`` keeps working for callers who do not know Corral::

    CorralError
    ├── InvalidRequestError (ValueError)          bad input: the message names the field and what is allowed
    ├── ProviderNotFoundError (LookupError)       a provider name that is not registered
    ├── ProviderNotAllowedError                   a provider the operator has not enabled (plain docker by default)
    ├── ProviderUnavailableError                  the backend cannot serve now (daemon down, runtime missing, KVM...)
    │   └── AllProvidersFailedError               auto selection tried every provider; lists each one's reason
    ├── SandboxNotFoundError (LookupError)        no such workspace (or it vanished from the runtime)
    ├── SandboxDestroyedError                     the workspace existed and has been destroyed
    ├── WorkspaceStateError                       the operation does not fit the workspace's state (exec on stopped)
    ├── WorkspaceBrokenError                      its agent broke the protocol (502); the workspace is marked error
    ├── TooManyRequestsError                      a workspace's exec queue is full (429); retry later
    ├── ExecTimeoutError (TimeoutError)           a command passed its deadline and was killed
    ├── ResourceLimitError                        a limit was hit or a request asks for more than can be given
    ├── FileOperationError (OSError)              a file operation failed inside the workspace
    │   ├── WorkspaceFileNotFoundError (FileNotFoundError)
    │   └── NotADirectoryError_ / IsADirectoryError_ are reported as FileOperationError with errno text
    └── ToolError                                 an agent tool refused or failed (see corral.tools)

Each class carries ``code`` (the stable snake_case code of the HTTP API) and ``http_status``. Vendor errors (Docker,
httpx, SQLAlchemy) are translated at the provider or store boundary with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AllProvidersFailedError",
    "CorralError",
    "ExecTimeoutError",
    "FileOperationError",
    "InvalidRequestError",
    "ProviderNotAllowedError",
    "ProviderNotFoundError",
    "ProviderUnavailableError",
    "ResourceLimitError",
    "SandboxDestroyedError",
    "SandboxNotFoundError",
    "TooManyRequestsError",
    "ToolError",
    "WorkspaceBrokenError",
    "WorkspaceFileNotFoundError",
    "WorkspaceStateError",
]


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


class SandboxNotFoundError(CorralError, LookupError):
    """The workspace does not exist (or its runtime object vanished)."""

    code = "workspace_not_found"
    http_status = 404


class SandboxDestroyedError(CorralError):
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
