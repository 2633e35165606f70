"""The e2b provider passes the conformance suite against Corral's own E2B-compatible API.

Nothing is faked: a real ``corral serve`` (gVisor underneath) serves ``/e2b`` and ``/e2b/envd`` on loopback, and the
provider talks to it through the official ``e2b`` SDK over real HTTP, exactly as it would talk to E2B's cloud.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from corral.providers.base import WorkspaceSpec
from corral.providers.e2b import E2BProvider
from corral.testing import ProviderConformance, SpecFactory
from tests.conftest import BASE_IMAGE
from tests.e2e.conftest import TOKEN, Server, serving_e2b

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A Corral server on gVisor serving the E2B-compatible API; skips (a failure under CI) without Docker."""
    with serving_e2b(tmp_path_factory, "corral-e2b-conformance") as server:
        yield server


class TestE2BConformance(ProviderConformance):
    @pytest.fixture
    async def provider(self, e2b_server: Server) -> AsyncIterator[E2BProvider]:
        provider = E2BProvider(
            api_key=TOKEN,
            api_url=f"{e2b_server.url}/e2b",
            sandbox_url=f"{e2b_server.url}/e2b/envd",
            default_image=BASE_IMAGE,
            owner=f"conformance-{uuid.uuid4().hex[:8]}",  # list_workspaces sees only this test's sandboxes
        )
        yield provider
        await provider.aclose()

    @pytest.fixture
    def spec_factory(self) -> SpecFactory:
        return lambda: WorkspaceSpec(id=f"t{uuid.uuid4().hex[:15]}", image=BASE_IMAGE)
