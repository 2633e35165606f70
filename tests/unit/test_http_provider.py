"""The http provider in-process: HttpProvider -> streaming ASGI transport -> create_backend_app(FakeProvider())."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, MutableMapping
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from corral.errors import (
    CorralError,
    ExecTimeoutError,
    FileOperationError,
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    WorkspaceDestroyedError,
    WorkspaceFileNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.providers.base import ExecOutput, ExecRequest, WorkspaceSpec
from corral.providers.fake import FakeProvider
from corral.providers.http import NOT_CONFIGURED, HttpProvider, from_settings
from corral.providers.http_backend import create_backend_app
from corral.testing import ProviderConformance, SpecFactory

pytestmark = pytest.mark.unit

TOKEN = "unit-test-token"
BASE_URL = "http://backend.test"


class _StreamedBody(httpx.AsyncByteStream):
    def __init__(self, queue: asyncio.Queue[MutableMapping[str, Any] | None], task: asyncio.Task[None]) -> None:
        self.queue = queue
        self.task = task
        self.disconnected = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (message := await self.queue.get()) is not None:
            if message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    return

    async def aclose(self) -> None:
        self.disconnected.set()  # what a closed connection looks like to the app
        await self.task


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """httpx.ASGITransport, except that the body streams while the app runs and closing it disconnects the app.

    httpx's own ASGITransport collects the whole body before returning, which would hide whether exec output is
    streamed as produced and whether closing a stream early stops the command.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        chunks = request.stream.__aiter__()
        request_done = False
        queue: asyncio.Queue[MutableMapping[str, Any] | None] = asyncio.Queue()
        body: _StreamedBody | None = None

        async def receive() -> dict[str, Any]:
            nonlocal request_done
            if request_done:
                assert body is not None
                await body.disconnected.wait()
                return {"type": "http.disconnect"}
            try:
                return {"type": "http.request", "body": await chunks.__anext__(), "more_body": True}
            except StopAsyncIteration:
                request_done = True
                return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            await queue.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                await queue.put(None)

        url = request.url
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?")[0],
            "query_string": url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "server": (url.host, url.port or 80),
            "client": ("127.0.0.1", 40000),
        }
        task = asyncio.create_task(run())
        body = _StreamedBody(queue, task)
        start = await queue.get()
        if start is None:
            await task
            raise RuntimeError("the app ended without a response")
        return httpx.Response(start["status"], headers=start.get("headers", []), stream=body)


def _in_process(fake: FakeProvider, *, token: str = TOKEN) -> HttpProvider:
    app = create_backend_app(fake, token=TOKEN)
    return HttpProvider(BASE_URL, token=token, transport=StreamingASGITransport(app))


def _answering(status: int, payload: object) -> HttpProvider:
    """A provider whose backend answers every request with ``status`` and JSON ``payload``."""
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json=payload))
    return HttpProvider(BASE_URL, token=TOKEN, transport=transport)


def _spec() -> WorkspaceSpec:
    return WorkspaceSpec(id=f"http-{uuid.uuid4().hex[:12]}", image="fake")


class TestHttpProviderConformance(ProviderConformance):
    @pytest.fixture
    async def provider(self) -> AsyncIterator[HttpProvider]:
        provider = _in_process(FakeProvider())
        yield provider
        await provider.aclose()

    @pytest.fixture
    def spec_factory(self) -> SpecFactory:
        return _spec


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("invalid_request", 400, InvalidRequestError),
        ("workspace_not_found", 404, WorkspaceNotFoundError),
        ("workspace_destroyed", 410, WorkspaceDestroyedError),
        ("workspace_state_conflict", 409, WorkspaceStateError),
        ("exec_timeout", 504, ExecTimeoutError),
        ("resource_limit", 422, ResourceLimitError),
        ("file_not_found", 404, WorkspaceFileNotFoundError),
        ("file_operation_failed", 400, FileOperationError),
        ("provider_unavailable", 503, ProviderUnavailableError),
        ("something_new", 500, ProviderUnavailableError),
    ],
)
async def test_error_codes_map_to_corral_errors(code: str, status: int, expected: type[CorralError]) -> None:
    """Each contract error code raises its corral.errors class, carrying the backend's message."""
    provider = _answering(status, {"error": {"code": code, "message": "backend says no"}})
    with pytest.raises(expected) as caught:
        await provider.stat("ws", "/workspace/x")
    assert type(caught.value) is expected
    assert "backend says no" in caught.value.message
    await provider.aclose()


async def test_answer_outside_the_contract_is_unavailable() -> None:
    """An error without a contract error body (a proxy's 502 page) raises ProviderUnavailableError."""
    transport = httpx.MockTransport(lambda request: httpx.Response(502, text="<html>Bad Gateway</html>"))
    provider = HttpProvider(BASE_URL, token=TOKEN, transport=transport)
    with pytest.raises(ProviderUnavailableError, match="HTTP 502"):
        await provider.create(_spec())
    await provider.aclose()


async def test_transport_failure_is_unavailable_and_unhealthy() -> None:
    """A backend that cannot be reached makes create raise ProviderUnavailableError and health unhealthy."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    provider = HttpProvider(BASE_URL, token=TOKEN, transport=httpx.MockTransport(refuse))
    with pytest.raises(ProviderUnavailableError, match="connection refused"):
        await provider.create(_spec())
    health = await provider.health()
    assert health.healthy is False
    assert health.error is not None
    assert "connection refused" in health.error
    await provider.aclose()


async def test_wrong_token_is_refused_naming_401() -> None:
    """A wrong token makes calls raise ProviderUnavailableError naming HTTP 401, and health report it."""
    fake = FakeProvider()
    provider = _in_process(fake, token="wrong")
    with pytest.raises(ProviderUnavailableError, match="401"):
        await provider.create(_spec())
    health = await provider.health()
    assert health.healthy is False
    assert health.error is not None
    assert "401" in health.error
    assert not [call for call in fake.calls if call[0] == "create"]
    await provider.aclose()


async def test_unset_url_is_unhealthy_and_refuses_create() -> None:
    """Without CORRAL_HTTP_PROVIDER_URL health is unhealthy and create raises ProviderUnavailableError saying so."""
    provider = from_settings(SimpleNamespace())  # type: ignore[arg-type]
    health = await provider.health()
    assert (health.healthy, health.error) == (False, NOT_CONFIGURED)
    with pytest.raises(ProviderUnavailableError) as caught:
        await provider.create(_spec())
    assert caught.value.reason == NOT_CONFIGURED
    assert (await provider.capabilities()).isolation == "remote"
    await provider.aclose()


async def test_from_settings_reads_url_and_token() -> None:
    """from_settings takes the backend URL and bearer token from the http_provider_* settings."""
    settings = SimpleNamespace(http_provider_url="http://backend.example:9000/", http_provider_token="s3cret")
    provider = from_settings(settings)  # type: ignore[arg-type]
    assert provider.name == "http"
    assert provider.base_url == "http://backend.example:9000"
    assert provider._client is not None
    assert provider._client.headers["authorization"] == "Bearer s3cret"
    await provider.aclose()


async def test_backend_rejects_a_malformed_spec_with_invalid_request() -> None:
    """The backend answers a malformed create body with 400 and an invalid_request error naming the field."""
    app = create_backend_app(FakeProvider(), token=TOKEN)
    async with httpx.AsyncClient(
        transport=StreamingASGITransport(app), base_url=BASE_URL, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:
        response = await client.put("/v1/workspaces/w1", json={"image": "x", "network": "open"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert "network" in error["message"]


async def test_closing_a_stream_early_stops_the_command() -> None:
    """Closing exec_stream after the first chunk ends the backend's command instead of letting it run on."""
    fake = FakeProvider()
    provider = _in_process(fake)
    spec = _spec()
    await provider.create(spec)
    stream = provider.exec_stream(spec.id, ExecRequest("echo first; sleep 30; echo never"))
    first = await anext(stream)
    assert first == ExecOutput("stdout", b"first\n")
    async with asyncio.timeout(5):  # the close waits for the backend's generator to finish
        await stream.aclose()
    assert (await provider.exec(spec.id, ExecRequest("echo next"))).stdout == b"next\n"
    await provider.destroy(spec.id)
    await provider.aclose()


def test_backend_needs_a_token() -> None:
    """create_backend_app refuses an empty token instead of serving without auth."""
    with pytest.raises(ValueError, match="token"):
        create_backend_app(FakeProvider(), token="")
