"""The ``corral`` command."""

from __future__ import annotations

import logging

import typer

from corral.settings import Settings

__all__ = ["app", "main"]

app = typer.Typer(help="Corral: isolated workspaces for AI agents.", no_args_is_help=True, add_completion=False)
image_app = typer.Typer(help="Workspace images.", no_args_is_help=True)
app.add_typer(image_app, name="image")


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="address to bind"),
    port: int = typer.Option(8000, help="port to bind"),
    log_level: str = typer.Option("info", help="debug, info, warning or error"),
) -> None:
    """Serve the HTTP API (settings come from CORRAL_* environment variables)."""
    import uvicorn

    from corral.api.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = Settings()
    application = create_app(settings)
    typer.echo(f"corral: serving on http://{host}:{port} (data in {settings.data_dir.resolve()})", err=True)
    uvicorn.run(application, host=host, port=port, log_level=log_level.lower(), access_log=False)


@image_app.command("build")
def image_build(
    tag: str = typer.Option("corral/workspace:base", help="image name"),
    if_missing: bool = typer.Option(False, "--if-missing", help="skip when an up-to-date image exists"),
) -> None:
    """Build the workspace base image from Debian packages (mmdebstrap + docker import)."""
    from corral.images.base import build_base_image

    try:
        built = build_base_image(tag, if_missing=if_missing, progress=lambda line: typer.echo(line, err=True))
    except (RuntimeError, FileNotFoundError) as exc:
        typer.echo(f"corral: image build failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    if not built:
        typer.echo(f"corral: {tag} is up to date", err=True)


def main() -> None:
    """Entry point of the ``corral`` script."""
    app()


if __name__ == "__main__":
    main()
