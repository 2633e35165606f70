"""Agent tools scenario (``--only tools``): the session's tool calls against a plain exec on the same workspace, and
the same tool call through ``corral mcp`` against the HTTP tool call.

One server (gVisor), one session whose agent type enables bash, read and grep, and one ``corral mcp --session``
subprocess driven by the ``mcp`` package's own stdio client (as an MCP host runs it). Every round runs each way once,
in a fixed interleaved order, so load that comes and goes on the machine is spread evenly over all of them. Parts
show where the time goes: ``/bin/bash -c true`` is what a bash tool that started a shell per call would cost at
least, the SDK's call is the same tool call through httpx, and an MCP ping is the stdio round trip alone.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from bench.context import Bench
from bench.latency import SESSION_POLL_S, SESSION_TIMEOUT_S, wait_sessions
from bench.report import Row, Target
from bench.server import CorralServer, ServerError
from bench.stats import Samples
from corral.client import AsyncCorral

__all__ = ["tool_latency"]

BASH_RATIO_TARGET = 1.5
MCP_ADDED_TARGET_MS = 2.0
SETTLE_S = 0.01
"""An untimed pause before each timed call. The server writes a tool call's audit entry just after answering it, so
without the pause the call that follows in the round paid for that write (the MCP call follows the HTTP one: about
1.2 ms of its +3.4 ms in one run). An agent's calls are a model's turn apart anyway."""
TOOLS = ["bash", "read", "grep"]
NOTE = "".join(f"line {i}: the quick brown fox {'jumps' if i % 7 == 0 else 'sleeps'}\n" for i in range(200))
"""The file read and grepped: 200 short lines, 29 of them matching ``jumps``."""
CORRAL = str(Path(sys.executable).parent / "corral")


@dataclass
class _ToolSamples:
    exec_true: Samples = field(default_factory=Samples)
    exec_bash: Samples = field(default_factory=Samples)
    bash: Samples = field(default_factory=Samples)
    read: Samples = field(default_factory=Samples)
    grep: Samples = field(default_factory=Samples)
    sdk_bash: Samples = field(default_factory=Samples)
    mcp_bash: Samples = field(default_factory=Samples)
    mcp_read: Samples = field(default_factory=Samples)
    mcp_ping: Samples = field(default_factory=Samples)


async def _session(server: CorralServer) -> tuple[str, str]:
    """An active session with the tools enabled; returns its id and its workspace's."""
    agent_type = await server.create_agent_type(
        "bench-tools", {"enabled": True, "repo_source": {"type": "none"}, "tools": TOOLS}
    )
    session_id = await server.start_session(agent_type)
    outcome = (await wait_sessions(server, {session_id: 0.0}, poll_s=SESSION_POLL_S, timeout_s=SESSION_TIMEOUT_S))[
        session_id
    ]
    if not outcome.ok or outcome.workspace_id is None:
        raise ServerError(f"{server.name}: session {session_id} did not become active: {outcome.detail}")
    return session_id, outcome.workspace_id


def _mcp_text(result: types.CallToolResult) -> str:
    if result.is_error:
        raise ServerError(f"corral mcp: tool call failed: {result.content}")
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


async def tool_latency(bench: Bench) -> None:
    """bash, read and grep tool calls against POST exec ``true``; MCP against HTTP; interleaved round by round."""
    server = await bench.start_server("tools", {"CORRAL_PROVIDERS": "gvisor"})
    samples = _ToolSamples()
    try:
        session_id, workspace_id = await _session(server)
        await server.put_file(workspace_id, "/workspace/notes/fox.txt", NOTE.encode())
        tools_path = f"/api/v1/agent/sessions/{session_id}/tools"
        exec_path = f"/api/v1/agent/workspaces/{workspace_id}/exec"

        async def tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            result: dict[str, Any] = await server.call("POST", f"{tools_path}/{name}", json=arguments)
            return result

        async def exec_true() -> None:
            await server.exec_true(workspace_id)

        async def exec_bash() -> None:
            body = {"command": "/bin/bash", "args": ["-c", "true"], "mode": "argv"}
            if (await server.call("POST", exec_path, json=body))["exit_code"] != 0:
                raise ServerError("exec /bin/bash -c true did not exit 0")

        async def bash() -> None:
            if (await tool("bash", {"command": "true"}))["exit_code"] != 0:
                raise ServerError("bash tool `true` did not exit 0")

        async def read() -> None:
            if not (await tool("read", {"path": "notes/fox.txt"}))["content"].startswith("line 0:"):
                raise ServerError("read tool returned something else than the file")

        async def grep() -> None:
            if len((await tool("grep", {"pattern": "jumps", "path": "notes"}))["matches"]) != 29:
                raise ServerError("grep tool did not find the 29 matching lines")

        params = StdioServerParameters(
            command=CORRAL,
            args=["mcp", "--session", session_id],
            env={**os.environ, "CORRAL_URL": server.url, "CORRAL_API_TOKEN": server.token},
        )
        with (bench.workdir / "mcp.log").open("w") as errlog:
            async with (
                AsyncCorral(server.url, server.token) as sdk,
                stdio_client(params, errlog=errlog) as (mcp_read_stream, mcp_write_stream),
                ClientSession(mcp_read_stream, mcp_write_stream) as mcp,
            ):
                await mcp.initialize()
                sdk_session = await sdk.sessions.get(session_id)

                async def sdk_bash() -> None:
                    if (await sdk_session.tools.call("bash", {"command": "true"}))["exit_code"] != 0:
                        raise ServerError("SDK bash tool `true` did not exit 0")

                async def mcp_bash() -> None:
                    result = await mcp.call_tool("bash", {"command": "true"})
                    if _mcp_text(result) != "[exit code 0]":  # what corral mcp says for a silent success
                        raise ServerError(f"MCP bash `true` answered {result.content}")

                async def mcp_ping() -> None:
                    await mcp.send_ping()

                async def mcp_read() -> None:
                    if not _mcp_text(await mcp.call_tool("read", {"path": "notes/fox.txt"})).startswith("line 0:"):
                        raise ServerError("MCP read returned something else than the file")

                ways: list[tuple[Samples, Callable[[], Awaitable[None]]]] = [
                    (samples.exec_true, exec_true),
                    (samples.bash, bash),
                    (samples.mcp_bash, mcp_bash),
                    (samples.exec_bash, exec_bash),
                    (samples.read, read),
                    (samples.mcp_read, mcp_read),
                    (samples.grep, grep),
                    (samples.sdk_bash, sdk_bash),
                    (samples.mcp_ping, mcp_ping),
                ]
                for round_ in range(bench.config.tool_calls + 1):  # round 0 is the warm-up
                    for bucket, call in ways:
                        if round_ == 0:
                            await call()
                            continue
                        await asyncio.sleep(SETTLE_S)
                        with bucket.time():
                            await call()
    finally:
        await bench.stop_server(server)
    _rows(bench, samples)


def _rows(bench: Bench, samples: _ToolSamples) -> None:
    exec_true, bash = samples.exec_true.measure(), samples.bash.measure()
    ratio = bash.p50 / exec_true.p50
    mcp_bash, mcp_read = samples.mcp_bash.measure(), samples.mcp_read.measure()
    read = samples.read.measure()
    added = mcp_bash.p50 - bash.p50
    added_read = mcp_read.p50 - read.p50
    plain_label = "Corral API: exec `true` (lean client)"
    http_bash = "HTTP tool call bash `true` (lean client)"
    bench.rows += [
        Row(
            "tool call: bash `true`, gVisor (HTTP)",
            bash,
            exec_true,
            plain_label,
            Target(f"<= {BASH_RATIO_TARGET:g}x exec (p50)", ratio <= BASH_RATIO_TARGET, f"{ratio:.2f}x"),
        ),
        Row("tool call: part: exec `/bin/bash -c true`", samples.exec_bash.measure(), exec_true, plain_label),
        Row("tool call: read 200 lines, gVisor (HTTP)", read, exec_true, plain_label),
        Row("tool call: grep, 29 matches, gVisor (HTTP)", samples.grep.measure(), exec_true, plain_label),
        Row(
            "MCP (corral mcp, stdio): bash `true`",
            mcp_bash,
            bash,
            http_bash,
            Target(f"<= HTTP + {MCP_ADDED_TARGET_MS:g} ms (p50)", added <= MCP_ADDED_TARGET_MS, f"{added:+.2f} ms"),
        ),
        Row(
            "MCP (corral mcp, stdio): read 200 lines",
            mcp_read,
            read,
            "HTTP tool call read (lean client)",
            Target(
                f"<= HTTP + {MCP_ADDED_TARGET_MS:g} ms (p50)",
                added_read <= MCP_ADDED_TARGET_MS,
                f"{added_read:+.2f} ms",
            ),
        ),
        Row("MCP: part: ping, the stdio round trip alone", samples.mcp_ping.measure(), bash, http_bash),
        Row("MCP: part: SDK (AsyncCorral, httpx) bash `true`", samples.sdk_bash.measure(), bash, http_bash),
    ]
    bench.notes.append(
        f"Tools: one gVisor session with bash, read and grep; {bench.config.tool_calls} rounds, each running every "
        "way once in turn: POST exec `true` (argv), the bash tool with `true`, the same through `corral mcp "
        "--session` (the mcp package's stdio client, as a host runs it), POST exec `/bin/bash -c true`, read of a "
        "200-line file (HTTP and MCP), grep of it, the bash tool through the SDK (httpx), and an MCP ping (the "
        "stdio round trip with both sides' JSON-RPC, no HTTP), each after a 10 ms untimed pause (so no call pays for "
        "the audit write of the one before). HTTP calls, corral mcp's included, go through the lean keep-alive client "
        "(corral.client._lean)."
    )
