"""Stateful workspaces on the docker and gvisor providers: full-disk stop, pause with memory, snapshots and forks.

Everything runs on the real engine: gVisor (runsc 20240729, checkpoint/restore) and runc. A "counter" is a process
started in the background that writes an increasing number and its pid to files; memory was kept when, after a
resume or restore, the same pid is still counting on from where it was.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.errors import SnapshotNotFoundError, WorkspaceStateError
from corral.providers._docker_engine import DockerEngine
from corral.providers.base import ExecRequest, WorkspaceSpec, WorkspaceState
from corral.providers.docker import DockerProvider, snapshot_image, snapshot_volume
from corral.providers.gvisor import GVisorProvider
from tests.conftest import BASE_IMAGE

pytestmark = pytest.mark.integration

# The agent ends an exec's process group with it, so a daemon leaves it with setsid; the exec waits until the new
# session has written its pid (else the group could be killed before setsid ran).
COUNTER = (
    "setsid sh -c 'echo $$ > /tmp/counter.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; "
    "sleep 0.05; done' >/dev/null 2>&1 < /dev/null & while [ ! -s /tmp/counter.pid ]; do sleep 0.01; done"
)
# A server on localhost whose only state is in its memory: every request answers one more than the last.
MEMORY_SERVER = r"""
import http.server, os
hits = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global hits
        hits += 1
        body = f"{hits} {os.getpid()}".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8765), H).serve_forever()
"""
ASK_SERVER = (
    "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8765').read().decode())\""
)


def _spec() -> WorkspaceSpec:
    return WorkspaceSpec(id=f"t{uuid.uuid4().hex[:15]}", image=BASE_IMAGE)


async def _sh(provider: DockerProvider, workspace_id: str, command: str) -> str:
    result = await provider.exec(workspace_id, ExecRequest(command, timeout_s=60))
    assert result.exit_code == 0, (command, result.stderr)
    return result.stdout.decode().strip()


async def _counter(provider: DockerProvider, workspace_id: str) -> tuple[int, int]:
    """(pid, count) of the workspace's counter (read again when caught between its truncate and its write)."""
    for _ in range(20):
        out = (await _sh(provider, workspace_id, "cat /tmp/counter.pid; cat /tmp/counter")).split()
        if len(out) == 2:
            return int(out[0]), int(out[1])
    raise AssertionError(f"no counter: {out}")


async def _counting_on(provider: DockerProvider, workspace_id: str, pid: int, at_least: int) -> int:
    """Wait until the counter with ``pid`` has passed ``at_least``; returns its count."""
    for _ in range(200):
        now_pid, count = await _counter(provider, workspace_id)
        assert now_pid == pid, "a different counter process: memory was not kept"
        if count > at_least:
            return count
        await asyncio.sleep(0.05)
    raise AssertionError(f"the counter stopped at {count}")


async def _start_counter(provider: DockerProvider, workspace_id: str) -> tuple[int, int]:
    await _sh(provider, workspace_id, COUNTER)
    for _ in range(100):
        result = await provider.exec(workspace_id, ExecRequest("cat /tmp/counter.pid /tmp/counter"))
        if result.exit_code == 0 and len(result.stdout.split()) == 2:
            break
        await asyncio.sleep(0.05)
    return await _counter(provider, workspace_id)


@pytest.fixture
async def gvisor(docker_engine: DockerEngine, tmp_path: Path) -> AsyncIterator[GVisorProvider]:
    provider = GVisorProvider(DockerEngine(docker_engine.socket_path), snapshot_dir=tmp_path / "snapshots")
    yield provider
    await _clean(provider)


@pytest.fixture
async def runc(docker_engine: DockerEngine, tmp_path: Path) -> AsyncIterator[DockerProvider]:
    provider = DockerProvider(DockerEngine(docker_engine.socket_path), snapshot_dir=tmp_path / "snapshots")
    yield provider
    await _clean(provider)


@pytest.fixture(params=["gvisor", "runc"])
async def either(
    docker_engine: DockerEngine, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[DockerProvider]:
    cls = GVisorProvider if request.param == "gvisor" else DockerProvider
    provider = cls(DockerEngine(docker_engine.socket_path), snapshot_dir=tmp_path / "snapshots")
    yield provider
    await _clean(provider)


async def _clean(provider: DockerProvider) -> None:
    for workspace_id in await provider.list_workspaces():
        if workspace_id.startswith("t"):
            await provider.destroy(workspace_id)
    for snapshot_id in await provider.list_snapshots():
        if snapshot_id.startswith("s"):
            await provider.delete_snapshot(snapshot_id)
    await provider.aclose()


# --- full-disk stop -------------------------------------------------------------------------------------------------


async def test_stop_and_resume_keep_the_whole_disk(either: DockerProvider) -> None:
    """Files in /root, /etc and /tmp, and a package installed with dpkg, survive stop and resume."""
    provider = either
    spec = _spec()
    await provider.create(spec)
    # A real Debian package, built and installed in the workspace (no network needed).
    await _sh(
        provider,
        spec.id,
        "mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/usr/bin && printf '#!/bin/sh\\necho hello from corral-demo\\n' "
        "> /tmp/pkg/usr/bin/corral-demo && chmod 755 /tmp/pkg/usr/bin/corral-demo && printf 'Package: corral-demo\\n"
        "Version: 1.0\\nArchitecture: all\\nMaintainer: t <t@example.invalid>\\nDescription: demo\\n' "
        "> /tmp/pkg/DEBIAN/control && dpkg-deb --build /tmp/pkg /tmp/corral-demo.deb >/dev/null && "
        "dpkg -i /tmp/corral-demo.deb >/dev/null && echo kept > /root/note && echo 'corral=1' >> /etc/environment "
        "&& echo tmp > /tmp/on-disk",
    )
    await provider.stop(spec.id)
    assert await provider.state(spec.id) is WorkspaceState.STOPPED
    await provider.resume(spec.id)
    out = await _sh(
        provider,
        spec.id,
        "dpkg-query -W -f='${Status}\\n' corral-demo; corral-demo; cat /root/note /tmp/on-disk; "
        "tail -1 /etc/environment",
    )
    assert out.splitlines() == ["install ok installed", "hello from corral-demo", "kept", "tmp", "corral=1"]
    caps = await provider.capabilities()
    assert caps.persistence == "full"
    await provider.destroy(spec.id)
    assert await provider.state(spec.id) is WorkspaceState.MISSING


# --- pause -------------------------------------------------------------------------------------------------------


async def test_gvisor_pause_keeps_processes_and_memory_for_ten_cycles(gvisor: GVisorProvider) -> None:
    """A counter started before pause is the same process, still counting, after each of ten pause/resume cycles."""
    spec = _spec()
    await gvisor.create(spec)
    pid, count = await _start_counter(gvisor, spec.id)
    for _ in range(10):
        _, count = await _counter(gvisor, spec.id)
        assert await gvisor.pause(spec.id) == "memory"
        assert await gvisor.state(spec.id) is WorkspaceState.PAUSED
        await gvisor.resume(spec.id)
        assert await gvisor.state(spec.id) is WorkspaceState.RUNNING
        await _counting_on(gvisor, spec.id, pid, count)
    assert (await gvisor.capabilities()).pause == "memory"


async def test_gvisor_pause_keeps_a_localhost_server_and_its_variables(gvisor: GVisorProvider) -> None:
    """A server on localhost answers again after pause/resume, from the same process with its in-memory count."""
    spec = _spec()
    await gvisor.create(spec)
    await gvisor.write_file(spec.id, "/workspace/server.py", MEMORY_SERVER.encode())
    await _sh(gvisor, spec.id, "setsid python3 /workspace/server.py >/dev/null 2>&1 < /dev/null & sleep 0.5")
    first = ""
    for _ in range(100):
        result = await gvisor.exec(spec.id, ExecRequest(ASK_SERVER))
        if result.exit_code == 0:
            first = result.stdout.decode().strip()
            break
        await asyncio.sleep(0.1)
    hits, pid = first.split()
    await gvisor.pause(spec.id)
    await gvisor.resume(spec.id)
    again_hits, again_pid = (await _sh(gvisor, spec.id, ASK_SERVER)).split()
    assert (int(again_hits), again_pid) == (int(hits) + 1, pid)


async def test_pause_of_a_stopped_gvisor_workspace_is_refused_and_stop_discards_memory(gvisor: GVisorProvider) -> None:
    """Pause needs a running workspace; stopping a paused one discards its memory (the next resume is cold)."""
    spec = _spec()
    await gvisor.create(spec)
    pid, _ = await _start_counter(gvisor, spec.id)
    await gvisor.pause(spec.id)
    assert await gvisor.pause(spec.id) == "memory"  # pausing a paused workspace answers what it holds
    await gvisor.stop(spec.id)
    assert await gvisor.state(spec.id) is WorkspaceState.STOPPED
    with pytest.raises(WorkspaceStateError, match="stopped"):
        await gvisor.pause(spec.id)
    await gvisor.resume(spec.id)
    # The counter's files are on the disk a stop keeps; a counter still running would go on counting. (Not `kill -0`
    # of its pid: a fresh sandbox numbers its processes from 1 again, and the checking shell can get that pid.)
    _, count = await _counter(gvisor, spec.id)
    await asyncio.sleep(0.5)
    assert await _counter(gvisor, spec.id) == (pid, count), "the counter survived a stop: memory was not discarded"


async def test_runc_pause_is_a_filesystem_pause(runc: DockerProvider) -> None:
    """Under runc (no CRIU here) pause answers "filesystem": a stop keeping the whole disk."""
    spec = _spec()
    await runc.create(spec)
    await _sh(runc, spec.id, "echo kept > /root/note")
    assert await runc.pause(spec.id) == "filesystem"
    assert await runc.state(spec.id) is WorkspaceState.STOPPED
    await runc.resume(spec.id)
    assert await _sh(runc, spec.id, "cat /root/note") == "kept"
    caps = await runc.capabilities()
    assert (caps.pause, caps.snapshots) == ("filesystem", "filesystem")


# --- snapshots and forks ---------------------------------------------------------------------------------------------


async def test_gvisor_snapshot_restores_files_and_processes_into_a_new_workspace(gvisor: GVisorProvider) -> None:
    """A restored workspace has the source's files and its counter process carrying on; the source carries on too."""
    source, copy = _spec(), _spec()
    await gvisor.create(source)
    pid, _ = await _start_counter(gvisor, source.id)
    await _sh(gvisor, source.id, "echo snap > /root/in-root && echo ws > /workspace/in-ws")
    snapshot_id = f"s{uuid.uuid4().hex[:15]}"
    info = await gvisor.snapshot(source.id, snapshot_id)
    assert info.kind == "memory" and info.size_bytes > 0
    assert snapshot_id in await gvisor.list_snapshots()
    _, at_snapshot = await _counter(gvisor, source.id)
    await _counting_on(gvisor, source.id, pid, at_snapshot)  # the source runs on
    await _sh(gvisor, source.id, "echo later > /workspace/in-ws")
    await gvisor.restore(copy, snapshot_id)
    assert await _sh(gvisor, copy.id, "cat /root/in-root /workspace/in-ws") == "snap\nws"
    restored_pid, restored_count = await _counter(gvisor, copy.id)
    assert restored_pid == pid
    await _counting_on(gvisor, copy.id, pid, restored_count)
    assert await _sh(gvisor, copy.id, "hostname") != await _sh(gvisor, source.id, "hostname")
    await gvisor.delete_snapshot(snapshot_id)
    assert snapshot_id not in await gvisor.list_snapshots()
    assert not (gvisor.snapshot_dir / snapshot_id).exists()
    await gvisor.delete_snapshot(snapshot_id)  # idempotent
    # The restored workspace keeps running on the image's layers; they go when it does.
    assert await _sh(gvisor, copy.id, "cat /root/in-root") == "snap"
    image_id = (await gvisor.engine.inspect_container(f"corral-{copy.id}") or {})["Image"]
    await gvisor.destroy(copy.id)
    assert await gvisor.engine.inspect_image(image_id) is None


async def test_forks_are_independent(gvisor: GVisorProvider) -> None:
    """Three forks each see the source's files and process; a write in one is seen by no other, nor the source."""
    source = _spec()
    await gvisor.create(source)
    pid, _ = await _start_counter(gvisor, source.id)
    await _sh(gvisor, source.id, "echo base > /workspace/shared")
    snapshot_id = f"s{uuid.uuid4().hex[:15]}"
    await gvisor.snapshot(source.id, snapshot_id)
    forks = [_spec() for _ in range(3)]
    await asyncio.gather(*(gvisor.restore(f, snapshot_id) for f in forks))
    await gvisor.delete_snapshot(snapshot_id)
    for index, fork in enumerate(forks):
        await _sh(gvisor, fork.id, f"echo fork{index} > /workspace/mine && echo fork{index} > /root/mine")
    for index, fork in enumerate(forks):
        assert await _sh(gvisor, fork.id, "cat /workspace/shared /workspace/mine /root/mine") == (
            f"base\nfork{index}\nfork{index}"
        )
        fork_pid, count = await _counter(gvisor, fork.id)
        assert fork_pid == pid
        await _counting_on(gvisor, fork.id, pid, count)
    assert (await gvisor.exec(source.id, ExecRequest("test -e /workspace/mine"))).exit_code == 1
    names = {await _sh(gvisor, w.id, "hostname") for w in [source, *forks]}
    assert len(names) == 4


async def test_runc_snapshot_holds_files_only(runc: DockerProvider) -> None:
    """Under runc a snapshot is "filesystem": the restored workspace has the files, its processes start fresh."""
    source, copy = _spec(), _spec()
    await runc.create(source)
    await _sh(runc, source.id, "echo snap > /root/in-root && echo ws > /workspace/in-ws")
    snapshot_id = f"s{uuid.uuid4().hex[:15]}"
    info = await runc.snapshot(source.id, snapshot_id)
    assert info.kind == "filesystem"
    await runc.restore(copy, snapshot_id)
    assert await _sh(runc, copy.id, "cat /root/in-root /workspace/in-ws") == "snap\nws"
    assert await runc.state(source.id) is WorkspaceState.RUNNING


async def test_restore_from_a_missing_snapshot_names_it(gvisor: GVisorProvider) -> None:
    """Restoring from a snapshot with nothing on the host raises SnapshotNotFoundError and leaves nothing behind."""
    spec = _spec()
    with pytest.raises(SnapshotNotFoundError, match="s-gone"):
        await gvisor.restore(spec, "s-gone")
    assert await gvisor.state(spec.id) is WorkspaceState.MISSING


async def test_a_failed_snapshot_leaves_nothing(gvisor: GVisorProvider) -> None:
    """A snapshot of a workspace that is not running is refused, and no image, volume or directory is left."""
    spec = _spec()
    await gvisor.create(spec)
    await gvisor.stop(spec.id)
    snapshot_id = f"s{uuid.uuid4().hex[:15]}"
    with pytest.raises(WorkspaceStateError):
        await gvisor.snapshot(spec.id, snapshot_id)
    assert snapshot_id not in await gvisor.list_snapshots()
    assert await gvisor.engine.inspect_image(snapshot_image(snapshot_id)) is None
    assert await gvisor.engine.inspect_volume(snapshot_volume(snapshot_id)) is None
    assert not (gvisor.snapshot_dir / snapshot_id).exists()
