"""The SDK maps the API's error codes back to Corral's typed errors through one table, keeps unknown codes, and turns
transport failures into one-line Corral errors; async and sync clients alike."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from corral.client import (
    ERROR_CODES,
    AsyncCorral,
    AsyncSession,
    AuthenticationError,
    Corral,
    CorralConnectionError,
    CorralTimeoutError,
    SessionInfo,
    error_class,
)
from corral.errors import (
    AllProvidersFailedError,
    CorralError,
    InvalidRequestError,
    ProviderNotFoundError,
    ProviderUnavailableError,
    SandboxDestroyedError,
    SandboxNotFoundError,
    WorkspaceFileNotFoundError,
)
from corral.tools.errors import ToolNotAllowedError

pytestmark = pytest.mark.unit


def _answering(status: int, body: Any = None, *, text: str | None = None) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handler)


def _error(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_every_code_in_the_table_names_a_class_with_that_code(code: str) -> None:
    """Each table entry resolves (lazy ones included) to a CorralError subclass whose ``code`` is the key."""
    cls = error_class(code)
    assert cls is not None and issubclass(cls, CorralError)
    assert cls.code == code


@pytest.mark.parametrize(
    ("status", "code", "expected", "builtin"),
    [
        (404, "workspace_not_found", SandboxNotFoundError, LookupError),
        (410, "workspace_destroyed", SandboxDestroyedError, CorralError),
        (400, "provider_not_found", ProviderNotFoundError, LookupError),
        (503, "provider_unavailable", ProviderUnavailableError, CorralError),
        (503, "all_providers_failed", AllProvidersFailedError, ProviderUnavailableError),
        (400, "invalid_request", InvalidRequestError, ValueError),
        (404, "file_not_found", WorkspaceFileNotFoundError, FileNotFoundError),
        (403, "tool_not_allowed", ToolNotAllowedError, CorralError),
        (401, "unauthorized", AuthenticationError, PermissionError),
    ],
)
async def test_api_error_codes_raise_their_typed_error(
    status: int, code: str, expected: type[CorralError], builtin: type[Exception]
) -> None:
    """An error body raises the class of its code, which is also the builtin it resembles, with the server's
    message and details unchanged."""
    body = _error(code, f"the {code} message", {"field": "x"})
    async with AsyncCorral("http://corral.test", "t", transport=_answering(status, body)) as client:
        with pytest.raises(expected) as caught:
            await client.workspaces.get("w1")
    assert type(caught.value) is expected
    assert isinstance(caught.value, builtin)
    assert (caught.value.code, caught.value.message, caught.value.details) == (code, f"the {code} message",
                                                                               {"field": "x"})  # fmt: skip


def test_the_sync_client_raises_the_same_errors() -> None:
    """The sync twin maps codes through the same table."""
    body = _error("workspace_not_found", "workspace 'w1' does not exist")
    with (
        Corral("http://corral.test", "t", transport=_answering(404, body)) as client,
        pytest.raises(SandboxNotFoundError, match="workspace 'w1' does not exist"),
    ):
        client.workspaces.get("w1")


async def test_refused_tool_keeps_the_servers_sentence_and_the_tool() -> None:
    """``tool_not_allowed`` becomes ToolNotAllowedError whose str is the server's sentence, with ``tool`` set."""
    message = "Tool 'bash' is not enabled for this agent type"
    body = _error("tool_not_allowed", message, {"tool": "bash"})
    async with AsyncCorral("http://corral.test", "t", transport=_answering(403, body)) as client:
        with pytest.raises(ToolNotAllowedError) as caught:
            await (await _session(client)).tools.bash("ls")
    assert str(caught.value) == message
    assert caught.value.tool == "bash"


async def _session(client: AsyncCorral) -> AsyncSession:
    info = SessionInfo.from_json({"id": "s1", "agent_type_id": "t1", "status": "active"})
    return AsyncSession(client, info)


async def test_provider_errors_carry_their_attributes() -> None:
    """ProviderUnavailableError gets ``provider`` and ``reason`` and AllProvidersFailedError ``attempts`` back from
    the details."""
    one = _error("provider_unavailable", "gvisor: runsc missing", {"provider": "gvisor", "reason": "runsc missing"})
    async with AsyncCorral("http://corral.test", "t", transport=_answering(503, one)) as client:
        with pytest.raises(ProviderUnavailableError) as caught:
            await client.workspaces.create(provider="gvisor")
    assert (caught.value.provider, caught.value.reason) == ("gvisor", "runsc missing")
    attempts = [{"provider": "gvisor", "error": "down"}, {"provider": "docker", "error": "off"}]
    every = _error("all_providers_failed", "no provider could create the workspace", {"attempts": attempts})
    async with AsyncCorral("http://corral.test", "t", transport=_answering(503, every)) as client:
        with pytest.raises(AllProvidersFailedError) as failed:
            await client.workspaces.create()
    assert failed.value.attempts == [("gvisor", "down"), ("docker", "off")]


async def test_unknown_code_becomes_a_corral_error_keeping_the_code() -> None:
    """A code the table does not know raises a plain CorralError whose code and status are the server's."""
    body = _error("quota_exceeded", "too many workspaces", {"limit": 3})
    async with AsyncCorral("http://corral.test", "t", transport=_answering(429, body)) as client:
        with pytest.raises(CorralError) as caught:
            await client.workspaces.list()
    assert type(caught.value) is CorralError
    assert (caught.value.code, caught.value.http_status, caught.value.message) == (
        "quota_exceeded", 429, "too many workspaces",
    )  # fmt: skip
    assert CorralError.code == "internal_error", "the class attribute is untouched"


async def test_answer_without_a_json_error_becomes_http_error() -> None:
    """A proxy's HTML 502 becomes CorralError ``http_error`` naming the status and the URL."""
    async with AsyncCorral("http://corral.test", "t", transport=_answering(502, text="<h1>Bad Gateway</h1>")) as c:
        with pytest.raises(CorralError) as caught:
            await c.providers()
    assert caught.value.code == "http_error"
    assert "HTTP 502 from http://corral.test/api/v1/agent/workspaces/providers: <h1>Bad Gateway</h1>" in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("failure", "refused", "expected", "text"),
    [
        (httpx.ConnectError("All connection attempts failed"), True, CorralConnectionError,
         "cannot reach Corral at http://corral.test: connection refused (is `corral serve` running there?"),
        (httpx.ConnectError("[Errno -2] Name or service not known"), False, CorralConnectionError,
         "cannot reach Corral at http://corral.test: [Errno -2] Name or service not known"),
        (httpx.ReadTimeout("timed out"), False, CorralTimeoutError,
         "no answer from Corral at http://corral.test in time"),
    ],
)  # fmt: skip
async def test_transport_failures_become_one_line_corral_errors(
    failure: httpx.TransportError, refused: bool, expected: type[CorralError], text: str
) -> None:
    """Connection refused (however httpx words it), an unknown host and a timeout raise Corral errors (also
    ConnectionError / TimeoutError) with one line saying what to check."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise failure from (ConnectionRefusedError(111, "Connect call failed") if refused else None)

    async with AsyncCorral("http://corral.test", "t", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(expected) as caught:
            await client.workspaces.list()
    assert text in str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ConnectionError if expected is CorralConnectionError else TimeoutError)
