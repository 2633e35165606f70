"""CORRAL_AGENT_IDLE_CLOSE_S: an agent that served a call and then none for that long is closed (its `runsc exec`
ends with it); the next call starts a fresh one; background disk checks do not start it again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from corral.providers._docker_engine import DockerEngine
from corral.providers.base import ExecRequest, WorkspaceSpec
from corral.providers.gvisor import GVisorProvider
from tests.conftest import BASE_IMAGE

pytestmark = pytest.mark.integration

IDLE_S = 0.4


@pytest.fixture
async def gvisor(docker_engine: DockerEngine) -> AsyncIterator[GVisorProvider]:
    provider = GVisorProvider(DockerEngine(docker_engine.socket_path))
    provider.agent_idle_close_s = IDLE_S
    yield provider
    for workspace_id in await provider.list_workspaces():
        if workspace_id.startswith("t"):
            await provider.destroy(workspace_id)
    await provider.aclose()


async def _until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_idle_agent_is_closed_and_the_next_call_starts_a_fresh_one(gvisor: GVisorProvider) -> None:
    spec = WorkspaceSpec(id=f"t{uuid.uuid4().hex[:15]}", image=BASE_IMAGE)
    await gvisor.create(spec)
    await _until(lambda: spec.id in gvisor._agents)
    await asyncio.sleep(3 * IDLE_S)
    assert spec.id in gvisor._agents, "an agent started ahead of its first call waits for that call"

    first = await gvisor.exec(spec.id, ExecRequest("sleep " + str(3 * IDLE_S)))
    assert first.exit_code == 0  # a command running longer than the idle time keeps its agent
    await gvisor.write_file(spec.id, "/workspace/f", b"x" * 100_000)
    await _until(lambda: spec.id not in gvisor._agents)

    # A background disk check counts on the host and does not start the agent again.
    assert await gvisor.disk_usage(spec.id) >= 100_000
    assert spec.id not in gvisor._agents

    again = await gvisor.exec(spec.id, ExecRequest("wc -c < /workspace/f"))
    assert again.stdout.strip() == b"100000"
    assert spec.id in gvisor._agents
    agents = await gvisor.exec(spec.id, ExecRequest("grep -l 'agent[.]pyc' /proc/[0-9]*/cmdline | wc -l"))
    assert agents.stdout.strip() == b"1", "the closed agent is gone; one fresh agent serves"
