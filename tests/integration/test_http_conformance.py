"""The provider conformance suite over real HTTP: HttpProvider -> uvicorn -> create_backend_app(GVisorProvider)."""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn

from corral.providers._docker_engine import DockerEngine
from corral.providers.base import WorkspaceSpec
from corral.providers.gvisor import GVisorProvider
from corral.providers.http import HttpProvider
from corral.providers.http_backend import create_backend_app
from corral.testing import ProviderConformance, SpecFactory
from tests.conftest import BASE_IMAGE

pytestmark = pytest.mark.integration


class BackendServer:
    """uvicorn serving the reference backend over gVisor on a free 127.0.0.1 port, in its own thread and loop.

    The gVisor provider is built and closed inside that loop; on stop, any workspace whose id starts with
    ``prefix`` that is still there is destroyed before the provider is closed.
    """

    def __init__(self, socket_path: str, token: str, prefix: str) -> None:
        self.socket_path = socket_path
        self.token = token
        self.prefix = prefix
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server: uvicorn.Server | None = None
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="http-backend", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by stop()
            self.failure = exc

    async def _serve(self) -> None:
        provider = GVisorProvider(DockerEngine(self.socket_path))
        app = create_backend_app(provider, token=self.token)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=10)
        self.server = uvicorn.Server(config)
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            leftovers = [i for i in await provider.list_workspaces() if i.startswith(self.prefix)]
            await asyncio.gather(*(provider.destroy(i) for i in leftovers))
            await provider.aclose()

    def start(self, timeout_s: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not (self.server is not None and self.server.started):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP backend did not start: {self.failure!r}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()
        assert not self.thread.is_alive(), "the HTTP backend did not stop"
        if self.failure is not None:
            raise self.failure


@pytest.fixture
def backend(docker_engine: DockerEngine) -> Iterator[BackendServer]:
    """A running backend over gVisor, stopped (and swept of this test's workspaces) at teardown."""
    server = BackendServer(docker_engine.socket_path, secrets.token_urlsafe(16), f"h{uuid.uuid4().hex[:5]}")
    server.start()
    yield server
    server.stop()


class TestHttpOverGVisorConformance(ProviderConformance):
    @pytest.fixture
    async def provider(self, backend: BackendServer) -> AsyncIterator[HttpProvider]:
        provider = HttpProvider(backend.url, token=backend.token)
        yield provider
        await provider.aclose()

    @pytest.fixture
    def spec_factory(self, backend: BackendServer) -> SpecFactory:
        return lambda: WorkspaceSpec(id=f"{backend.prefix}{uuid.uuid4().hex[:10]}", image=BASE_IMAGE)
