"""``corral workspaces``: create, list, show, exec in, pause, stop, resume, snapshot, fork and remove workspaces."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli._common import JsonFlag, connect, describe, fail, print_json, show, stderr_console
from corral.cli._lifetimes import warn_if_expiring
from corral.cli.snapshots import report_snapshot
from corral.errors import CorralError

if TYPE_CHECKING:
    from corral.client import Workspace, WorkspaceInfo

app = typer.Typer(
    help="Create, run commands in, pause, stop, resume, snapshot, fork and remove workspaces.", no_args_is_help=True
)


def _pairs(values: Sequence[str], option: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{option} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _limits(info: WorkspaceInfo) -> str:
    return " ".join(f"{k}={v}" for k, v in info.resource_limits.items())


def _workspace_table(workspaces: Sequence[WorkspaceInfo]) -> Any:
    from rich.table import Table

    warm = any(w.warm for w in workspaces)  # the WARM column only when `list --all` found warm ones
    columns = ["ID", "STATUS", "PROVIDER", "NETWORK", "LIMITS", "CREATED", *(["WARM"] if warm else [])]
    table = Table(*columns, box=None, pad_edge=False)
    for w in workspaces:
        created = w.created_at.strftime("%Y-%m-%d %H:%M:%S") if w.created_at else "-"
        extra = [("warm" if w.warm else "-")] if warm else []
        table.add_row(w.id, w.status, w.provider or "-", w.network, _limits(w), created, *extra)
    return table


def _report_workspace(info: WorkspaceInfo) -> None:
    """What a person wants to know after a create: where it runs, and anything that went wrong on the way."""
    err = stderr_console()
    warm = ", from the warm pool" if info.from_warm_pool else ""
    err.print(f"workspace {info.id} {info.status} on {info.provider}{warm}", markup=False)
    for attempt in info.provider_attempts:
        err.print(f"[yellow]fallback:[/] {attempt.provider} failed: {attempt.error}")
    for warning in info.warnings:
        err.print(f"[yellow]warning:[/] {warning}")


@app.command("create")
def workspaces_create(
    ctx: typer.Context,
    *,
    provider: Annotated[
        str | None, typer.Option(help="auto (the default), gvisor, docker, firecracker, e2b...", show_default=False)
    ] = None,
    cpu: Annotated[str | None, typer.Option(help="CPUs, e.g. 2")] = None,
    memory: Annotated[str | None, typer.Option(help="memory, e.g. 4G")] = None,
    disk: Annotated[str | None, typer.Option(help="disk, e.g. 10G")] = None,
    image: Annotated[str | None, typer.Option(help="base image instead of the server's")] = None,
    network: Annotated[str | None, typer.Option(help="isolated (default: no network) or default")] = None,
    container_type: Annotated[str | None, typer.Option(help="agent_workspace (default) or mcp_server")] = None,
    meta: Annotated[list[str] | None, typer.Option("--meta", help="metadata KEY=VALUE (repeatable)")] = None,
    from_snapshot: Annotated[
        str | None,
        typer.Option("--from-snapshot", help="restore this snapshot (it fixes provider, limits, image and network)"),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a workspace and print its id (details go to stderr).

    WS=$(corral workspaces create --provider gvisor)

    WS=$(corral workspaces create --from-snapshot $SNAP)
    """
    limits = {k: v for k, v in {"cpu": cpu, "memory": memory, "disk": disk}.items() if v is not None}
    with connect(ctx) as corral:
        ws = corral.workspaces.create(
            provider=provider,
            container_type=container_type,
            resource_limits=limits or None,
            base_image=image,
            network=network,
            metadata=_pairs(meta or [], "--meta") or None,
            from_snapshot=from_snapshot,
        )
    if as_json:
        print_json(dict(ws.info.raw))
        return
    _report_workspace(ws.info)
    typer.echo(ws.id)


@app.command("list")
def workspaces_list(
    ctx: typer.Context,
    *,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the ids")] = False,
    include_warm: Annotated[
        bool, typer.Option("--all", "-a", help="also warm-pool workspaces waiting to be claimed (WARM column)")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """List the workspaces that are not destroyed (with --all, the warm pools' too)."""
    with connect(ctx) as corral:
        infos = [w.info for w in corral.workspaces.list(include_warm=include_warm)]
    if as_json:
        print_json([dict(i.raw) for i in infos])
    elif quiet:
        for info in infos:
            typer.echo(info.id)
    else:
        show(_workspace_table(infos) if infos else "no workspaces")
        for info in infos:
            warn_if_expiring("workspace", info.id, info.expires_at, ends=_ends(info))


@app.command("show")
def workspaces_show(ctx: typer.Context, workspace_id: str, as_json: JsonFlag = False) -> None:
    """Show one workspace."""
    with connect(ctx) as corral:
        info = corral.workspaces.get(workspace_id).info
    if as_json:
        print_json(dict(info.raw))
        return
    show(describe(dict(info.raw)))
    warn_if_expiring("workspace", info.id, info.expires_at, ends=_ends(info))


def _ends(info: WorkspaceInfo) -> str:
    """What the idle timeout does to it: a session's workspace goes with its session; others stop, disk kept."""
    return "ends with its session" if "session_id" in info.metadata else "stops"


EXEC_OPTIONS = frozenset({"--argv", "--cwd", "--env", "-e", "--timeout", "--json", "--no-stdin", "-n"})
"""The options of ``exec``: one of these right after the workspace id was meant for exec, not for the command."""


@app.command("exec", context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]})
def workspaces_exec(
    ctx: typer.Context,
    *,
    workspace_id: Annotated[str, typer.Argument(help="the workspace")],
    command: Annotated[list[str], typer.Argument(help="a command line, or a program and its arguments")],
    argv: Annotated[bool, typer.Option("--argv", help="run the program directly, without a shell")] = False,
    cwd: Annotated[str | None, typer.Option(help="working directory (default /workspace)")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="environment KEY=VALUE (repeatable)")] = None,
    timeout: Annotated[
        float | None, typer.Option(help="kill the command after this many seconds (default 600)")
    ] = None,
    no_stdin: Annotated[
        bool, typer.Option("--no-stdin", "-n", help="do not forward stdin (it is forwarded when not a terminal)")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run a command in a workspace; print its output as it comes and exit with its exit code.

    Options go before the workspace id, as with docker exec. One argument is a shell command line, run by
    /bin/sh -c; more are a program and its arguments (still through the shell, quoted, unless --argv):

    corral workspaces exec $WS 'cd src && ls | wc -l'
    corral workspaces exec --argv $WS -- ls -la /workspace

    Piped or redirected stdin is the command's input (echo x | corral workspaces exec $WS cat); a terminal's is
    not, as with docker exec without -i. With --json the result is printed as JSON once the command ends; the exit
    code is still the command's.
    """
    if command[:1] == ["--"]:  # after the workspace id every word is the command's, so `--` is left to drop here
        command = command[1:]
    elif command and command[0].split("=", 1)[0] in EXEC_OPTIONS:
        # Run as the command, `--cwd` reached /bin/sh as an option ("Illegal option --"): say what happened.
        option = command[0].split("=", 1)[0]
        raise typer.BadParameter(
            f"{option} comes after the workspace id, so it would be run as the command; options go before it: "
            f"corral workspaces exec {option} ... {workspace_id} COMMAND"
        )
    if not command:
        raise typer.BadParameter("missing the command to run")
    # Empty input and none (/dev/null) read alike: end of file at once, without writing an input file.
    stdin = None if no_stdin or sys.stdin.isatty() else sys.stdin.buffer.read().decode(errors="replace") or None
    options: dict[str, Any] = {
        "args": command[1:],
        "mode": "argv" if argv else "shell",
        "cwd": cwd,
        "env": _pairs(env or [], "--env") or None,
        "timeout_s": timeout,
        "stdin": stdin,
    }
    with connect(ctx) as corral:
        workspace = corral.workspaces.get(workspace_id)
        if not as_json:
            raise typer.Exit(_stream_exec(workspace, command[0], options))
        result = workspace.exec(command[0], **options)
    print_json({"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                "duration_ms": result.duration_ms, "timed_out": result.timed_out,
                "truncated": result.truncated})  # fmt: skip
    raise typer.Exit(result.exit_code)


def _stream_exec(workspace: Workspace, command: str, options: dict[str, Any]) -> int:
    """Copy a streamed command's output to stdout and stderr as it comes; its exit code (130 after Ctrl-C, which
    ends the request and so kills the command)."""
    from corral.client import ExecChunk

    outputs = {"stdout": sys.stdout, "stderr": sys.stderr}
    items = workspace.exec_stream(command, **options)
    try:
        for item in items:
            if isinstance(item, ExecChunk):
                outputs.get(item.stream, sys.stderr).write(item.data)
                outputs.get(item.stream, sys.stderr).flush()
                continue
            if item.timed_out:
                sys.stderr.write(f"corral: the command timed out and was killed (exit code {item.exit_code})\n")
            return item.exit_code
    except KeyboardInterrupt:
        return 130
    finally:
        items.close()  # type: ignore[attr-defined]  # a generator: closing it closes the request
    return 1  # pragma: no cover  # exec_stream raises when the stream ends without an exit


@app.command("shell")
def workspaces_shell(
    ctx: typer.Context,
    workspace_id: Annotated[str, typer.Argument(help="the workspace")],
    *,
    command: Annotated[
        str | None, typer.Option("--command", "-c", help="a command line to run instead of a login shell")
    ] = None,
    cwd: Annotated[str | None, typer.Option(help="working directory (default /workspace)")] = None,
) -> None:
    """Open an interactive terminal in a workspace, like docker exec -it; exit with the remote exit code.

    corral workspaces shell $WS

    corral workspaces shell $WS --command 'top'

    Full-screen programs work; the window size follows yours. The terminal's command ends when you leave.
    """
    from corral.cli._common import remote
    from corral.cli._shell import run_shell
    from corral.client._api import resolve_base_url, resolve_token

    server = remote(ctx)
    outcome = run_shell(
        resolve_base_url(server.url), resolve_token(server.token), workspace_id, command=command, cwd=cwd
    )
    if outcome.error is not None:
        fail(*outcome.error)
    raise typer.Exit(outcome.exit_code)


@app.command("stop")
def workspaces_stop(ctx: typer.Context, workspace_id: str, as_json: JsonFlag = False) -> None:
    """Stop a workspace; its disk is kept for resume, its processes end."""
    with connect(ctx) as corral:
        info = corral.workspaces.get(workspace_id).stop()
    print_json(dict(info.raw)) if as_json else typer.echo(f"{info.id} {info.status}")


@app.command("pause")
def workspaces_pause(ctx: typer.Context, workspace_id: str, as_json: JsonFlag = False) -> None:
    """Pause a workspace, freeing its CPU and memory, and print what was kept.

    memory: processes and memory come back on resume (status paused).

    filesystem: the provider cannot keep memory; a stop that keeps the whole disk (status stopped).
    """
    with connect(ctx) as corral:
        workspace = corral.workspaces.get(workspace_id)
        kept = workspace.pause()
    info = workspace.info
    if as_json:
        print_json(dict(info.raw))
        return
    typer.echo(f"{info.id} {info.status} ({kept} kept)")
    if kept != "memory":
        stderr_console().print(
            f"[yellow]note:[/] {info.provider} cannot keep memory: the processes ended; the disk is kept",
            highlight=False,
            soft_wrap=True,
        )


@app.command("resume")
def workspaces_resume(ctx: typer.Context, workspace_id: str, as_json: JsonFlag = False) -> None:
    """Resume a stopped or paused workspace; a paused one gets its processes and memory back."""
    with connect(ctx) as corral:
        info = corral.workspaces.get(workspace_id).resume()
    print_json(dict(info.raw)) if as_json else typer.echo(f"{info.id} {info.status}")


@app.command("snapshot")
def workspaces_snapshot(
    ctx: typer.Context,
    workspace_id: str,
    *,
    name: Annotated[str | None, typer.Option(help="a name to find it by")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Snapshot a running workspace (files, and memory where the provider can) and print the snapshot's id.

    SNAP=$(corral workspaces snapshot $WS --name after-setup)
    """
    with connect(ctx) as corral:
        snapshot = corral.workspaces.get(workspace_id).snapshot(name)
    if as_json:
        print_json(dict(snapshot.raw))
        return
    report_snapshot(snapshot)
    typer.echo(snapshot.id)


@app.command("fork")
def workspaces_fork(
    ctx: typer.Context,
    workspace_id: str,
    *,
    count: Annotated[int, typer.Option(min=1, max=16, help="how many forks (1-16)")] = 1,
    as_json: JsonFlag = False,
) -> None:
    """Copy a running workspace, files and running processes, and print each new id; the source keeps running."""
    with connect(ctx) as corral:
        forks = corral.workspaces.get(workspace_id).fork(count)
    if as_json:
        print_json([dict(f.info.raw) for f in forks])
        return
    for fork in forks:
        _report_workspace(fork.info)
        typer.echo(fork.id)


@app.command("rm")
def workspaces_rm(ctx: typer.Context, workspace_ids: Annotated[list[str], typer.Argument(help="one or more")]) -> None:
    """Destroy workspaces (container and volume); each one's error is reported and the rest still go."""
    from corral.errors import CorralError

    failed = False
    with connect(ctx) as corral:
        for workspace_id in workspace_ids:
            try:
                corral.workspaces.get(workspace_id).destroy()
            except CorralError as exc:
                typer.echo(" ".join(f"error: {exc.code}: {exc.message}".split()), err=True)
                failed = True
            else:
                typer.echo(workspace_id)
    if failed:
        raise typer.Exit(1)


@app.command("cp")
def workspaces_cp(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(help="ID:PATH in a workspace, or a local path")],
    target: Annotated[str, typer.Argument(help="a local path, or ID:PATH in a workspace")],
) -> None:
    """Copy files or directories between a workspace and this machine, streamed, as docker cp does.

    corral workspaces cp ./src $WS:/workspace/project

    corral workspaces cp $WS:results ./out

    Exactly one side is ID:PATH; relative workspace paths start at /workspace. An existing directory as the target
    receives the copy under its own name; otherwise the copy becomes the target. Links that would lead outside the
    target are not written (each is reported on stderr).
    """
    from pathlib import Path

    from corral.cli._copy import WorkspacePath, download, parse_location, upload

    src, dst = parse_location(source), parse_location(target)
    if isinstance(src, WorkspacePath) == isinstance(dst, WorkspacePath):
        raise typer.BadParameter(
            f"exactly one of SOURCE and TARGET must be ID:PATH in a workspace, got {source!r} and {target!r}"
        )
    err = stderr_console()
    with connect(ctx) as corral:
        try:
            if isinstance(src, WorkspacePath):
                assert isinstance(dst, str)
                files = corral.workspaces.get(src.workspace_id).files
                download(files, src.path, Path(dst), lambda text: err.print(f"warning: {text}", markup=False))
            else:
                assert isinstance(dst, WorkspacePath)
                upload(corral.workspaces.get(dst.workspace_id).files, Path(src), dst.path)
        except OSError as exc:
            if isinstance(exc, CorralError):
                raise
            fail("local_file_error", str(exc))
