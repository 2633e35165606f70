"""Streamed exec and stdin over HTTP: ``POST .../exec`` with ``stream: true`` and ``stdin``, against a real server
and a real gVisor workspace."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral.client import AsyncCorral, AsyncWorkspace, ExecChunk, ExecResult, WorkspaceInfo, WorkspaceNotFoundError
from tests.e2e.conftest import TOKEN, Server, gvisor_workspace

pytestmark = pytest.mark.e2e

API = "/api/v1/agent/workspaces"


@pytest.fixture(scope="module")
def workspace(server: Server) -> Iterator[str]:
    """One gVisor workspace for the module, destroyed at the end."""
    with gvisor_workspace(server) as workspace_id:
        yield workspace_id


def _stream(server: Server, workspace_id: str, **body: Any) -> list[tuple[float, dict[str, Any]]]:
    """Every NDJSON line of a streamed exec, each with the monotonic time it arrived."""
    lines = []
    with server.client.stream("POST", f"{API}/{workspace_id}/exec", json={"stream": True, **body}) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("application/x-ndjson")
        for line in answer.iter_lines():
            if line:
                lines.append((time.monotonic(), json.loads(line)))
    return lines


def test_a_line_printed_at_once_arrives_before_a_3_s_command_ends(server: Server, workspace: str) -> None:
    """The first line of ``echo first; sleep 3; echo last`` arrives seconds before the exit line, which is last."""
    lines = _stream(server, workspace, command="echo first; sleep 3; echo last")
    first = next(t for t, line in lines if line.get("data") == "first\n")
    ended, exit_line = lines[-1]
    assert exit_line["exit_code"] == 0 and exit_line["timed_out"] is False
    assert exit_line["duration_ms"] >= 3000
    assert ended - first >= 2.5, lines
    assert "".join(line.get("data", "") for _, line in lines) == "first\nlast\n"


def test_stdin_reaches_cat_and_stderr_is_tagged(server: Server, workspace: str) -> None:
    """``stdin`` is read by the command then EOF, streamed or not; stderr chunks say ``stderr``; the exit is last."""
    streamed = [line for _, line in _stream(server, workspace, command="cat; echo oops >&2; exit 3", stdin="x\n")]
    assert {"stream": "stdout", "data": "x\n"} in streamed
    assert {"stream": "stderr", "data": "oops\n"} in streamed
    assert streamed[-1]["exit_code"] == 3 and all("exit_code" not in line for line in streamed[:-1])
    whole = server.client.post(f"{API}/{workspace}/exec", json={"command": "wc", "args": ["-c"], "stdin": "hé\n"})
    assert (whole.json()["exit_code"], whole.json()["stdout"].split()) == (0, ["4"])
    argv = server.client.post(
        f"{API}/{workspace}/exec", json={"command": "cat", "args": ["-n"], "mode": "argv", "cwd": "/tmp", "stdin": "a"}
    )
    assert argv.json()["stdout"] == "     1\ta"
    left = server.client.post(f"{API}/{workspace}/exec", json={"command": "ls -a /tmp | grep -c corral-stdin || true"})
    assert left.json()["stdout"].strip() == "0"  # every input file was removed


def test_without_stdin_the_command_reads_end_of_file(server: Server, workspace: str) -> None:
    """A streamed ``cat`` without ``stdin`` ends at once with nothing read (its input is /dev/null)."""
    lines = [line for _, line in _stream(server, workspace, command="cat; echo done")]
    assert lines == [{"stream": "stdout", "data": "done\n"}, lines[-1]] and lines[-1]["exit_code"] == 0


def test_unknown_workspace_is_a_404_before_the_stream(server: Server) -> None:
    """A streamed exec in a workspace that does not exist is the ordinary JSON 404, not a stream."""
    answer = server.client.post(f"{API}/nope/exec", json={"command": "true", "stream": True, "stdin": "x"})
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "workspace_not_found"


def test_timeout_ends_the_stream_with_timed_out(server: Server, workspace: str) -> None:
    """A streamed command past ``timeout_s`` is killed; the last line says ``timed_out`` with exit code 137."""
    lines = [line for _, line in _stream(server, workspace, command="echo a; sleep 30", timeout_s=1)]
    assert lines[0] == {"stream": "stdout", "data": "a\n"}
    assert (lines[-1]["exit_code"], lines[-1]["timed_out"]) == (137, True)


def test_closing_the_connection_kills_the_command(server: Server, workspace: str) -> None:
    """A client that goes away after the first chunk ends the command: its marker process disappears."""
    marker = f"sleep 987{int(time.time()) % 1000}"
    with server.client.stream(
        "POST", f"{API}/{workspace}/exec", json={"command": f"echo started; {marker}", "stream": True}
    ) as answer:
        first = json.loads(next(answer.iter_lines()))
        assert first == {"stream": "stdout", "data": "started\n"}
    # The process list is read through argv (no shell line containing the marker itself).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ps = server.client.post(
            f"{API}/{workspace}/exec", json={"command": "ps", "args": ["-eo", "args"], "mode": "argv"}
        )
        if marker not in ps.json()["stdout"]:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"{marker!r} still runs 30 s after the client went away:\n{ps.json()['stdout']}")


async def test_async_sdk_exec_stream_yields_chunks_then_the_result(server: Server, workspace: str) -> None:
    """``AsyncWorkspace.exec_stream`` yields ExecChunk items as produced and an ExecResult last; an unknown workspace
    raises WorkspaceNotFoundError when awaited, before any output."""
    async with AsyncCorral(server.url, TOKEN) as corral:
        ws = await corral.workspaces.get(workspace)
        items = [item async for item in await ws.exec_stream("cat; echo e >&2; exit 2", stdin="in\n")]
        assert items[:-1] == [ExecChunk("stdout", "in\n"), ExecChunk("stderr", "e\n")]
        assert isinstance(items[-1], ExecResult) and items[-1].exit_code == 2
        ghost = AsyncWorkspace(corral, WorkspaceInfo.from_json({"id": "nope", "status": "ready"}))
        with pytest.raises(WorkspaceNotFoundError):
            await ghost.exec_stream("true")
