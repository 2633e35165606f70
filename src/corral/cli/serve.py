"""The server processes: ``corral serve`` (the HTTP API) and ``corral firecracker-manager``."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

MAX_REQUEST_HEAD = 64 * 1024
"""The most bytes a request line and headers may take (long signed URLs and tokens fit)."""
MAX_CONNECTIONS = 4096
"""Connections and tasks served at once; past it uvicorn answers 503 instead of accepting more work."""


def serve(
    *,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to bind")] = 8000,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Serve the HTTP API (settings come from CORRAL_* environment variables)."""
    import copy

    import uvicorn
    import uvicorn.config

    from corral.api.app import create_app
    from corral.credentials import RedactingFilter
    from corral.settings import Settings

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # Credentials are masked where messages are made; the filter on every handler is the second line of defence.
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["filters"] = {"redact": {"()": RedactingFilter}}
    for handler_config in log_config["handlers"].values():
        handler_config["filters"] = ["redact"]
    settings = Settings()
    application = create_app(settings)
    typer.echo(f"corral: serving on http://{host}:{port} (data in {settings.data_dir.resolve()})", err=True)
    uvicorn.run(
        application,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=False,
        log_config=log_config,
        # h11 caps what an unfinished request head may hold (httptools buffers it whole): an anonymous client cannot
        # make the server hold a 200 MB header. Past the cap the connection is answered 400 and closed.
        http="h11",
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD,
        limit_concurrency=MAX_CONNECTIONS,
    )


def firecracker_manager(
    *,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to bind")] = 8100,
    uds: Annotated[str | None, typer.Option(help="listen on this Unix socket instead")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Serve the Firecracker manager's HTTP API (GET /health, /vms ...) for CORRAL_FIRECRACKER_MANAGER_URL."""
    from corral.microvm.server import serve_manager
    from corral.settings import Settings

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_manager(Settings(), host=host, port=port, uds=uds, log_level=log_level)
