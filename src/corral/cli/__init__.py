"""The ``corral`` command: the server (``serve``), images, and a client for everything the HTTP API offers.

Client commands talk to ``CORRAL_URL`` (default ``http://127.0.0.1:8000``) with ``CORRAL_API_TOKEN`` through the
synchronous SDK (:class:`corral.client.Corral`). An error the server reports is printed as one line,
``error: <code>: <message>``, with exit code 1; nothing a user sees is ever a traceback.

This module holds the root app, its options (``--url``, ``--token``) and the entry point; each command group lives in
its own module (``serve``, ``images``, ``providers``, ``mcp``, ``workspaces``, ``snapshots``, ``agent_types``,
``sessions``), and what they share in ``_common``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli import agent_types, env, images, mcp, providers, serve, sessions, snapshots, workspaces
from corral.cli._common import Remote

__all__ = ["app", "main"]

app = typer.Typer(help="Corral: isolated workspaces for AI agents.", no_args_is_help=True, add_completion=False)


@app.callback()
def options(
    ctx: typer.Context,
    *,
    url: Annotated[
        str | None,
        typer.Option("--url", envvar="CORRAL_URL", help="the Corral server  \\[default: http://127.0.0.1:8000]"),
    ] = None,
    token: Annotated[str | None, typer.Option("--token", envvar="CORRAL_API_TOKEN", help="the API token")] = None,
) -> None:
    """Corral: isolated workspaces for AI agents."""
    ctx.obj = Remote(url, token)


# Commands are listed in `corral --help` in the order they are added: the root commands, then the groups.
app.command()(serve.serve)
app.command("firecracker-manager")(serve.firecracker_manager)
app.command()(providers.providers)
app.command()(providers.pool)
app.command()(mcp.mcp)
app.command()(env.env)
app.add_typer(images.app, name="image")
app.add_typer(workspaces.app, name="workspaces")
app.add_typer(snapshots.app, name="snapshots")
app.add_typer(agent_types.app, name="agent-types")
app.add_typer(sessions.app, name="sessions")


def main() -> None:
    """Entry point of the ``corral`` script."""
    app()
