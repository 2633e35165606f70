"""Shared test plumbing.

Under ``CI=true`` a skipped integration or e2e test is turned into a failure: CI must really run the Docker, gVisor
and PostgreSQL tests, never quietly skip them. A conformance test skipped for a capability the provider declares it
lacks (its reason says ``DECLARED_GAP``) is not a missing runtime, and passes.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Generator

import pytest

from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.testing.conformance import DECLARED_GAP

DOCKER_SOCKET = "/var/run/docker.sock"
BASE_IMAGE = os.environ.get("CORRAL_BASE_IMAGE", "corral/workspace:base")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    # needs_kvm tests boot a real microVM; CI machines cannot (ENVIRONMENT.md), so their skip is reported, not failed.
    needs_real_backend = (
        item.get_closest_marker("integration") or item.get_closest_marker("e2e")
    ) and not item.get_closest_marker("needs_kvm")
    if report.skipped and needs_real_backend and os.environ.get("CI") == "true" and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if DECLARED_GAP in reason:
            return
        report.outcome = "failed"
        report.longrepr = f"CI=true: integration/e2e tests must run, but this one skipped: {reason}"


@pytest.fixture
async def docker_engine() -> AsyncIterator[DockerEngine]:
    """A client for the local Docker engine; skips (a failure under CI) when dockerd is not running."""
    engine = DockerEngine(DOCKER_SOCKET)
    try:
        await engine.ping()
        if not await engine.image_exists(BASE_IMAGE):
            pytest.skip(f"base image {BASE_IMAGE} is missing; run `make bootstrap`")
    except DockerAPIError as exc:
        await engine.aclose()
        pytest.skip(f"Docker engine not reachable: {exc}")
    yield engine
    await engine.aclose()
