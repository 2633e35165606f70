"""What every ``corral`` command shares: the server to talk to (:class:`Remote`), the connected client, one-line
errors, and output (tables on a terminal, whole lines when piped, JSON with ``--json``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from corral.client import Corral

JsonFlag = Annotated[bool, typer.Option("--json", help="print the API's JSON instead of a table (for scripts)")]


@dataclass(frozen=True, slots=True)
class Remote:
    """Where the client commands send their requests (from ``--url`` / ``--token`` or the environment)."""

    url: str | None
    token: str | None


def remote(ctx: typer.Context) -> Remote:
    """The server the root options named (the environment's, or the default, without them)."""
    return ctx.obj if isinstance(ctx.obj, Remote) else Remote(None, None)


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def show(renderable: Any) -> None:
    """Print a table (or text) on stdout; piped into another program, rows stay whole lines, never wrapped."""
    from rich.console import Console

    if sys.stdout.isatty():
        Console(highlight=False).print(renderable)
        return
    console = Console(highlight=False, width=10_000, no_color=True)
    with console.capture() as capture:
        console.print(renderable)
    for line in capture.get().splitlines():
        typer.echo(line.rstrip())


def fail(code: str, message: str) -> NoReturn:
    """Print ``error: code: message`` as one line on stderr and exit 1."""
    line = " ".join(f"error: {code}: {message}".split())
    typer.echo(line, err=True)
    raise typer.Exit(1)


@contextmanager
def connect(ctx: typer.Context) -> Iterator[Corral]:
    """A connected SDK client; every Corral error (or timeout) becomes one line and exit code 1."""
    from corral.client import Corral
    from corral.errors import CorralError

    server = remote(ctx)
    try:
        with Corral(server.url, server.token) as corral:
            yield corral
    except CorralError as exc:
        fail(exc.code, exc.message)
    except TimeoutError as exc:
        fail("timeout", str(exc))


def print_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    """A JSON object given inline, as ``@file``, or as ``-`` (stdin)."""
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise typer.BadParameter(f"{what}: cannot read {text[1:]}: {exc.strerror}") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"{what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{what}: must be a JSON object, got {type(value).__name__}")
    return value


def describe(pairs: Mapping[str, object]) -> Any:
    """A two-column key/value table (``show`` of a workspace, agent type or session)."""
    from rich.table import Table

    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in pairs.items():
        shown = value if isinstance(value, str) else json.dumps(value, default=str)
        table.add_row(key, shown)
    return table
