"""Where the client finds its API token when none is given, and what it says when there is none.

``corral serve`` without ``CORRAL_API_TOKEN`` generates a token into ``$CORRAL_DATA_DIR/api-token`` (the data
directory defaults to ``./data``, relative to where the server was started, exactly as the server resolves it). So a
client finds it from any directory once ``CORRAL_DATA_DIR`` names that directory; next to ``make run`` (in the
repository) the default works with no set-up at all.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["missing_token_message", "token_file", "token_from_environment"]

DEFAULT_DATA_DIR = "data"


def token_file() -> Path:
    """``$CORRAL_DATA_DIR/api-token``, or ``./data/api-token`` when ``CORRAL_DATA_DIR`` is unset (the server's
    default), as an absolute path."""
    return (Path(os.environ.get("CORRAL_DATA_DIR") or DEFAULT_DATA_DIR) / "api-token").absolute()


def token_from_environment() -> str | None:
    """``CORRAL_API_TOKEN``, else the contents of :func:`token_file`, else None."""
    if os.environ.get("CORRAL_API_TOKEN"):
        return os.environ["CORRAL_API_TOKEN"]
    try:
        return token_file().read_text().strip() or None
    except OSError:
        return None


def missing_token_message() -> str:
    """What is missing when no token was found, and the ways to give one."""
    path = token_file()
    where = "CORRAL_DATA_DIR" if os.environ.get("CORRAL_DATA_DIR") else "CORRAL_DATA_DIR is unset, so ./data"
    return (
        f"no API token: CORRAL_API_TOKEN is not set and {path} does not exist ({where}). Set CORRAL_API_TOKEN, or "
        "set CORRAL_DATA_DIR to the server's data directory (where `corral serve` wrote api-token), or pass token=; "
        'in the repository, `eval "$(.venv/bin/corral env)"` sets both'
    )
