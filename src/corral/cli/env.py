"""``corral env``: the shell lines that let a fresh shell use this Corral (``eval "$(.venv/bin/corral env)"``).

It prints ``export`` lines for ``PATH`` (the directory holding this ``corral``, added once), ``CORRAL_URL``,
``CORRAL_DATA_DIR`` (absolute, so the SDK finds the token from any directory) and ``CORRAL_API_TOKEN`` (the one in the
environment or ``--token``, else the one ``corral serve`` wrote into the data directory). It reads files only; it
does not ask the server anything.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from corral.cli._common import fail, remote

DEFAULT_URL = "http://127.0.0.1:8000"


def env(ctx: typer.Context) -> None:
    """Print export lines for PATH, CORRAL_URL, CORRAL_DATA_DIR and CORRAL_API_TOKEN: eval "$(corral env)"."""
    from corral.client._token import missing_token_message, token_file, token_from_environment

    server = remote(ctx)
    token = server.token or token_from_environment()
    if not token:
        fail("no_token", missing_token_message() + "; start the server first (`make start` or `make run`)")
    lines = []
    # The venv's bin (not resolved: its python is a symlink to the system's), where this `corral` script lives.
    bin_dir = Path(sys.executable).absolute().parent
    if (bin_dir / "corral").exists():
        quoted = shlex.quote(str(bin_dir))
        # Added only once, however often the line is evaluated.
        lines.append(f'case ":$PATH:" in *:{quoted}:*) ;; *) export PATH={quoted}:"$PATH" ;; esac')
    lines.append(f"export CORRAL_URL={shlex.quote(server.url or DEFAULT_URL)}")
    lines.append(f"export CORRAL_DATA_DIR={shlex.quote(str(token_file().parent))}")
    lines.append(f"export CORRAL_API_TOKEN={shlex.quote(token)}")
    typer.echo("\n".join(lines))
