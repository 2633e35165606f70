"""``corral mcp`` through the ``mcp`` package's own stdio client, launched as a subprocess against a real server on
gVisor: only allowed tools are listed, calls run in the session's workspace, refusals are the server's, and with
``--agent-type`` the session lives exactly as long as the MCP server. The README's MCP example runs as printed, in
a fresh shell, in test_readme.py."""

from __future__ import annotations

import re
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from corral.client import AsyncCorral
from tests.e2e.conftest import TOKEN, Server

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
CORRAL = str(BIN / "corral")
REFUSED = "Tool '{}' is not enabled for this agent type"


@pytest.fixture
async def corral(server: Server) -> AsyncIterator[AsyncCorral]:
    """An async client for the module's server."""
    async with AsyncCorral(server.url, TOKEN) as client:
        yield client


def _params(server: Server, *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=CORRAL, args=["mcp", *args], env={"CORRAL_URL": server.url, "CORRAL_API_TOKEN": TOKEN}
    )


def _text(result: types.CallToolResult) -> str:
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


async def test_session_tools_over_mcp_follow_the_policy(server: Server, corral: AsyncCorral, tmp_path: Path) -> None:
    """list_tools shows only bash and read, with their argument schemas; bash and read run in the session's
    workspace; write and git are refused with the server's sentence and audited; the session outlives the MCP
    server started with --session."""
    agent_type = await corral.agent_types.create(
        f"mcp-{secrets.token_hex(4)}", workspace={"enabled": True, "tools": ["bash", "read"]}
    )
    async with await corral.sessions.start(agent_type.id, wait=True) as session:
        with (tmp_path / "mcp.log").open("w") as errlog:
            async with (
                stdio_client(_params(server, "--session", session.id), errlog=errlog) as (read, write),
                ClientSession(read, write) as mcp,
            ):
                await mcp.initialize()
                tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
                assert sorted(tools) == ["bash", "read"]
                assert tools["bash"].input_schema["required"] == ["command"]
                assert set(tools["read"].input_schema["properties"]) == {"path", "offset", "limit"}

                ran = await mcp.call_tool("bash", {"command": "echo hello > note.txt; cat note.txt; exit 2"})
                assert not ran.is_error
                assert _text(ran) == "hello\n[exit code 2]"
                assert ran.structured_content is not None and ran.structured_content["exit_code"] == 2
                read_back = await mcp.call_tool("read", {"path": "note.txt"})
                assert (read_back.is_error, _text(read_back)) == (False, "hello\n")
                refusals: list[tuple[str, dict[str, Any]]] = [("write", {"path": "x", "content": "y"}),
                                                              ("git", {"args": ["status"]})]  # fmt: skip
                for tool, arguments in refusals:
                    refused = await mcp.call_tool(tool, arguments)
                    assert refused.is_error and _text(refused) == REFUSED.format(tool)
                missing = await mcp.call_tool("read", {"path": "nope.txt"})
                assert missing.is_error and "nope.txt" in _text(missing)
        audit = [(e.tool, e.status) for e in await session.audit()]
        assert audit[:4] == [("bash", "ok"), ("read", "ok"), ("write", "refused"), ("git", "refused")]
        assert (await session.refresh()).status == "active", "--session leaves the session running"
    assert session.status == "ended"


async def test_agent_type_mode_starts_and_ends_its_own_session(
    server: Server, corral: AsyncCorral, tmp_path: Path
) -> None:
    """``corral mcp --agent-type`` starts a session, serves it once active, and ends it (workspace destroyed)
    when the MCP client closes the connection."""
    agent_type = await corral.agent_types.create(
        f"mcp-owned-{secrets.token_hex(4)}", workspace={"enabled": True, "tools": ["bash"]}
    )
    log_path = tmp_path / "mcp.log"
    with log_path.open("w") as errlog:
        async with (
            stdio_client(_params(server, "--agent-type", agent_type.id), errlog=errlog) as (read, write),
            ClientSession(read, write) as mcp,
        ):
            initialized = await mcp.initialize()
            found = re.search(r"session ([0-9a-f]+)", initialized.instructions or "")
            assert found, initialized.instructions
            session_id = found.group(1)
            assert [tool.name for tool in (await mcp.list_tools()).tools] == ["bash"]
            assert _text(await mcp.call_tool("bash", {"command": "echo served"})) == "served"
            workspace_id = (await corral.sessions.get(session_id)).info.workspace_id
    session = await corral.sessions.get(session_id)
    assert session.status == "ended", log_path.read_text()
    assert (await corral.workspaces.get(str(workspace_id))).status == "destroyed"
    log = log_path.read_text()
    assert f"started session {session_id}" in log and f"ended session {session_id}" in log
