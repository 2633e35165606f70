"""``corral mcp`` without a server: tool schemas, result rendering, and the MCP server forwarding every call to the
HTTP API (an in-memory MCP client against an in-memory Corral)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped,unused-ignore]
from mcp import Client, types

from corral.client import AsyncCorral, AsyncSession, SessionInfo
from corral.mcp_server import TOOL_SPECS, allowed_tools, build_server, render_result, tool_definitions
from corral.tools.policy import VALID_TOOLS

pytestmark = pytest.mark.unit

REFUSED = "Tool 'write' is not enabled for this agent type"


def test_every_tool_has_a_valid_schema_and_only_allowed_ones_are_listed() -> None:
    """Each of the seven tools has a description and a valid JSON schema; the list keeps the API's order and
    holds only the allowed tools."""
    assert tuple(TOOL_SPECS) == VALID_TOOLS
    for description, schema in TOOL_SPECS.values():
        assert description
        Draft202012Validator.check_schema(schema)
    assert [t.name for t in tool_definitions(["read", "bash", "ssh"])] == ["bash", "read"]


@pytest.mark.parametrize(
    ("tool", "good", "bad"),
    [
        ("bash", {"command": "ls", "timeout_s": 5}, {"cmd": "ls"}),
        ("read", {"path": "a", "offset": 1, "limit": 10}, {"path": "a", "offset": 0}),
        ("edit", {"path": "a", "old_string": "", "new_string": "b", "replace_all": True}, {"path": "a"}),
        ("grep", {"pattern": "x", "include": "*.py", "case_insensitive": True}, {"pattern": ""}),
        ("git", {"args": ["status"]}, {"args": "status"}),
    ],
)
def test_schemas_accept_the_api_arguments_and_reject_others(
    tool: str, good: dict[str, Any], bad: dict[str, Any]
) -> None:
    """A schema accepts the HTTP API's argument names and types and rejects unknown or malformed ones."""
    validator = Draft202012Validator(TOOL_SPECS[tool][1])
    assert validator.is_valid(good)
    assert not validator.is_valid(bad)


def test_results_render_as_text_a_model_reads() -> None:
    """bash shows output, stderr and a nonzero exit code; grep and glob list lines; empty results say so."""
    bash = {"exit_code": 2, "stdout": "out\n", "stderr": "err\n", "timed_out": False, "truncated": False}
    assert render_result("bash", bash) == "out\n[stderr]\nerr\n[exit code 2]"
    assert render_result("bash", {"exit_code": 0, "stdout": "", "stderr": ""}) == "[exit code 0]"
    assert render_result("read", {"content": "a\n", "total_lines": 9, "truncated": True}).endswith("more follow]")
    matches = {"matches": [{"path": "a.py", "line_number": 3, "line": "x = 1"}], "truncated": False}
    assert render_result("grep", matches) == "a.py:3: x = 1"
    assert render_result("glob", {"paths": [], "truncated": False}) == "no paths match"
    assert render_result("future", {"k": 1}) == json.dumps({"k": 1}, indent=2)


def _text(result: types.CallToolResult) -> str:
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


def _corral(calls: list[tuple[str, Any]]) -> AsyncCorral:
    """An in-memory Corral whose agent type allows bash and read and refuses everything else, as the server does."""

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/api/v1/agent-types/t1":
            workspace = {"enabled": True, "tools": ["bash", "read"]}
            return httpx.Response(200, json={"id": "t1", "name": "t", "workspace": workspace})
        tool = path.rsplit("/", 1)[-1]
        calls.append((tool, json.loads(request.content)))
        if tool not in ("bash", "read"):
            error = {"code": "tool_not_allowed", "message": f"Tool '{tool}' is not enabled for this agent type"}
            return httpx.Response(403, json={"error": {**error, "details": {"tool": tool}}})
        if tool == "bash":
            return httpx.Response(200, json={"exit_code": 0, "stdout": "hi\n", "stderr": "", "timed_out": False,
                                             "truncated": False})  # fmt: skip
        return httpx.Response(200, json={"content": "text\n", "total_lines": 1, "truncated": False})

    return AsyncCorral("http://corral.test", "t", transport=httpx.MockTransport(handler))


async def test_mcp_server_lists_allowed_tools_and_forwards_every_call() -> None:
    """The server lists bash and read with schemas, forwards calls (refused ones too, for the server to refuse and
    audit), and turns a refusal into an error result carrying the server's sentence."""
    calls: list[tuple[str, Any]] = []
    async with _corral(calls) as corral:
        session = AsyncSession(corral, SessionInfo.from_json({"id": "s1", "agent_type_id": "t1", "status": "active"}))
        tools = await allowed_tools(corral, session)
        assert tools == ("bash", "read")
        async with Client(build_server(session, tools)) as mcp:
            listed = await mcp.list_tools()
            assert [(t.name, t.input_schema["required"]) for t in listed.tools] == [
                ("bash", ["command"]), ("read", ["path"]),
            ]  # fmt: skip
            ran = await mcp.call_tool("bash", {"command": "echo hi"})
            assert (ran.is_error, _text(ran), ran.structured_content["exit_code"]) == (False, "hi", 0)
            refused = await mcp.call_tool("write", {"path": "x", "content": "y"})
            assert refused.is_error and _text(refused) == REFUSED
    assert calls == [("bash", {"command": "echo hi"}), ("write", {"path": "x", "content": "y"})]


async def test_a_session_snapshot_of_tools_wins_over_the_type() -> None:
    """When the session JSON carries its own tool list (its config snapshot), that list is what MCP shows."""
    async with _corral([]) as corral:
        raw = {"id": "s1", "agent_type_id": "t1", "status": "active", "tools": ["grep"]}
        assert await allowed_tools(corral, AsyncSession(corral, SessionInfo.from_json(raw))) == ("grep",)


_PIPE_ECHO = """
import asyncio, os, sys
from corral.mcp_server import _stdio_pipes

async def main() -> None:
    async with _stdio_pipes() as pipes:
        assert pipes is not None, "pipes were not served by the event loop"
        reader, writer = pipes
        assert os.read(0, 1) == b"", "fd 0 still reads the wire while serving"
        while line := await reader.readline():
            writer.write(line.upper())
            await writer.drain()
    assert os.get_blocking(0) and os.get_blocking(1)
    sys.stdout.write("restored\\n")

asyncio.run(main())
"""


def test_stdin_and_stdout_pipes_are_served_by_the_event_loop_and_given_back() -> None:
    """Over pipes, ``corral mcp`` reads and writes the wire from its event loop (no worker thread per message), keeps
    fd 0 off the wire while serving, and afterwards gives fd 0 and 1 back to the wire, blocking again."""
    done = subprocess.run(
        [sys.executable, "-c", _PIPE_ECHO],
        input=b'{"jsonrpc": "2.0"}\n' + b"x" * 300_000 + b"\nlast line\n",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b'{"JSONRPC": "2.0"}\n' + b"X" * 300_000 + b"\nLAST LINE\nrestored\n"
