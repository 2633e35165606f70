"""``corral providers`` and ``corral pool``: the server's providers (health, active workspaces) and their warm pools."""

from __future__ import annotations

import typer

from corral.cli._common import JsonFlag, connect, print_json, show


def providers(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Show every provider's health, active workspaces and last error."""
    from rich.table import Table

    with connect(ctx) as corral:
        statuses = corral.providers()
    if as_json:
        print_json([dict(s.raw) for s in statuses])
        return
    table = Table("PROVIDER", "STATUS", "ACTIVE", "LAST CHECK", "ERROR", box=None, pad_edge=False)
    for s in statuses:
        colour = "green" if s.healthy else "red"
        checked = s.last_check.strftime("%H:%M:%S") if s.last_check else "-"
        table.add_row(s.name, f"[{colour}]{s.status}[/]", str(s.active_workspaces), checked, s.error or "")
    show(table)


def pool(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Show the warm pools: target (grown by a burst, up to max) and current size, hits and misses."""
    from rich.table import Table

    with connect(ctx) as corral:
        report = corral.pool()
    if as_json:
        print_json({"pools": [dict(p.raw) for p in report.pools], "unpooled_misses": dict(report.unpooled_misses)})
        return
    columns = ("PROVIDER", "IMAGE", "SIZE", "TARGET", "MAX", "HITS", "MISSES", "LAST ERROR")
    table = Table(*columns, box=None, pad_edge=False)
    for p in report.pools:
        target = str(p.target) if p.target == p.base_size else f"{p.target} (grown from {p.base_size})"
        counts = (str(p.size), target, str(p.max_size), str(p.hits), str(p.misses))
        table.add_row(p.provider, p.image, *counts, p.last_error or "")
    show(table if report.pools else "no warm pools configured (CORRAL_WARM_POOL_SIZE=0)")
