"""``corral mcp``: serve a session's allowed tools over MCP on stdin/stdout, through Corral's HTTP API."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from corral.cli._common import fail, remote


def mcp(
    ctx: typer.Context,
    *,
    session: Annotated[str | None, typer.Option("--session", help="serve this session's tools")] = None,
    agent_type: Annotated[
        str | None,
        typer.Option("--agent-type", help="start a session of this type, serve its tools, end it on exit"),
    ] = None,
    repo_url: Annotated[str | None, typer.Option("--repo-url", help="with --agent-type: the task's repository")] = None,
    branch: Annotated[str | None, typer.Option(help="with --agent-type: the task's branch")] = None,
    timeout: Annotated[
        float, typer.Option(help="with --agent-type: seconds the session may take to provision")
    ] = 300.0,
) -> None:
    """Serve a session's allowed tools over MCP on stdin/stdout.

    Only the tools the agent type allows are listed; every call goes through Corral's HTTP API, so the server
    enforces the policy and audits it. In an MCP client's configuration:

    {"command": "corral", "args": ["mcp", "--agent-type", "TYPE_ID"],
     "env": {"CORRAL_URL": "http://127.0.0.1:8000", "CORRAL_API_TOKEN": "..."}}
    """
    if (session is None) == (agent_type is None):
        raise typer.BadParameter("give exactly one of --session and --agent-type")
    import anyio

    from corral.errors import CorralError
    from corral.mcp_server import serve_stdio

    server = remote(ctx)
    task = {k: v for k, v in {"repository_url": repo_url, "branch": branch}.items() if v is not None}
    # stdout carries the protocol: everything else goes to stderr, where MCP clients keep the server's log.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="corral mcp: %(message)s")
    logging.getLogger("corral.mcp_server").setLevel(logging.INFO)
    try:
        anyio.run(
            lambda: serve_stdio(
                session_id=session,
                agent_type_id=agent_type,
                task_context=task or None,
                base_url=server.url,
                token=server.token,
                wait_timeout_s=timeout,
            )
        )
    except CorralError as exc:
        fail(exc.code, exc.message)
    except TimeoutError as exc:
        fail("timeout", str(exc))
