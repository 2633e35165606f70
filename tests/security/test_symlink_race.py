"""Regression: the file API cannot be led out of /workspace by a symlink swapped in while it works.

The finding: a process inside the workspace flipped a directory to a symlink (to /etc) and back in a tight loop
while the API read and wrote through it. The API checked the path with one round trip (realpath) and used it with
another, so 18 of 600 reads returned the workspace's /etc/passwd and 4 of 200 writes landed in /etc. The file calls
now resolve the path beneath /workspace in the agent, in the same step as the operation (see
:class:`corral.guest.agent.Beneath`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.errors import FileOperationError, InvalidRequestError, WorkspaceFileNotFoundError
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers._docker_engine import DockerEngine
from corral.providers.base import ExecRequest, WorkspaceProvider
from corral.providers.docker import DockerProvider
from corral.providers.gvisor import GVisorProvider
from tests.integration.conftest import build_service, close_service

pytestmark = pytest.mark.integration

READS = 600
WRITES = 200
HARMLESS = b"harmless\n"

# Swaps /workspace/d between the real directory (holding passwd = "harmless") and a symlink to /etc as fast as it
# can, counting its rounds in /workspace/flips, until /workspace/stop appears. A write through the API may create d
# as a directory while it is away (writes create missing parents): the flipper then clears it and goes on.
FLIPPER = """
import os, shutil
os.chdir("/workspace")

def restore():
    if os.path.islink("d"):
        os.unlink("d") if os.path.lexists("evil") else os.rename("d", "evil")
    elif os.path.isdir("d"):
        shutil.rmtree("d") if os.path.isdir("real") else os.rename("d", "real")
    if not os.path.isdir("real"):
        os.mkdir("real")
    with open("real/passwd", "w") as f:
        f.write("harmless\\n")
    if not os.path.lexists("evil"):
        os.symlink("/etc", "evil")

def count(rounds):
    with open("flips.tmp", "w") as f:
        f.write(str(rounds))
    os.rename("flips.tmp", "flips")

restore()
count(0)
rounds = 0
while not os.path.exists("stop"):
    try:
        os.rename("real", "d")
        os.rename("d", "real")
        os.rename("evil", "d")
        os.rename("d", "evil")
    except OSError:
        try:
            restore()
        except OSError:  # a write through the API raced the clean-up; the next round restores again
            pass
    rounds += 1
    if rounds % 200 == 0:
        count(rounds)
"""


@pytest.fixture(params=["gvisor", "docker"])
async def race(
    request: pytest.FixtureRequest, tmp_path: Path, docker_engine: DockerEngine
) -> AsyncIterator[tuple[WorkspaceService, str]]:
    """A workspace on gVisor (and on plain Docker) whose /workspace/d is being flipped, through a real service."""
    name: str = request.param
    provider: WorkspaceProvider = (
        GVisorProvider(DockerEngine(docker_engine.socket_path))
        if name == "gvisor"
        else DockerProvider(DockerEngine(docker_engine.socket_path))
    )
    service = await build_service(tmp_path, {name: provider}, allow_docker_fallback=True)
    try:
        workspace_id = (await service.create(CreateWorkspace(provider=name))).id
        await service.write_file(workspace_id, "flipper.py", FLIPPER.encode())
        started = await service.exec(
            workspace_id,
            # setsid: the flipper outlives this command; waiting for its first count makes sure it got that far.
            ExecRequest(
                "setsid python3 /workspace/flipper.py >/dev/null 2>&1 </dev/null & "
                "while [ ! -e /workspace/flips ]; do sleep 0.01; done",
                timeout_s=60,
            ),
        )
        assert started.exit_code == 0, started.stderr
        await _wait_for_flips(service, workspace_id, at_least=1000)
        yield service, workspace_id
    finally:
        await close_service(service)


async def _flips(service: WorkspaceService, workspace_id: str) -> int:
    result = await service.exec(workspace_id, ExecRequest("cat /workspace/flips 2>/dev/null || echo 0"))
    return int(result.stdout.strip() or 0)


async def _wait_for_flips(service: WorkspaceService, workspace_id: str, *, at_least: int) -> None:
    """Poll until the flipper has done ``at_least`` rounds (it runs, and /workspace/d really flips)."""
    deadline = time.monotonic() + 60
    while (done := await _flips(service, workspace_id)) < at_least:
        assert time.monotonic() < deadline, f"the flipper made only {done} rounds in 60 s"
        await asyncio.sleep(0.05)


async def _read(service: WorkspaceService, workspace_id: str, path: str) -> bytes | None:
    """The file's content, or None for a clean error (the directory was away, or was the symlink)."""
    try:
        stream = await service.read_file(workspace_id, path)
        return b"".join([chunk async for chunk in stream])
    except (WorkspaceFileNotFoundError, InvalidRequestError, FileOperationError):
        return None


async def test_reads_through_a_flipping_directory_never_return_etc_passwd(race: tuple[WorkspaceService, str]) -> None:
    """600 reads of d/passwd while d flips between a directory and a symlink to /etc return only the harmless
    content or a clean error, never the workspace's /etc/passwd."""
    service, workspace_id = race
    etc_passwd = (await service.exec(workspace_id, ExecRequest("cat /etc/passwd"))).stdout
    assert b"root:" in etc_passwd
    before = await _flips(service, workspace_id)
    answers = [await _read(service, workspace_id, "d/passwd") for _ in range(READS)]
    leaked = [a for a in answers if a is not None and a != HARMLESS]
    assert leaked == [], f"{len(leaked)} of {READS} reads escaped /workspace, e.g. {leaked[0][:80]!r}"
    assert answers.count(HARMLESS) + answers.count(None) == READS
    assert await _flips(service, workspace_id) > before, "the directory stopped flipping during the reads"


async def test_writes_through_a_flipping_directory_never_land_in_etc(race: tuple[WorkspaceService, str]) -> None:
    """200 writes to d/x while d flips between a directory and a symlink to /etc never create /etc/x."""
    service, workspace_id = race
    before = await _flips(service, workspace_id)
    landed = 0
    for i in range(WRITES):
        try:
            await service.write_file(workspace_id, "d/x", f"write {i}\n".encode())
            landed += 1
        except (WorkspaceFileNotFoundError, InvalidRequestError, FileOperationError):
            pass  # a clean refusal: d was away, or was the symlink
    assert await _flips(service, workspace_id) > before, "the directory stopped flipping during the writes"
    await service.write_file(workspace_id, "stop", b"")
    check = await service.exec(workspace_id, ExecRequest("test -e /etc/x && echo ESCAPED || echo clean"))
    assert check.stdout == b"clean\n", f"a write through the symlink landed in /etc ({landed} writes succeeded)"
    written = await service.exec(workspace_id, ExecRequest("cat /workspace/real/x 2>/dev/null || true"))
    assert landed == 0 or written.stdout.startswith(b"write "), "the writes that succeeded went nowhere visible"
