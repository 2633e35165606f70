"""The API's error codes mapped back to Corral's typed errors, through one table.

The server sends ``{"error": {"code", "message", "details"}}``; :func:`error_from_response` raises the class whose
``code`` it is, with the server's message and details unchanged, so ``except WorkspaceNotFoundError`` (or ``except
LookupError``) works the same on both sides of the wire. Every class comes from :mod:`corral.errors`, which imports
nothing of the server. Codes the table does not know become a plain :class:`~corral.errors.CorralError` whose
``code`` and ``http_status`` are the server's.

Three errors exist only on the client side::

    CorralError
    ├── CorralConnectionError (ConnectionError)   the server could not be reached (refused, DNS, reset)
    ├── CorralTimeoutError (TimeoutError)         no answer within the client's timeout
    └── AuthenticationError (PermissionError)     401: the token is missing or wrong
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from corral.client._token import missing_token_message
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
)

__all__ = [
    "ERROR_CODES",
    "AuthenticationError",
    "CorralConnectionError",
    "CorralTimeoutError",
    "error_class",
    "error_from_json",
    "error_from_response",
    "transport_error",
]


class CorralConnectionError(CorralError, ConnectionError):
    """The Corral server could not be reached (connection refused, unknown host, connection reset)."""

    code = "connection_error"
    http_status = 0


class CorralTimeoutError(CorralError, TimeoutError):
    """The server did not answer within the client's timeout."""

    code = "request_timeout"
    http_status = 0


class AuthenticationError(CorralError, PermissionError):
    """The server refused the token (401): set ``CORRAL_API_TOKEN`` or pass ``token=``."""

    code = "unauthorized"
    http_status = 401


# code -> class, for every code the server sends with a class of its own; the rest (``not_found`` for an unknown
# route, ``method_not_allowed``, ``payload_too_large``, ``http_error``) come back as a plain CorralError.
ERROR_CODES: Mapping[str, type[CorralError]] = {
    "internal_error": CorralError,
    # workspaces and their providers
    "invalid_request": InvalidRequestError,
    "provider_not_found": ProviderNotFoundError,
    "provider_not_allowed": ProviderNotAllowedError,
    "provider_unavailable": ProviderUnavailableError,
    "all_providers_failed": AllProvidersFailedError,
    "workspace_not_found": WorkspaceNotFoundError,
    "snapshot_not_found": SnapshotNotFoundError,
    "workspace_destroyed": WorkspaceDestroyedError,
    "workspace_state_conflict": WorkspaceStateError,
    "workspace_broken": WorkspaceBrokenError,
    "too_many_requests": TooManyRequestsError,
    "exec_timeout": ExecTimeoutError,
    "resource_limit": ResourceLimitError,
    "file_operation_failed": FileOperationError,
    "file_not_found": WorkspaceFileNotFoundError,
    # agent tools and their policy
    "tool_error": ToolError,
    "tool_not_allowed": ToolNotAllowedError,
    "unknown_tool": UnknownToolError,
    # agent types and sessions
    "agent_type_not_found": AgentTypeNotFoundError,
    "agent_type_in_use": AgentTypeInUseError,
    "session_not_found": SessionNotFoundError,
    "no_workspace": NoWorkspaceError,
    "session_state_conflict": SessionStateError,
    "session_degraded": SessionDegradedError,
    "checkout_failed": CheckoutError,
    "credential_unavailable": CredentialUnavailableError,
    # the HTTP layer and this client
    "unauthorized": AuthenticationError,
}

# Attributes some error classes set in their own __init__, restored from ``details`` when present.
_DETAIL_ATTRIBUTES = ("provider", "reason", "tool")


def error_class(code: str) -> type[CorralError] | None:
    """The class for an API error code, or None when the table does not know it."""
    return ERROR_CODES.get(code)


def _rebuild(cls: type[CorralError], message: str, details: dict[str, Any]) -> CorralError:
    """An instance of ``cls`` carrying the server's exact message and details.

    Several classes build their message in ``__init__`` from other arguments (``ProviderUnavailableError(provider,
    reason)``, ``ToolNotAllowedError(tool)``...); the server already did that, so the instance is created without
    calling the class's own ``__init__`` and the attributes it would set are taken from ``details``.
    """
    exc = cls.__new__(cls)
    CorralError.__init__(exc, message, details=details)
    for attribute in _DETAIL_ATTRIBUTES:
        if attribute in details:
            setattr(exc, attribute, details[attribute])
    attempts = details.get("attempts")
    if isinstance(attempts, list):
        exc.attempts = [  # type: ignore[attr-defined]  # AllProvidersFailedError's (provider, reason) pairs
            (str(a.get("provider")), str(a.get("error"))) for a in attempts if isinstance(a, dict)
        ]
    return exc


def error_from_json(error: Mapping[str, Any]) -> CorralError:
    """The typed error for an ``{"code", "message", "details"}`` object (a streamed answer's last line)."""
    code = str(error.get("code"))
    message = str(error.get("message") or code)
    details = error.get("details")
    cls = error_class(code)
    if cls is None:
        exc = CorralError(message, details=details if isinstance(details, dict) else {})
        vars(exc).update(code=code)  # an unknown code is kept as the server said
        return exc
    return _rebuild(cls, message, details if isinstance(details, dict) else {})


def error_from_response(response: httpx.Response) -> CorralError:
    """The typed error for a non-2xx answer (its JSON error body, or the status and text when there is none)."""
    code, message = "http_error", ""
    details: dict[str, Any] = {}
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        code = error["code"]
        message = str(error.get("message") or code)
        raw_details = error.get("details")
        details = raw_details if isinstance(raw_details, dict) else {}
    else:
        text = response.text.strip().replace("\n", " ")[:300]
        message = f"HTTP {response.status_code} from {response.request.url}" + (f": {text}" if text else "")
    if response.status_code == 401 and "authorization" not in response.request.headers:
        # The client found no token at all: say what is missing rather than "wrong token".
        return AuthenticationError(missing_token_message(), details=details)
    cls = error_class(code)
    if cls is None:
        exc = CorralError(message, details=details)
        vars(exc).update(code=code, http_status=response.status_code)  # an unknown code is kept as the server said
        return exc
    return _rebuild(cls, message, details)


def _refused(exc: BaseException) -> bool:
    """Whether a ConnectionRefusedError is behind ``exc`` (the async stack words it "All connection attempts
    failed", the sync one "Connection refused")."""
    seen: BaseException | None = exc
    for _ in range(10):  # the chain is short; the bound guards against cycles
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def transport_error(exc: httpx.TransportError, base_url: str) -> CorralError:
    """A connection or timeout failure as a Corral error whose message says what to check."""
    if isinstance(exc, httpx.TimeoutException):
        return CorralTimeoutError(f"no answer from Corral at {base_url} in time ({type(exc).__name__})")
    reason = str(exc) or type(exc).__name__
    if _refused(exc):
        reason = "connection refused"
    return CorralConnectionError(
        f"cannot reach Corral at {base_url}: {reason} (is `corral serve` running there? set CORRAL_URL)"
    )
