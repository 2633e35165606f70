"""The provider conformance suite, run against the in-memory FakeProvider."""

import uuid

import pytest

from corral.providers.base import WorkspaceSpec
from corral.providers.fake import FakeProvider
from corral.testing import ProviderConformance, SpecFactory

pytestmark = pytest.mark.unit


class TestFakeProviderConformance(ProviderConformance):
    @pytest.fixture
    def provider(self) -> FakeProvider:
        return FakeProvider()

    @pytest.fixture
    def spec_factory(self) -> SpecFactory:
        return lambda: WorkspaceSpec(id=f"conf-{uuid.uuid4().hex[:12]}", image="fake")
