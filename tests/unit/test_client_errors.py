"""One error tree, in corral.errors, with a unique code per class; the SDK maps the API's codes back to it through
one table that covers every code, keeps unknown codes, and turns transport failures into one-line Corral errors
(async and sync clients alike); the old Sandbox* names still work, with a DeprecationWarning."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from types import ModuleType
from typing import Any

import httpx
import pytest

import corral.client
import corral.errors
import corral.providers.base
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
    ToolNotAllowedError,
    WorkspaceDestroyedError,
    WorkspaceFileNotFoundError,
    WorkspaceNotFoundError,
)

pytestmark = pytest.mark.unit


def _answering(status: int, body: Any = None, *, text: str | None = None) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handler)


def _error(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _tree() -> list[type[CorralError]]:
    """Every CorralError class defined in corral.errors."""
    return [
        cls
        for _, cls in inspect.getmembers(corral.errors, inspect.isclass)
        if issubclass(cls, CorralError) and cls.__module__ == "corral.errors"
    ]


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_every_code_in_the_table_names_a_class_with_that_code(code: str) -> None:
    """Each table entry is a CorralError subclass whose ``code`` is the key."""
    cls = error_class(code)
    assert cls is not None and issubclass(cls, CorralError)
    assert cls.code == code


def test_every_error_of_the_tree_has_its_own_code() -> None:
    """No two classes of corral.errors share a code, and every class of corral.errors is exported by it."""
    tree = _tree()
    codes = [cls.code for cls in tree]
    assert len(codes) == len(set(codes)), sorted(c for c in codes if codes.count(c) > 1)
    assert {cls.__name__ for cls in tree} == set(corral.errors.__all__)


def test_the_sdk_table_covers_every_code_the_server_sends() -> None:
    """Each code of corral.errors maps to its own class, and the table holds nothing but those and the client's own
    errors (the HTTP layer's generic codes such as ``not_found`` come back as a plain CorralError)."""
    tree = _tree()
    assert {code: ERROR_CODES.get(code) for code in (cls.code for cls in tree)} == {cls.code: cls for cls in tree}
    assert set(ERROR_CODES.values()) == {*tree, AuthenticationError}


@pytest.mark.parametrize("cls", _tree(), ids=lambda cls: cls.__name__)
def test_the_docstring_draws_each_error_with_its_status_and_code(cls: type[CorralError]) -> None:
    """corral.errors' docstring tree has a line naming the class, then its HTTP status and code."""
    line = rf"^[\s│├└─]*{cls.__name__}\b.*\s{cls.http_status}\s+{cls.code}\s"
    assert re.search(line, corral.errors.__doc__ or "", re.MULTILINE), cls.__name__


def test_the_sdk_exports_every_error_and_loads_nothing_of_the_server() -> None:
    """corral.client re-exports every class of corral.errors, and importing it loads no server module (store,
    agents, tools, SQLAlchemy, FastAPI)."""
    assert set(corral.errors.__all__) <= set(corral.client.__all__)
    probe = (
        "import sys, corral.client; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('corral.', 'sqlalchemy', 'fastapi')))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert [m for m in loaded if not m.startswith("corral.client")] == ["corral.errors"]


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        (corral.errors, "SandboxNotFoundError", WorkspaceNotFoundError),
        (corral.errors, "SandboxDestroyedError", WorkspaceDestroyedError),
        (corral.client, "SandboxNotFoundError", WorkspaceNotFoundError),
        (corral.client, "SandboxDestroyedError", WorkspaceDestroyedError),
        (corral.providers.base, "SandboxState", corral.providers.base.WorkspaceState),
    ],
    ids=lambda value: value.__name__ if isinstance(value, ModuleType | type) else value,
)
def test_old_names_still_work_with_a_deprecation_warning(module: ModuleType, old: str, new: type) -> None:
    """An old Sandbox* name is the renamed class itself; naming it warns, at the caller's line, pointing at the new
    name."""
    with pytest.warns(
        DeprecationWarning, match=rf"{module.__name__}\.{old} is deprecated.*use .*\.{new.__name__}"
    ) as caught:
        assert getattr(module, old) is new
    assert caught[0].filename == __file__
    assert old not in module.__all__
    with pytest.raises(AttributeError):
        getattr(module, "NoSuchError")  # noqa: B009 - the module's __getattr__ must still refuse other names


@pytest.mark.parametrize(
    ("status", "code", "expected", "builtin"),
    [
        (404, "workspace_not_found", WorkspaceNotFoundError, LookupError),
        (410, "workspace_destroyed", WorkspaceDestroyedError, CorralError),
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
        pytest.raises(WorkspaceNotFoundError, match="workspace 'w1' does not exist"),
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
