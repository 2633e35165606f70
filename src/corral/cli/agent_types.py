"""``corral agent-types``: declare agent types and set their workspace configuration, as JSON or with flags."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import typer

from corral.cli._common import JsonFlag, connect, describe, parse_json_object, print_json, show, stderr_console

app = typer.Typer(help="Declare agent types and their workspace configuration.", no_args_is_help=True)


def _apply_config_flags(
    base: dict[str, Any],
    *,
    enabled: bool | None,
    tools: str | None,
    repo: str | None,
    branch: str | None,
    setup: Sequence[str],
    provider: str | None,
) -> dict[str, Any]:
    config = dict(base)
    flags_given = any(v is not None for v in (tools, repo, branch, provider)) or bool(setup)
    if tools is not None:
        config["tools"] = [t.strip() for t in tools.split(",") if t.strip()]
    if repo is not None or branch is not None:
        source = dict(config.get("repo_source") or {})
        if repo == "task":
            source.update(type="task_context", url=None)
        elif repo == "none":
            source.update(type="none", url=None)
        elif repo is not None:
            source.update(type="fixed", url=repo)
        if branch is not None:
            source["branch"] = branch
        config["repo_source"] = source
    if setup:
        config["setup_commands"] = list(setup)
    if provider is not None:
        config["provider"] = provider
    if enabled is not None:
        config["enabled"] = enabled
    elif flags_given and "enabled" not in base:
        config["enabled"] = True
    return config


EnableFlag = Annotated[bool | None, typer.Option("--enable/--disable", help="give the type's sessions a workspace")]
ToolsOption = Annotated[
    str | None, typer.Option("--tools", help="allowed tools, comma-separated: bash,read,write,edit,grep,glob,git")
]
RepoOption = Annotated[
    str | None, typer.Option("--repo", help="repository: an http(s) URL, 'task' (from the task) or 'none'")
]
BranchOption = Annotated[str | None, typer.Option("--branch", help="branch to check out")]
SetupOption = Annotated[list[str] | None, typer.Option("--setup", help="a setup command (repeatable, run in order)")]
ProviderOption = Annotated[str | None, typer.Option("--provider", help="auto, gvisor, docker...")]


def _show_agent_type(type_id: str, name: str, config: Mapping[str, Any]) -> None:
    show(describe({"id": type_id, "name": name, **config}))


@app.command("create")
def agent_types_create(
    ctx: typer.Context,
    *,
    name: str,
    workspace: Annotated[str | None, typer.Option(help="the workspace config as JSON, @FILE or - (stdin)")] = None,
    enabled: EnableFlag = None,
    tools: ToolsOption = None,
    repo: RepoOption = None,
    branch: BranchOption = None,
    setup: SetupOption = None,
    provider: ProviderOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Declare an agent type and print its id. Any workspace flag enables its workspace.

    corral agent-types create reviewer --tools read,grep,glob --repo task
    """
    base = parse_json_object(workspace, "--workspace") if workspace is not None else {}
    config = _apply_config_flags(
        base, enabled=enabled, tools=tools, repo=repo, branch=branch, setup=setup or [], provider=provider
    )
    with connect(ctx) as corral:
        agent_type = corral.agent_types.create(name, workspace=config or None)
    if as_json:
        print_json({"id": agent_type.id, "name": agent_type.name, "workspace": dict(agent_type.workspace)})
        return
    tools_text = ", ".join(agent_type.tools) or "none (no workspace)"
    stderr_console().print(f"agent type {agent_type.name!r}: tools {tools_text}", markup=False)
    typer.echo(agent_type.id)


@app.command("list")
def agent_types_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the agent types."""
    from rich.table import Table

    with connect(ctx) as corral:
        types = corral.agent_types.list()
    if as_json:
        print_json([{"id": t.id, "name": t.name, "workspace": dict(t.workspace)} for t in types])
        return
    table = Table("ID", "NAME", "WORKSPACE", "TOOLS", box=None, pad_edge=False)
    for t in types:
        table.add_row(t.id, t.name, "enabled" if t.workspace.get("enabled") else "disabled", ",".join(t.tools))
    show(table if types else "no agent types")


@app.command("show")
def agent_types_show(ctx: typer.Context, agent_type_id: str, as_json: JsonFlag = False) -> None:
    """Show an agent type and its whole workspace configuration."""
    with connect(ctx) as corral:
        agent_type = corral.agent_types.get(agent_type_id)
    if as_json:
        print_json({"id": agent_type.id, "name": agent_type.name, "workspace": dict(agent_type.workspace)})
        return
    _show_agent_type(agent_type.id, agent_type.name, agent_type.workspace)


@app.command("set-config")
def agent_types_set_config(
    ctx: typer.Context,
    *,
    agent_type_id: str,
    config: Annotated[str | None, typer.Argument(help="the whole config as JSON, @FILE or - (stdin)")] = None,
    enabled: EnableFlag = None,
    tools: ToolsOption = None,
    repo: RepoOption = None,
    branch: BranchOption = None,
    setup: SetupOption = None,
    provider: ProviderOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Replace an agent type's workspace config, or change fields of the current one with flags.

    corral agent-types set-config $TYPE '{"enabled": true, "tools": ["read", "grep"]}'
    corral agent-types set-config $TYPE --tools bash,read,write --setup 'pip install -e .'

    Sessions started afterwards use the new config; running ones keep theirs.
    """
    with connect(ctx) as corral:
        base = parse_json_object(config, "config") if config is not None else corral.agent_types.config(agent_type_id)
        new = _apply_config_flags(
            base, enabled=enabled, tools=tools, repo=repo, branch=branch, setup=setup or [], provider=provider
        )
        stored = corral.agent_types.set_config(agent_type_id, new)
    if as_json:
        print_json(stored)
        return
    show(describe(stored))


@app.command("rm")
def agent_types_rm(
    ctx: typer.Context, agent_types: Annotated[list[str], typer.Argument(help="ids or names, one or more")]
) -> None:
    """Delete agent types (by id or name), with their ended sessions and audit logs.

    Refused while sessions of the type are provisioning or active: the error names them (end them with
    corral sessions end ID). Each one's error is reported and the rest still go.
    """
    from corral.errors import AgentTypeNotFoundError, CorralError

    failed = False
    with connect(ctx) as corral:
        for given in agent_types:
            try:
                try:
                    type_id = corral.agent_types.get(given).id
                except AgentTypeNotFoundError:
                    named = [t.id for t in corral.agent_types.list() if t.name == given]
                    if not named:
                        raise AgentTypeNotFoundError(f"no agent type has the id or name {given!r}") from None
                    type_id = named[0]
                corral.agent_types.delete(type_id)
            except CorralError as exc:
                typer.echo(" ".join(f"error: {exc.code}: {exc.message}".split()), err=True)
                failed = True
            else:
                typer.echo(type_id)
    if failed:
        raise typer.Exit(1)
