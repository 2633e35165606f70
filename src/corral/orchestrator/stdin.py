"""Standard input for commands, on every provider: the text goes to a private file, the command reads it.

Providers run commands with stdin from ``/dev/null`` (their exec has no input channel), so the service gives a
command its input the same way everywhere: the bytes are written to a fresh file in the workspace
(``/tmp/.corral-stdin-<random>``, mode 0600, owned by the command's user), and the command is wrapped so that its
shell opens that file as stdin and removes it before the command itself starts. The command then reads the text and
end of file, as with ``echo text | command``. Its working directory, environment, user and deadline are unchanged.

The file is also removed (best effort) after the command, for a command killed before it could open it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import shlex
from collections.abc import AsyncIterator

from corral.errors import CorralError
from corral.providers.base import ExecMode, ExecRequest, WorkspaceCalls

__all__ = ["STDIN_PREFIX", "reading_from", "stdin_file"]

STDIN_PREFIX = "/tmp/.corral-stdin-"  # noqa: S108  # in the workspace; random names, mode 0600
"""Where input files are written, followed by 32 random hex digits (/tmp is sticky: only their owner removes them)."""

# Argv mode: $1 is the input file; the rest is the command, run without any shell interpreting it.
_ARGV_WRAPPER = 'exec <"$1" || exit 125; rm -f -- "$1"; shift; exec "$@"'


def reading_from(request: ExecRequest, path: str) -> ExecRequest:
    """``request`` with its standard input read from the file ``path``, which is removed once opened.

    Shell mode prepends the redirection to the command line (on its own line, so the user's line is parsed exactly
    as before); argv mode runs ``/bin/sh`` only to redirect, then ``exec``s the program with its arguments as given.
    """
    if request.mode is ExecMode.SHELL:
        quoted = shlex.quote(path)
        prologue = f"exec <{quoted} || exit 125; rm -f -- {quoted}\n"
        return dataclasses.replace(request, command=prologue + request.command)
    return dataclasses.replace(
        request,
        command="/bin/sh",
        args=("-c", _ARGV_WRAPPER, "sh", path, request.command, *request.args),
        mode=ExecMode.ARGV,
    )


@contextlib.asynccontextmanager
async def stdin_file(
    runtime: WorkspaceCalls, workspace_id: str, request: ExecRequest, data: str | bytes
) -> AsyncIterator[ExecRequest]:
    """Write ``data`` to a new input file in the workspace and give the request that reads it (see the module).

    Errors of the workspace (not found, not ready...) are raised here, before the command is run. The file is
    removed on the way out whatever happened, even when the caller is cancelled (a client that went away).

    Args:
        runtime: Where to write the file (the service's runtime, so that the workspace must be ready).
        workspace_id: The workspace.
        request: The command, already validated.
        data: Its input; text is encoded as UTF-8.
    """
    path = STDIN_PREFIX + secrets.token_hex(16)
    payload = data.encode() if isinstance(data, str) else data
    try:
        await runtime.write_file(workspace_id, path, payload, mode=0o600, owner=request.user)
        yield reading_from(request, path)
    finally:
        # Usually gone already (the wrapper removed it); shielded so that a cancelled request still removes it.
        with contextlib.suppress(CorralError):
            await asyncio.shield(runtime.delete(workspace_id, path))
