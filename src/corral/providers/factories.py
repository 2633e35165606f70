"""Factories that build each built-in provider from :class:`~corral.settings.Settings` (see ``registry``)."""

from __future__ import annotations

from corral.providers._docker_engine import DockerEngine
from corral.providers.docker import DockerProvider
from corral.providers.fake import FakeProvider
from corral.providers.gvisor import GVisorProvider
from corral.settings import Settings

__all__ = ["docker", "fake", "gvisor"]


def docker(settings: Settings) -> DockerProvider:
    """Plain Docker (runc): reduced isolation, the last resort."""
    return DockerProvider(
        DockerEngine.from_url(settings.docker_host),
        pids_limit=settings.pids_limit,
        output_limit=settings.exec_output_limit,
        owner=settings.owner_id(),
    )


def gvisor(settings: Settings) -> GVisorProvider:
    """Docker with gVisor's runsc."""
    return GVisorProvider(
        DockerEngine.from_url(settings.docker_host),
        runtime=settings.gvisor_runtime,
        net_runtime=settings.gvisor_net_runtime,
        pids_limit=settings.pids_limit,
        output_limit=settings.exec_output_limit,
        owner=settings.owner_id(),
    )


def fake(settings: Settings) -> FakeProvider:
    """The in-memory test double; never chosen by auto selection."""
    del settings
    return FakeProvider()
