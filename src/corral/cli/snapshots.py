"""``corral snapshots``: list, show and remove workspace snapshots (``corral workspaces snapshot`` takes them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli._common import JsonFlag, connect, describe, print_json, show, stderr_console

if TYPE_CHECKING:
    from corral.client import Snapshot

app = typer.Typer(help="List, show and remove workspace snapshots.", no_args_is_help=True)


def human_size(size: int) -> str:
    """``123456789 -> "117.7M"``: a size to read at a glance, not an exact one (``--json`` has the bytes)."""
    for unit, factor in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if size >= factor:
            return f"{size / factor:.1f}{unit}"
    return f"{size}B"


def report_snapshot(snapshot: Snapshot) -> None:
    """What a person wants to know after taking one: what it holds and how big it is (on stderr)."""
    holds = "files, processes and memory" if snapshot.kind == "memory" else "files only"
    named = f" {snapshot.name!r}" if snapshot.name else ""
    stderr_console().print(
        f"snapshot {snapshot.id}{named} of workspace {snapshot.workspace_id} {snapshot.status} on "
        f"{snapshot.provider}: {holds}, {human_size(snapshot.size_bytes)}",
        markup=False,
        highlight=False,
        soft_wrap=True,  # one line, however narrow the terminal: scripts grep it
    )


def _snapshot_table(snapshots: Sequence[Snapshot]) -> Any:
    from rich.table import Table

    table = Table("ID", "NAME", "WORKSPACE", "KIND", "STATUS", "SIZE", "PROVIDER", "CREATED", box=None, pad_edge=False)
    for s in snapshots:
        created = s.created_at.strftime("%Y-%m-%d %H:%M:%S") if s.created_at else "-"
        status = f"{s.status}: {s.error}" if s.error else s.status
        table.add_row(s.id, s.name or "-", s.workspace_id, s.kind, status, human_size(s.size_bytes), s.provider,
                      created)  # fmt: skip
    return table


@app.command("list")
def snapshots_list(
    ctx: typer.Context,
    *,
    workspace: Annotated[str | None, typer.Option("--workspace", help="only the snapshots of this workspace")] = None,
    name: Annotated[str | None, typer.Option("--name", help="only the snapshots with this name")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the ids")] = False,
    as_json: JsonFlag = False,
) -> None:
    """List snapshots, newest first."""
    with connect(ctx) as corral:
        snapshots = corral.snapshots.list(workspace_id=workspace, name=name)
    if as_json:
        print_json([dict(s.raw) for s in snapshots])
    elif quiet:
        for snapshot in snapshots:
            typer.echo(snapshot.id)
    else:
        show(_snapshot_table(snapshots) if snapshots else "no snapshots")


@app.command("show")
def snapshots_show(ctx: typer.Context, snapshot_id: str, as_json: JsonFlag = False) -> None:
    """Show one snapshot."""
    with connect(ctx) as corral:
        snapshot = corral.snapshots.get(snapshot_id)
    if as_json:
        print_json(dict(snapshot.raw))
        return
    show(describe(dict(snapshot.raw)))


@app.command("rm")
def snapshots_rm(ctx: typer.Context, snapshot_ids: Annotated[list[str], typer.Argument(help="one or more")]) -> None:
    """Delete snapshots and their files; each one's error is reported and the rest still go. Workspaces restored
    from them keep running."""
    from corral.errors import CorralError

    failed = False
    with connect(ctx) as corral:
        for snapshot_id in snapshot_ids:
            try:
                corral.snapshots.delete(snapshot_id)
            except CorralError as exc:
                typer.echo(" ".join(f"error: {exc.code}: {exc.message}".split()), err=True)
                failed = True
            else:
                typer.echo(snapshot_id)
    if failed:
        raise typer.Exit(1)
