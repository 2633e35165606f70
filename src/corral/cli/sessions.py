"""``corral sessions``: start agent sessions, call their tools as the agent would, read the audit, end them."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli._common import JsonFlag, connect, describe, parse_json_object, print_json, show, stderr_console
from corral.cli._lifetimes import warn_if_expiring

if TYPE_CHECKING:
    from corral.client import SessionInfo

app = typer.Typer(help="Start agent sessions, call their tools, end them.", no_args_is_help=True)

MAIN_ARGUMENT = {"bash": "command", "read": "path", "write": "path", "edit": "path", "grep": "pattern",
                 "glob": "pattern", "git": "args"}  # fmt: skip
"""The argument a tool's bare positional value fills (``sessions tool ID bash 'ls'``)."""


def parse_tool_arguments(tool: str, value: str | None, pairs: Sequence[str]) -> dict[str, Any]:
    """A tool's JSON arguments from the positional value and ``--arg`` pairs.

    ``value`` is a JSON object (``'{"path": "a.txt"}'``), ``@file``, ``-`` (stdin), or any other text, which fills
    the tool's main argument (bash's ``command``, read's ``path``...; git's ``args`` are split like a shell would).
    Each pair is ``key=text`` (always a string) or ``key:=json`` (a number, boolean, list or object), so
    ``-a timeout_s:=30`` is the number 30. Pairs override the positional value.
    """
    if tool not in MAIN_ARGUMENT:
        # Said here, before arguments are read: "'bsh' takes a JSON object" sent people looking at the wrong word.
        raise typer.BadParameter(f"unknown tool {tool!r}; the tools are {', '.join(MAIN_ARGUMENT)}")
    arguments: dict[str, Any] = {}
    if value is not None:
        if value == "-" or value.startswith(("{", "@")):
            arguments.update(parse_json_object(value, "arguments"))
        else:
            main = MAIN_ARGUMENT[tool]
            arguments[main] = shlex.split(value) if main == "args" else value
    for pair in pairs:
        key, typed, raw = _split_pair(pair)
        if not typed:
            arguments[key] = raw
            continue
        try:
            arguments[key] = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--arg {key}:=...: not valid JSON ({exc.msg})") from exc
    return arguments


def _split_pair(pair: str) -> tuple[str, bool, str]:
    """``key=value`` -> (key, False, value); ``key:=json`` -> (key, True, json)."""
    key, sep, raw = pair.partition("=")
    if not sep or not key or key == ":":
        raise typer.BadParameter(f"--arg {pair!r}: expected key=value or key:=json")
    if key.endswith(":"):
        return key[:-1], True, raw
    return key, False, raw


def _report_session(info: SessionInfo) -> None:
    err = stderr_console()
    where = f" (workspace {info.workspace_id})" if info.workspace_id else " (no workspace)"
    err.print(f"session {info.id} {info.status}{where}", markup=False)
    for warning in info.warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    if info.degraded:
        err.print(f"[red]degraded:[/] {info.degraded_reason}")


@app.command("start")
def sessions_start(
    ctx: typer.Context,
    *,
    agent_type_id: str,
    repo_url: Annotated[
        str | None, typer.Option("--repo-url", help="the task's repository (credentials allowed)")
    ] = None,
    branch: Annotated[str | None, typer.Option(help="the task's branch")] = None,
    pr: Annotated[int | None, typer.Option("--pr", help="the pull request number")] = None,
    base_branch: Annotated[str | None, typer.Option(help="the pull request's base branch")] = None,
    context: Annotated[str | None, typer.Option(help="the whole task context as JSON, @FILE or -")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="poll until the workspace is ready; show warnings")] = False,
    timeout: Annotated[float, typer.Option(help="seconds --wait may take")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Start a session and print its id; with --wait, return once it is active.

    S=$(corral sessions start $TYPE --repo-url https://github.com/org/repo.git --branch main --wait)
    """
    task = parse_json_object(context, "--context") if context is not None else {}
    fields = {"repository_url": repo_url, "branch": branch, "pull_request_number": pr, "base_branch": base_branch}
    task.update({k: v for k, v in fields.items() if v is not None})
    with connect(ctx) as corral:
        session = corral.sessions.start(agent_type_id, task_context=task or None)
        if wait and session.status == "provisioning":
            err = stderr_console()
            with err.status(f"provisioning session {session.id}", spinner="dots"):
                session.wait(timeout_s=timeout)
    if as_json:
        print_json(dict(session.info.raw))
        return
    _report_session(session.info)
    typer.echo(session.id)


@app.command("list")
def sessions_list(
    ctx: typer.Context,
    *,
    status: Annotated[
        str | None, typer.Option(help="only sessions in this status: provisioning, active or ended")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the ids")] = False,
    as_json: JsonFlag = False,
) -> None:
    """List sessions, newest first, with their agent type, status and workspace."""
    from rich.table import Table

    with connect(ctx) as corral:
        infos = [s.info for s in corral.sessions.list(status=status)]
        names = {t.id: t.name for t in corral.agent_types.list()} if infos and not (quiet or as_json) else {}
    if as_json:
        print_json([dict(i.raw) for i in infos])
        return
    if quiet:
        for info in infos:
            typer.echo(info.id)
        return
    table = Table("ID", "AGENT TYPE", "STATUS", "WORKSPACE", "CREATED", box=None, pad_edge=False)
    for i in infos:
        created = i.created_at.strftime("%Y-%m-%d %H:%M:%S") if i.created_at else "-"
        status_text = f"{i.status} (degraded)" if i.degraded else i.status
        table.add_row(i.id, names.get(i.agent_type_id, i.agent_type_id), status_text, i.workspace_id or "-", created)
    show(table if infos else "no sessions")


@app.command("show")
def sessions_show(ctx: typer.Context, session_id: str, as_json: JsonFlag = False) -> None:
    """Show a session: status, workspace, warnings, degraded reason."""
    with connect(ctx) as corral:
        info = corral.sessions.get(session_id).info
    if as_json:
        print_json(dict(info.raw))
        return
    show(describe(dict(info.raw)))
    warn_if_expiring("session", info.id, info.expires_at, ends="ends")


@app.command("end")
def sessions_end(ctx: typer.Context, session_id: str, as_json: JsonFlag = False) -> None:
    """End a session and destroy its workspace."""
    with connect(ctx) as corral:
        info = corral.sessions.get(session_id).end()
    print_json(dict(info.raw)) if as_json else typer.echo(f"{info.id} {info.status}")


@app.command("audit")
def sessions_audit(ctx: typer.Context, session_id: str, as_json: JsonFlag = False) -> None:
    """Show every tool call of a session, refused ones included."""
    from rich.table import Table

    with connect(ctx) as corral:
        entries = corral.sessions.get(session_id).audit()
    if as_json:
        print_json([{"at": e.at, "tool": e.tool, "arguments_summary": e.arguments_summary, "status": e.status,
                     "duration_ms": e.duration_ms} for e in entries])  # fmt: skip
        return
    table = Table("AT", "TOOL", "STATUS", "MS", "ARGUMENTS", box=None, pad_edge=False)
    for e in entries:
        at = e.at.strftime("%H:%M:%S") if e.at else "-"
        table.add_row(at, e.tool, e.status, f"{e.duration_ms:.0f}", e.arguments_summary)
    show(table if entries else "no tool calls yet")


@app.command("tool")
def sessions_tool(
    ctx: typer.Context,
    *,
    session_id: str,
    tool: Annotated[str, typer.Argument(help="bash, read, write, edit, grep, glob or git")],
    value: Annotated[str | None, typer.Argument(help="the main argument, a JSON object, @FILE or -")] = None,
    arg: Annotated[list[str] | None, typer.Option("--arg", "-a", help="key=text or key:=json (repeatable)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Call one of the session's tools, as the agent would. The agent type's tool policy applies.

    Give the tool's JSON arguments (see the HTTP API) as any mix of:

    a bare value, for the tool's main argument:
      bash 'ls -la' | read README.md | grep TODO | glob '**/*.py' | git 'log --oneline -3'
    --arg key=text (always a string) or --arg key:=json (numbers, booleans, lists):
      corral sessions tool $S bash -a command='sleep 5; echo done' -a timeout_s:=30
    a JSON object, @file or - (stdin):
      corral sessions tool $S edit '{"path": "a.py", "old_string": "x = 1", "new_string": "x = 2"}'

    bash and git print their output and exit with the command's exit code; read prints the text; --json prints the
    tool's JSON result.
    """
    arguments = parse_tool_arguments(tool, value, arg or [])
    with connect(ctx) as corral:
        result = corral.sessions.get(session_id).tools.call(tool, arguments)
    if as_json:
        print_json(result)
        if tool in ("bash", "git"):
            raise typer.Exit(int(result.get("exit_code") or 0))
        return
    _print_tool_result(tool, result)


def _print_tool_result(tool: str, result: Mapping[str, Any]) -> None:
    if tool in ("bash", "git"):
        sys.stdout.write(str(result.get("stdout", "")))
        sys.stdout.flush()
        sys.stderr.write(str(result.get("stderr", "")))
        sys.stderr.flush()
        raise typer.Exit(int(result.get("exit_code") or 0))
    if tool == "read":
        content = str(result.get("content", ""))
        sys.stdout.write(content + ("\n" if sys.stdout.isatty() and not content.endswith("\n") else ""))
        if result.get("truncated"):
            sys.stderr.write(f"corral: more lines follow ({result.get('total_lines')} in all)\n")
    elif tool == "glob":
        for path in result.get("paths", []):
            typer.echo(path)
    elif tool == "grep":
        for m in result.get("matches", []):
            typer.echo(f"{m.get('path')}:{m.get('line_number')}:{m.get('line')}")
    elif tool == "write":
        typer.echo(f"wrote {result.get('bytes_written')} bytes")
    elif tool == "edit":
        typer.echo(f"{result.get('replacements')} replacement(s)")
    else:
        print_json(result)
