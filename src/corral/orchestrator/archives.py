"""Tar archives of workspace paths, both ways, streamed: what ``corral workspaces cp`` rides on.

The archive is made and unpacked *inside* the workspace by its own ``tar`` (through the runtime's exec), so the
server only relays bytes: a download streams tar's stdout chunk by chunk under the agent's flow control, and an upload
streams the request body into a private temporary file in the workspace, which tar then extracts. The server's
memory does not depend on the archive's size either way.

Whatever tar runs on is the workspace's, so nothing here trusts it for the host's safety: the bytes only ever leave
for the client, which unpacks them as hostile (see :mod:`corral.client._copy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import secrets
from collections.abc import AsyncIterable

from corral.errors import CorralError, FileOperationError, InvalidRequestError, WorkspaceFileNotFoundError
from corral.orchestrator.paths import lexically_confined
from corral.orchestrator.service import WorkspaceService
from corral.providers.base import WORKSPACE_ROOT, ExecExit, ExecMode, ExecRequest, ExecStream
from corral.streams import ByteStream

__all__ = ["ARCHIVE_TIMEOUT_S", "extract_archive", "open_archive"]

log = logging.getLogger(__name__)

ARCHIVE_TIMEOUT_S = 6 * 3600.0
"""The longest a tar inside the workspace may run for one copy (a large tree over a slow link)."""
_STDERR_KEPT = 4096  # of tar's complaints, enough for the error message; the rest is dropped
# GNU tar: 1 means "some files differ" (changed while read): the archive is still complete. 2 is fatal.
_TAR_WARNING = 1


async def open_archive(service: WorkspaceService, workspace_id: str, path: str) -> ByteStream:
    """A tar stream of one file or directory of the workspace, its single top-level entry named after it.

    Errors about the path (missing, leading outside /workspace) and the workspace (not ready...) are raised here,
    before the first chunk, so the HTTP answer can still be an error. A tar that fails later ends the stream with
    :class:`FileOperationError`, which cuts the HTTP answer short: the client sees an incomplete archive.

    Raises:
        WorkspaceFileNotFoundError: nothing at ``path``.
        InvalidRequestError: ``path`` leads outside /workspace.
    """
    absolute = lexically_confined(path)
    await service.stat(workspace_id, absolute)  # 404 for a missing path; refuses symlinks leading out
    if absolute == WORKSPACE_ROOT:
        parent, name = "/", posixpath.basename(WORKSPACE_ROOT)
    else:
        # tar follows the parent directories' symlinks itself: resolve them beneath /workspace first.
        parent = await service.runtime.realpath(
            workspace_id, posixpath.dirname(absolute) or WORKSPACE_ROOT, beneath=WORKSPACE_ROOT
        )
        name = posixpath.basename(absolute)
    request = ExecRequest(
        "tar", ("-C", parent, "-cf", "-", "--", name), mode=ExecMode.ARGV, cwd="/", timeout_s=ARCHIVE_TIMEOUT_S
    )
    events = service.exec_stream(workspace_id, request)
    stderr = bytearray()
    # Wait for tar's first bytes (or its end) here, so a tar that cannot start is an error answer, not a cut stream.
    try:
        async for event in events:
            if isinstance(event, ExecExit):
                _check_exit(event.exit_code, stderr, path)
                return _rest(events, b"", stderr, path)  # tar always writes end blocks; this is for form
            if event.stream == "stdout":
                return _rest(events, event.data, stderr, path)
            stderr += event.data[: max(_STDERR_KEPT - len(stderr), 0)]
    except BaseException:
        await events.aclose()
        raise
    raise FileOperationError(f"path: tar of {path!r} ended without an exit status", details={"path": path})


async def _rest(events: ExecStream, first: bytes, stderr: bytearray, path: str) -> ByteStream:
    async with contextlib.aclosing(events):
        yield first
        async for event in events:
            if isinstance(event, ExecExit):
                _check_exit(event.exit_code, stderr, path)
                return
            if event.stream == "stdout":
                yield event.data
            else:
                stderr += event.data[: max(_STDERR_KEPT - len(stderr), 0)]


def _check_exit(exit_code: int, stderr: bytes | bytearray, path: str) -> None:
    text = stderr.decode(errors="replace").strip()
    if exit_code == _TAR_WARNING:
        log.info("tar of %s in a workspace warned: %s", path, text)
        return
    if exit_code != 0:
        raise FileOperationError(
            f"path: could not archive {path!r}: tar exited with {exit_code}: {text or 'no message'}",
            details={"path": path, "exit_code": exit_code},
        )


async def extract_archive(
    service: WorkspaceService, workspace_id: str, path: str, body: AsyncIterable[bytes]
) -> tuple[str, int]:
    """Unpack a tar stream into the directory ``path`` of the workspace (created with its parents when missing).

    The body goes to a private temporary file in the workspace first (tar needs the whole archive to report a bad one
    cleanly, and the server must not hold it); the file is removed whatever happens. Entries are owned by the
    workspace's user (``--no-same-owner``); names tar considers unsafe (absolute, ``..``) are handled by tar's own
    rules.

    Returns:
        The directory's absolute path and the archive's size in bytes.

    Raises:
        InvalidRequestError: ``path`` leads outside /workspace or is not a directory.
        FileOperationError: tar refused the archive (its message is included).
    """
    absolute = lexically_confined(path)
    try:
        info = await service.stat(workspace_id, absolute)
    except WorkspaceFileNotFoundError:
        pass
    else:
        # A symlink is checked by realpath below (beneath /workspace) and must lead to a directory for tar.
        if info.type not in ("dir", "symlink"):
            raise InvalidRequestError(
                f"path: {path!r} is a {info.type}; an archive is extracted into a directory",
                details={"field": "path", "path": path},
            )
    target = await service.runtime.realpath(workspace_id, absolute, beneath=WORKSPACE_ROOT)
    # Inside the sandbox (not the host): a random name no other upload takes, mode 0600, removed below.
    temporary = f"/tmp/.corral-upload-{secrets.token_hex(8)}.tar"  # noqa: S108
    try:
        size = await service.runtime.write_file(workspace_id, temporary, body, mode=0o600)
        script = 'mkdir -p -- "$1" && exec tar -C "$1" -xf "$2" --no-same-owner'
        result = await service.exec(
            workspace_id,
            ExecRequest(
                "/bin/sh",
                ("-c", script, "sh", target, temporary),
                mode=ExecMode.ARGV,
                cwd="/",
                timeout_s=ARCHIVE_TIMEOUT_S,
            ),
        )
    finally:
        # Shielded: a client that goes away cancels the request, and the temporary file must still go.
        with contextlib.suppress(CorralError):
            await asyncio.shield(service.runtime.delete(workspace_id, temporary))
    if result.exit_code != 0:
        text = result.stderr[:_STDERR_KEPT].decode(errors="replace").strip()
        raise FileOperationError(
            f"path: could not extract the archive into {path!r}: tar exited with {result.exit_code}: "
            f"{text or 'no message'}",
            details={"path": path, "exit_code": result.exit_code},
        )
    return target, size
