"""``corral image``: build the workspace base image and the microVM root filesystem, with a progress display."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli._common import stderr_console

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(help="Workspace images.", no_args_is_help=True)


@app.command("build")
def image_build(
    *,
    tag: Annotated[str, typer.Option(help="image name")] = "corral/workspace:base",
    if_missing: Annotated[bool, typer.Option("--if-missing", help="skip when an up-to-date image exists")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="on a terminal, also print every line of tool output")
    ] = False,
) -> None:
    """Build the workspace base image from Debian packages (mmdebstrap + docker import)."""
    from corral.images.base import build_base_image

    display = BuildDisplay(stderr_console(), verbose=verbose)
    try:
        with display:
            built = build_base_image(tag, if_missing=if_missing, progress=display.line)
    except (RuntimeError, FileNotFoundError) as exc:
        typer.echo(f"corral: image build failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    if not built:
        typer.echo(f"corral: {tag} is up to date", err=True)


@app.command("build-rootfs")
def image_build_rootfs(
    *,
    output: Annotated[Path, typer.Option(help="the ext4 image to write")],
    image: Annotated[str, typer.Option(help="the container image to start from")] = "corral/workspace:base",
    if_missing: Annotated[bool, typer.Option("--if-missing", help="skip when an up-to-date rootfs exists")] = False,
) -> None:
    """Build the microVM root filesystem (base image + init + agent) as an ext4 image."""
    from corral.microvm.rootfs import build_rootfs_sync

    try:
        build_rootfs_sync(output, image=image, if_missing=if_missing, progress=lambda line: typer.echo(line, err=True))
    except (RuntimeError, OSError) as exc:
        typer.echo(f"corral: rootfs build failed: {exc}", err=True)
        raise typer.Exit(1) from exc


class BuildDisplay:
    """Shows ``build_base_image``'s progress lines: on a terminal, a spinner naming the current step with its
    latest output line (every line with ``--verbose``), and a check mark per finished step; elsewhere (logs, CI),
    every line as plain text on stderr, exactly as before.

    Lines starting with two spaces are tool output; the others name a step.
    """

    def __init__(self, console: Console, *, verbose: bool = False) -> None:
        self.console = console
        self.verbose = verbose
        self.step: str | None = None
        self._status: Any = None

    def __enter__(self) -> BuildDisplay:
        if self.console.is_terminal:
            self._status = self.console.status("starting", spinner="dots")
            self._status.__enter__()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)
            self._status = None
        if self.step is not None and exc_type is None and self.console.is_terminal:
            self.console.print(f"[green]✓[/] {self.step}", markup=True)

    def line(self, text: str) -> None:
        """One progress line from the build."""
        if self._status is None:  # not a terminal (logs, CI): every line, plain, as it always was
            typer.echo(text, err=True)
            return
        output = text.startswith("  ")
        if output:
            if self.verbose:
                self.console.print(text, markup=False, style="dim")
            from rich.text import Text

            self._status.update(Text.assemble(self.step or "", ("  " + text.strip()[:100], "dim")))
            return
        if self.step is not None:
            self.console.print(f"[green]✓[/] {self.step}", markup=True)
        self.step = text
        from rich.text import Text

        self._status.update(Text(text))
