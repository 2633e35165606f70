"""The provider conformance suite against a real Docker engine: runc (docker) and runsc (gvisor)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from corral.providers._docker_engine import DockerEngine
from corral.providers.base import WorkspaceSpec
from corral.providers.docker import DockerProvider
from corral.providers.gvisor import GVisorProvider
from corral.testing import ProviderConformance, SpecFactory
from tests.conftest import BASE_IMAGE

pytestmark = pytest.mark.integration


def _specs() -> SpecFactory:
    # Isolated network (the default) and small limits, so 10 concurrent creates fit on a 2-core CI machine.
    return lambda: WorkspaceSpec(id=f"t{uuid.uuid4().hex[:15]}", image=BASE_IMAGE)


class TestDockerConformance(ProviderConformance):
    @pytest.fixture
    async def provider(self, docker_engine: DockerEngine) -> AsyncIterator[DockerProvider]:
        provider = DockerProvider(DockerEngine(docker_engine.socket_path))
        yield provider
        await provider.aclose()

    @pytest.fixture
    def spec_factory(self) -> SpecFactory:
        return _specs()


class TestGVisorConformance(ProviderConformance):
    @pytest.fixture
    async def provider(self, docker_engine: DockerEngine) -> AsyncIterator[GVisorProvider]:
        provider = GVisorProvider(DockerEngine(docker_engine.socket_path))
        yield provider
        await provider.aclose()

    @pytest.fixture
    def spec_factory(self) -> SpecFactory:
        return _specs()
