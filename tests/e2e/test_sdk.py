"""The Python SDK end to end: ``AsyncCorral`` and its sync twin ``Corral`` against a real ``corral serve`` on gVisor,
and the README's SDK examples run as they are printed."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from corral.client import (
    AsyncCorral,
    AsyncWorkspace,
    Corral,
    InvalidRequestError,
    ProviderNotFoundError,
    SessionNotFoundError,
    SessionStateError,
    SnapshotNotFoundError,
    ToolError,
    ToolNotAllowedError,
    WorkspaceDestroyedError,
    WorkspaceFileNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from tests.e2e.conftest import TOKEN, Server

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).parent / "examples"
TOOLS_BUT_GIT = ["bash", "read", "write", "edit", "grep", "glob"]


@pytest.fixture
async def corral(server: Server) -> AsyncIterator[AsyncCorral]:
    """An async client for the module's server."""
    async with AsyncCorral(server.url, TOKEN) as client:
        yield client


async def test_workspace_exec_and_files(corral: AsyncCorral) -> None:
    """A gVisor workspace runs shell lines and argv lists (exit codes, cwd, env) and its files can be written,
    read, listed, globbed, chmod-ed, moved and deleted; leaving ``async with`` destroys it."""
    async with await corral.workspaces.create(provider="gvisor") as ws:
        assert (ws.status, ws.info.provider) == ("ready", "gvisor")
        result = await ws.exec("echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, "out\n", "err\n", False)
        assert (await ws.exec(["printf", "%s|", "a b", "$HOME"])).stdout == "a b|$HOME|", "argv: no shell"
        assert (await ws.exec("pwd; echo $GREETING", cwd="/tmp", env={"GREETING": "hi"})).stdout == "/tmp\nhi\n"

        assert await ws.files.write("dir/data.bin", bytes(range(256))) == 256
        assert await ws.files.read("dir/data.bin") == bytes(range(256))
        await ws.files.write("dir/run.sh", "#!/bin/sh\necho ran\n")
        await ws.files.chmod("dir/run.sh", 0o755)
        assert (await ws.files.stat("dir/run.sh")).mode == 0o755
        assert (await ws.exec("./dir/run.sh")).stdout == "ran\n"
        assert [f.name for f in await ws.files.list("dir")] == ["data.bin", "run.sh"]
        assert [p.rsplit("/", 1)[-1] for p in await ws.files.glob("**/*.sh")] == ["run.sh"]
        await ws.files.move("dir/run.sh", "bin/run.sh")
        assert not await ws.files.exists("dir/run.sh") and await ws.files.exists("bin/run.sh")
        await ws.files.delete("dir", recursive=True)
        with pytest.raises(WorkspaceFileNotFoundError) as missing:
            await ws.files.read("dir/data.bin")
        assert isinstance(missing.value, FileNotFoundError)
    assert ws.status == "destroyed"


async def test_stop_resume_destroy_and_the_errors_they_lead_to(corral: AsyncCorral) -> None:
    """Stop keeps /workspace and refuses exec (WorkspaceStateError), resume brings it back, destroy makes exec
    raise WorkspaceDestroyedError; unknown ids and providers raise their typed errors."""
    ws = await corral.workspaces.create(provider="gvisor")
    try:
        await ws.files.write("keep.txt", "kept")
        assert (await ws.stop()).status == "stopped"
        with pytest.raises(WorkspaceStateError):
            await ws.exec("true")
        assert (await ws.resume()).status == "ready"
        assert await ws.files.read_text("keep.txt") == "kept"
        assert ws.id in [w.id for w in await corral.workspaces.list()]
    finally:
        await ws.destroy()
    with pytest.raises(WorkspaceDestroyedError):
        await ws.exec("true")
    assert (await corral.workspaces.get(ws.id)).status == "destroyed"
    with pytest.raises(WorkspaceNotFoundError) as unknown:
        await corral.workspaces.get("no-such-workspace")
    assert isinstance(unknown.value, LookupError)
    with pytest.raises(ProviderNotFoundError, match="unknown provider 'nope'"):
        await corral.workspaces.create(provider="nope")


async def test_providers_and_pool(corral: AsyncCorral) -> None:
    """providers() shows gVisor healthy and Firecracker unhealthy with its reason; pool() reports the pools."""
    statuses = {p.name: p for p in await corral.providers()}
    assert statuses["gvisor"].healthy and statuses["gvisor"].last_check is not None
    assert not statuses["firecracker"].healthy and statuses["firecracker"].error
    report = await corral.pool()
    assert all(p.target == 0 for p in report.pools), "the e2e server runs with CORRAL_WARM_POOL_SIZE=0"


async def test_agent_type_session_and_tools(corral: AsyncCorral) -> None:
    """An agent type is created and reconfigured; a session waits until active, its tools work (one shell per
    session), a tool outside the type's list raises ToolNotAllowedError with the server's sentence and is
    audited; ending it makes further calls a session_state_conflict."""
    workspace = {"enabled": True, "tools": TOOLS_BUT_GIT}
    agent_type = await corral.agent_types.create(f"sdk-{secrets.token_hex(4)}", workspace=workspace)
    assert agent_type.tools == tuple(TOOLS_BUT_GIT)
    config = {**agent_type.workspace, "setup_commands": ["echo ready > setup.txt"]}
    assert (await corral.agent_types.set_config(agent_type.id, config))["setup_commands"] == ["echo ready > setup.txt"]
    assert (await corral.agent_types.config(agent_type.id))["setup_commands"] == ["echo ready > setup.txt"]
    assert agent_type.id in [t.id for t in await corral.agent_types.list()]

    async with await corral.sessions.start(agent_type.id, wait=True) as session:
        assert (session.status, session.info.degraded, session.info.warnings) == ("active", False, ())
        tools = session.tools
        await tools.bash("mkdir -p src && cd src && export NAME=corral")
        assert (await tools.bash("pwd; echo $NAME")).stdout == "/workspace/src\ncorral\n"
        assert await tools.write("src/app.py", "x = 1\ny = 1\n") == 12
        assert (await tools.read("src/app.py", offset=2)).content == "y = 1\n"
        with pytest.raises(ToolError, match="occurs 2 times"):
            await tools.edit("src/app.py", " = 1", " = 2")  # ambiguous without replace_all
        assert await tools.edit("src/app.py", " = 1", " = 2", replace_all=True) == 2
        found = await tools.grep("= 2", include="*.py")
        assert [(m.path, m.line_number) for m in found.matches] == [("src/app.py", 1), ("src/app.py", 2)]
        assert (await tools.glob("**/*.py")).paths == ("src/app.py",)
        with pytest.raises(ToolNotAllowedError) as refused:
            await tools.git("status")
        assert str(refused.value) == "Tool 'git' is not enabled for this agent type"
        ws = await session.workspace()
        assert ws is not None and await ws.files.read_text("setup.txt") == "ready\n"
        assert ("git", "refused") in [(e.tool, e.status) for e in await session.audit()]
    assert session.status == "ended"
    with pytest.raises(SessionStateError):
        await session.tools.bash("ls")
    with pytest.raises(SessionNotFoundError):
        await corral.sessions.get("no-such-session")


def test_sync_twin_end_to_end(server: Server) -> None:
    """The sync client does the same without await: create, exec, files, list, destroy on leaving ``with``."""
    with Corral(server.url, TOKEN) as corral, corral.workspaces.create(provider="gvisor") as ws:
        assert ws.exec(["echo", "sync"]).stdout == "sync\n"
        assert ws.files.write("a.txt", "A") == 1
        assert ws.files.read("a.txt") == b"A"
        assert ws.id in [w.id for w in corral.workspaces.list()]
    assert ws.status == "destroyed"


# The agent ends an exec's process group with it, so the counter leaves it with setsid; the exec waits until the
# counter has written its pid. Memory was kept when, after a resume or restore, the same pid counts on.
COUNTER = (
    "setsid sh -c 'echo $$ > /tmp/counter.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; "
    "sleep 0.05; done' >/dev/null 2>&1 < /dev/null & while [ ! -s /tmp/counter.pid ]; do sleep 0.01; done"
)


@pytest.fixture
def snapshots_cleaned(server: Server) -> Iterator[None]:
    """Delete every snapshot a test leaves behind (the server fixture destroys only workspaces)."""
    yield
    for snapshot in server.client.get("/api/v1/agent/snapshots").json()["snapshots"]:
        server.client.delete(f"/api/v1/agent/snapshots/{snapshot['id']}")


async def _counter(ws: AsyncWorkspace) -> tuple[int, int]:
    """(pid, count) of the workspace's counter (read again when caught between its truncate and its write)."""
    out: list[str] = []
    for _ in range(20):
        out = (await ws.exec("cat /tmp/counter.pid /tmp/counter")).stdout.split()
        if len(out) == 2:
            return int(out[0]), int(out[1])
    raise AssertionError(f"no counter in {ws.id}: {out}")


async def _counting_on(ws: AsyncWorkspace, pid: int, past: int, *, deadline_s: float = 20) -> int:
    """Poll until the counter with ``pid`` has passed ``past``; its count then."""
    deadline = time.monotonic() + deadline_s
    while True:
        now_pid, count = await _counter(ws)
        assert now_pid == pid, f"{ws.id}: a different counter process ({now_pid}, was {pid}): memory was not kept"
        if count > past:
            return count
        assert time.monotonic() < deadline, f"{ws.id}: the counter stayed at {count}"
        await asyncio.sleep(0.05)


async def test_pause_keeps_memory_and_resume_brings_it_back(corral: AsyncCorral) -> None:
    """``ws.pause()`` on gVisor answers ``memory`` and leaves the workspace paused (exec refused); resume brings
    back the same counting process and the files in /tmp, three cycles in a row."""
    async with await corral.workspaces.create(provider="gvisor") as ws:
        await ws.exec(COUNTER + "; echo kept > /tmp/note")
        pid, count = await _counter(ws)
        for _ in range(3):
            assert await ws.pause() == "memory"
            assert ws.status == "paused" and (await corral.workspaces.get(ws.id)).status == "paused"
            with pytest.raises(WorkspaceStateError):
                await ws.exec("true")
            assert await ws.pause() == "memory", "pausing a paused workspace answers what it holds"
            assert (await ws.resume()).status == "ready"
            count = await _counting_on(ws, pid, count)
        assert (await ws.exec("cat /tmp/note")).stdout == "kept\n"


async def test_snapshot_restore_list_and_delete(corral: AsyncCorral, snapshots_cleaned: None) -> None:
    """A named snapshot holds memory; list finds it by workspace and by name, get returns it; a workspace created
    from it has the source's files and counting process and is independent of it; once deleted the snapshot is
    gone (SnapshotNotFoundError) while the restored workspace keeps running."""
    name = f"sdk-{secrets.token_hex(4)}"
    async with await corral.workspaces.create(provider="gvisor") as source:
        await source.exec(COUNTER + "; echo original > /root/data.txt")
        pid, count = await _counter(source)
        snapshot = await source.snapshot(name)
        assert (snapshot.name, snapshot.workspace_id, snapshot.status, snapshot.kind) == (
            name, source.id, "ready", "memory",
        )  # fmt: skip
        assert snapshot.size_bytes > 0 and snapshot.provider == "gvisor"
        count = await _counting_on(source, pid, count)  # the source carries on
        assert [s.id for s in await corral.snapshots.list(workspace_id=source.id)] == [snapshot.id]
        assert [s.id for s in await corral.snapshots.list(name=name)] == [snapshot.id]
        assert await corral.snapshots.list(name=f"{name}-other") == []
        assert await corral.snapshots.get(snapshot.id) == snapshot
        with pytest.raises(InvalidRequestError, match="provider: not allowed with from_snapshot"):
            await corral.workspaces.create(from_snapshot=snapshot.id, provider="gvisor")

        async with await corral.workspaces.create(from_snapshot=snapshot.id, metadata={"k": "v"}) as restored:
            assert (restored.status, restored.info.provider) == ("ready", "gvisor")
            assert restored.id != source.id
            assert restored.info.metadata["k"] == "v"
            assert (await restored.exec("cat /root/data.txt")).stdout == "original\n"
            await _counting_on(restored, pid, 0)
            await restored.exec("echo changed > /root/data.txt")
            assert (await source.exec("cat /root/data.txt")).stdout == "original\n"

            await corral.snapshots.delete(snapshot.id)
            with pytest.raises(SnapshotNotFoundError):
                await corral.snapshots.get(snapshot.id)
            with pytest.raises(SnapshotNotFoundError):
                await corral.snapshots.delete(snapshot.id)
            assert await corral.snapshots.list(workspace_id=source.id) == []
            assert (await restored.exec("cat /root/data.txt")).stdout == "changed\n", "deleting left it running"


async def test_fork_gives_independent_running_copies(corral: AsyncCorral, snapshots_cleaned: None) -> None:
    """``ws.fork(2)`` returns two ready workspaces with the source's files and counting process, their own ids and
    hostnames; a write in one is seen by neither the other nor the source, which keeps running."""
    async with await corral.workspaces.create(provider="gvisor") as source:
        await source.exec(COUNTER + "; echo shared > /workspace/shared.txt")
        pid, count = await _counter(source)
        forks = await source.fork(2)
        try:
            assert len(forks) == 2 and all(f.status == "ready" for f in forks)
            assert len({source.id, *(f.id for f in forks)}) == 3
            hostnames = [(await w.exec("hostname")).stdout for w in (source, *forks)]
            assert len(set(hostnames)) == 3, hostnames
            for fork in forks:
                assert await fork.files.read_text("shared.txt") == "shared\n"
                await _counting_on(fork, pid, 0)
            await forks[0].files.write("mine.txt", "fork 0")
            assert not await forks[1].files.exists("mine.txt")
            assert not await source.files.exists("mine.txt")
            await _counting_on(source, pid, count)
        finally:
            for fork in forks:
                await fork.destroy()
    assert await corral.snapshots.list(workspace_id=source.id) == [], "fork's own snapshot is not left behind"


def test_sync_twin_pause_snapshot_restore_fork(server: Server, snapshots_cleaned: None) -> None:
    """The sync client pauses and resumes, snapshots, restores, lists, forks and deletes without await."""
    with Corral(server.url, TOKEN) as corral, corral.workspaces.create(provider="gvisor") as ws:
        ws.files.write("a.txt", "A")
        assert (ws.pause(), ws.status) == ("memory", "paused")
        assert ws.resume().status == "ready"
        snapshot = ws.snapshot()
        assert snapshot.name is None and snapshot.id in [s.id for s in corral.snapshots.list()]
        with corral.workspaces.create(from_snapshot=snapshot.id) as restored:
            assert restored.files.read("a.txt") == b"A"
        (fork,) = ws.fork()
        with fork:
            assert fork.files.read("a.txt") == b"A" and fork.id != ws.id
        corral.snapshots.delete(snapshot.id)
        assert corral.snapshots.list(workspace_id=ws.id) == []


def _run_example(server: Server, name: str) -> str:
    env = {**os.environ, "CORRAL_URL": server.url, "CORRAL_API_TOKEN": TOKEN}
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_readme_sdk_examples_run_as_printed(server: Server) -> None:
    """The README's async and sync SDK examples print what their comments say, twice in a row (the async one
    removes the agent type it creates), and leave no workspace or agent type behind."""
    before = {w["id"] for w in server.client.get("/api/v1/agent/workspaces").json()["workspaces"]}
    for _ in range(2):
        assert _run_example(server, "sdk_async.py").splitlines() == [
            "0 hello from Linux",
            "['hello.py']",
            "True",
            "[('src/app.py', 1)]",
            "Tool 'bash' is not enabled for this agent type",
            "[('write', 'ok'), ('grep', 'ok'), ('bash', 'refused')]",
        ]
    assert "editor" not in {t["name"] for t in server.client.get("/api/v1/agent-types").json()["agent_types"]}
    assert _run_example(server, "sdk_sync.py") == "same methods, no await\n"
    after = {w["id"] for w in server.client.get("/api/v1/agent/workspaces").json()["workspaces"]}
    assert after <= before
