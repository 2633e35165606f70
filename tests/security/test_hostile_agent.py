"""A workspace whose agent is replaced or driven by root inside it cannot change the agent's code path, nor make the
server allocate what it sends (finding 2 of the security review)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import pytest

from corral.errors import ProviderUnavailableError, WorkspaceBrokenError
from corral.providers.base import ExecRequest, WorkspaceSpec
from corral.providers.docker import DockerProvider
from corral.providers.gvisor import GVisorProvider
from tests.conftest import BASE_IMAGE
from tests.e2e.conftest import Server
from tests.security.conftest import MiB, rss_bytes

pytestmark = [pytest.mark.integration]

# The agent writes frames on fd 3 (its stdout, kept aside at start); root in the workspace can open it through
# /proc and write whatever it likes into the host's stream.
AGENT_FRAMES = "/proc/$(pgrep -f 'corral/agent[.]pyc$')/fd/3"
ONE_GIB_HEADER = r"printf '\100\000\000\000'"  # a u32 header length of 1 GiB


async def _events_of(provider: DockerProvider, workspace_id: str, *, settle_s: float = 2.0) -> list[str]:
    """The kinds of the events the provider reported for this workspace (others run workspaces concurrently), once
    no new one came for ``settle_s`` seconds (a violation is reported after a grace period)."""
    seen: list[str] = []
    quiet_since = asyncio.get_running_loop().time()
    while asyncio.get_running_loop().time() - quiet_since < settle_s:
        now = [e.kind for e in provider.events if e.workspace_id == workspace_id]  # type: ignore[attr-defined]
        if now != seen:
            seen, quiet_since = now, asyncio.get_running_loop().time()
        await asyncio.sleep(0.05)
    return seen


async def _compile_logger(tmp_path: Path) -> bytes:
    """A shared library that appends the command line of every process it loads into to /workspace/preloaded.log."""
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <stdio.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void mark(void) {\n"
        '  char buf[512]; FILE *in = fopen("/proc/self/cmdline", "r"); size_t n = in ? fread(buf, 1, 511, in) : 0;\n'
        "  for (size_t i = 0; i < n; i++) if (!buf[i]) buf[i] = ' ';\n"
        '  buf[n] = 0; FILE *out = fopen("/workspace/preloaded.log", "a"); if (out) { fprintf(out, "%s\\n", buf);'
        " fclose(out); }\n}\n"
    )
    library = tmp_path / "evil.so"
    compiler = await asyncio.create_subprocess_exec("gcc", "-shared", "-fPIC", "-o", str(library), str(source))
    assert await compiler.wait() == 0
    return library.read_bytes()


async def _kill_agent(provider: DockerProvider, workspace_id: str) -> None:
    """Root kills the agent; the command doing it loses its own connection, as it should."""
    with pytest.raises(ProviderUnavailableError, match="lost the connection"):
        await provider.exec(
            workspace_id, ExecRequest("kill -9 $(pgrep -f 'corral/agent[.]pyc$'); sleep 5", timeout_s=10)
        )


async def test_the_agent_runs_from_a_read_only_runtime(provider: DockerProvider, workspace_id: str) -> None:
    """The agent is started by absolute paths into /.corral, and nothing inside can write there: not even through
    gVisor 20240729's directfs, which truncated a read-only bind's host file on open(O_TRUNC) while answering EROFS
    (the runtime is a read-only mount on the host too)."""
    runtime = Path(await provider.agent_runtime.ensure())
    before = {f: (runtime / f).read_bytes() for f in ("bin/python3", "agent.py", "agent.pyc", "ld.so")}
    result = await provider.exec(
        workspace_id,
        ExecRequest(
            "tr '\\0' ' ' < /proc/$(pgrep -f 'corral/agent[.]pyc$')/cmdline; echo; "
            "touch /.corral/x 2>&1; cp /bin/true /.corral/bin/python3 2>&1; "
            "sh -c 'echo > /.corral/nopreload' 2>&1; true"
        ),
    )
    lines = result.stdout.decode().splitlines()
    assert lines[0].split() == [
        "/.corral/ld.so",
        "--inhibit-cache",
        "--library-path",
        "/.corral/lib",
        "/.corral/bin/python3",
        "-I",
        "-S",
        "/.corral/agent.pyc",
    ]
    assert len(lines) == 4 and all("Read-only file system" in line for line in lines[1:]), lines
    truncating = (
        "exec 3< /.corral/agent.py; : > /.corral/agent.py; : > /.corral/agent.pyc; : > /.corral/bin/python3; "
        ": > /.corral/ld.so; true"
    )
    await provider.exec(workspace_id, ExecRequest(truncating))
    assert {f: (runtime / f).read_bytes() for f in before} == before, "a workspace changed the host's agent runtime"
    assert (await provider.exec(workspace_id, ExecRequest("echo alive"))).stdout == b"alive\n"


async def test_a_planted_python3_never_becomes_the_agent(provider: DockerProvider, workspace_id: str) -> None:
    """Root plants impostors for python3 on PATH and in /usr/bin, then kills the agent: the next call starts the real
    agent again, and the workspace recovers (the review's impostor sent a 1 GiB frame)."""
    impostor = f"#!/bin/sh\n{ONE_GIB_HEADER}\nexit 97\n"
    await provider.write_file(workspace_id, "/usr/local/bin/python3", impostor.encode(), mode=0o755)
    await provider.write_file(workspace_id, "/usr/local/bin/python3.11", impostor.encode(), mode=0o755)
    planted = await provider.exec(
        workspace_id,
        ExecRequest("cp /usr/local/bin/python3 /usr/bin/python3.11 && python3 -c pass >/dev/null; echo $?"),
    )
    assert planted.stdout.decode().strip() == "97", "the impostor must be what PATH finds inside the workspace"
    await _kill_agent(provider, workspace_id)
    result = await provider.exec(
        workspace_id, ExecRequest("echo recovered; tr '\\0' ' ' < /proc/$(pgrep -f 'corral/agent[.]pyc$')/cmdline")
    )
    assert result.stdout.decode().splitlines()[0] == "recovered"
    assert "/.corral/bin/python3" in result.stdout.decode()
    assert await _events_of(provider, workspace_id) == []


async def test_ld_so_preload_does_not_reach_the_agent(
    provider: DockerProvider, workspace_id: str, tmp_path: Path
) -> None:
    """A library root adds to /etc/ld.so.preload loads into every program inside, but never into the agent."""
    library = await _compile_logger(tmp_path)
    await provider.write_file(workspace_id, "/workspace/evil.so", library, mode=0o755)
    await provider.exec(workspace_id, ExecRequest("echo /workspace/evil.so >> /etc/ld.so.preload"))
    await _kill_agent(provider, workspace_id)
    result = await provider.exec(workspace_id, ExecRequest("cat /workspace/preloaded.log"))
    log = result.stdout.decode()
    assert "cat /workspace/preloaded.log" in log, "the planted library must load into ordinary programs"
    assert "/.corral/agent.py" not in log


async def test_nothing_in_the_workspace_or_its_environment_loads_into_the_agent(
    provider: DockerProvider, tmp_path: Path
) -> None:
    """A workspace whose environment sets LD_PRELOAD (and GLIBC_TUNABLES), with a pyvenv.cfg and a fake standard
    library planted in /workspace, starts its agent from /.corral alone: commands still get the environment they
    were given, the agent's process maps nothing from /workspace."""
    library = await _compile_logger(tmp_path)
    spec = WorkspaceSpec(
        id=f"t{uuid.uuid4().hex[:15]}",
        image=BASE_IMAGE,
        env={"LD_PRELOAD": "/workspace/evil.so", "GLIBC_TUNABLES": "glibc.malloc.check=3"},
    )
    await provider.create(spec)
    try:
        await provider.write_file(spec.id, "/workspace/evil.so", library, mode=0o755)
        await provider.write_file(spec.id, "/workspace/pyvenv.cfg", b"home = /workspace/fake/bin\n")
        await provider.write_file(spec.id, "/workspace/fake/lib/python3.11/os.py", b"raise SystemExit(99)\n")
        await _kill_agent(provider, spec.id)
        result = await provider.exec(
            spec.id,
            ExecRequest(
                "echo $LD_PRELOAD $GLIBC_TUNABLES; "
                "grep -c /workspace /proc/$(pgrep -f 'corral/agent[.]pyc$')/maps; true"
            ),
        )
        lines = result.stdout.decode().split("\n")
        assert lines[0] == "/workspace/evil.so glibc.malloc.check=3", "commands keep their environment"
        if isinstance(provider, GVisorProvider):
            assert lines[1] == "0", "the agent maps nothing from /workspace"
        else:  # runc enforces the agent's non-dumpable flag: its maps are not even readable from inside
            assert lines[1] == "", lines
        log = (await provider.exec(spec.id, ExecRequest("cat /workspace/preloaded.log"))).stdout.decode()
        assert "echo" in log or "grep" in log, "the preload reaches ordinary programs"
        assert "/.corral/agent.py" not in log
    finally:
        await provider.destroy(spec.id)


async def test_an_oversized_frame_breaks_the_connection_not_the_server(
    provider: DockerProvider, workspace_id: str
) -> None:
    """A 1 GiB frame header written into the agent's stream ends that connection with a clear error and a broken
    event; nothing of the announced size is allocated, and the next connection is a fresh agent. Under runc the
    agent is not dumpable, so root inside cannot even open its stream."""
    command = f"{ONE_GIB_HEADER} > {AGENT_FRAMES}; sleep 5"
    if not isinstance(provider, GVisorProvider):
        result = await provider.exec(workspace_id, ExecRequest(command, timeout_s=30))
        assert b"Permission denied" in result.stderr
        assert await _events_of(provider, workspace_id) == []
        return
    with pytest.raises(WorkspaceBrokenError, match="1073741824 bytes, over the 1048576-byte limit"):
        await provider.exec(workspace_id, ExecRequest(command, timeout_s=30))
    assert await _events_of(provider, workspace_id) == ["broken"]
    assert (await provider.exec(workspace_id, ExecRequest("echo fresh"))).stdout == b"fresh\n"


async def test_a_garbage_frame_breaks_the_connection(provider: DockerProvider, workspace_id: str) -> None:
    """A frame whose header is not JSON ends the connection with the reason (gVisor; runc refuses the write)."""
    garbage = r"printf '\000\000\000\005hello\000\000\000\000'"
    command = f"{garbage} > {AGENT_FRAMES}; sleep 5"
    if not isinstance(provider, GVisorProvider):
        result = await provider.exec(workspace_id, ExecRequest(command, timeout_s=30))
        assert b"Permission denied" in result.stderr
        return
    with pytest.raises(WorkspaceBrokenError, match="not JSON"):
        await provider.exec(workspace_id, ExecRequest(command, timeout_s=30))


async def test_a_stopped_agent_costs_a_bounded_wait(provider: DockerProvider, workspace_id: str) -> None:
    """Root stops the agent (SIGSTOP): a file call no longer hangs forever; after the answer deadline the stuck
    connection is dropped and a fresh agent answers."""
    provider.agent_answer_timeout_s = 2.0
    await provider.exec(
        workspace_id,
        ExecRequest("setsid sh -c 'sleep 0.5; kill -STOP $(pgrep -f 'corral/agent[.]pyc$')' >/dev/null 2>&1 &"),
    )
    await asyncio.sleep(1.0)
    started = asyncio.get_running_loop().time()
    with contextlib.suppress(ProviderUnavailableError):
        await provider.stat(workspace_id, "/workspace")
    assert asyncio.get_running_loop().time() - started < 15
    info = await provider.stat(workspace_id, "/workspace")
    assert info.type == "dir"


def test_a_broken_workspace_is_reported_over_http_and_the_server_stays_small(
    gvisor_server: Server, workspace: str
) -> None:
    """Through the API on gVisor: the hostile frame answers 502 ``workspace_broken``, the workspace reads ``error``
    with the reason (not ``ready``), the server's memory stays far below what the frame announced, and resume brings
    the workspace back with a fresh agent."""
    client = gvisor_server.client
    before = rss_bytes(gvisor_server.process.pid)
    answer = client.post(
        f"/api/v1/agent/workspaces/{workspace}/exec",
        json={"command": f"{ONE_GIB_HEADER} > {AGENT_FRAMES}; sleep 5", "timeout_s": 30},
    )
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "workspace_broken"
    after = rss_bytes(gvisor_server.process.pid)
    assert after < 300 * MiB and after - before < 50 * MiB, (before, after)
    record = client.get(f"/api/v1/agent/workspaces/{workspace}").json()
    assert record["status"] == "error"
    assert "over the 1048576-byte limit" in record["error"]
    refused = client.post(f"/api/v1/agent/workspaces/{workspace}/exec", json={"command": "true"})
    assert refused.status_code == 409
    resumed = client.post(f"/api/v1/agent/workspaces/{workspace}/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "ready", resumed.text
    again = client.post(f"/api/v1/agent/workspaces/{workspace}/exec", json={"command": "echo back"})
    assert again.json()["stdout"] == "back\n"
