"""Factories that build each built-in provider from :class:`~corral.settings.Settings` (see ``registry``)."""

from __future__ import annotations

from typing import TypeVar

from corral.egress import EgressController
from corral.egress.policy import parse_always_deny
from corral.providers._docker_engine import DockerEngine
from corral.providers.docker import DockerProvider
from corral.providers.fake import FakeProvider
from corral.providers.gvisor import GVisorProvider
from corral.settings import Settings

__all__ = ["docker", "fake", "gvisor"]

_P = TypeVar("_P", bound=DockerProvider)


def docker(settings: Settings) -> DockerProvider:
    """Plain Docker (runc): reduced isolation, the last resort."""
    return _limited(
        DockerProvider(
            DockerEngine.from_url(settings.docker_host),
            pids_limit=settings.pids_limit,
            output_limit=settings.exec_output_limit,
            owner=settings.owner_id(),
            agent_image=settings.base_image,
            agent_runtime_dir=settings.agent_runtime_dir,
            snapshot_dir=settings.snapshot_dir,
        ),
        settings,
    )


def gvisor(settings: Settings) -> GVisorProvider:
    """Docker with gVisor's runsc."""
    return _limited(
        GVisorProvider(
            DockerEngine.from_url(settings.docker_host),
            runtime=settings.gvisor_runtime,
            net_runtime=settings.gvisor_net_runtime,
            pids_limit=settings.pids_limit,
            output_limit=settings.exec_output_limit,
            owner=settings.owner_id(),
            agent_image=settings.base_image,
            agent_runtime_dir=settings.agent_runtime_dir,
            snapshot_dir=settings.snapshot_dir,
        ),
        settings,
    )


def _limited(provider: _P, settings: Settings) -> _P:
    """The provider with the per-workspace exec limits and the egress settings."""
    provider.egress = EgressController(settings.egress_hosts_file)
    provider.egress_always_deny = parse_always_deny(settings.egress_always_deny)
    provider.max_concurrent_execs = settings.max_concurrent_execs
    provider.max_queued_execs = settings.max_queued_execs
    provider.agent_idle_close_s = settings.agent_idle_close_s
    return provider


def fake(settings: Settings) -> FakeProvider:
    """The in-memory test double; never chosen by auto selection."""
    del settings
    return FakeProvider()
