"""Keeping file paths inside ``/workspace``, symlinks included.

A path is normalised lexically first (:func:`lexically_confined`, so ``../etc/passwd`` is refused without a round
trip). File operations (the HTTP file API, the read/write/edit/glob tools) then pass ``beneath=WORKSPACE_ROOT`` to
the provider, which resolves the path beneath /workspace in the same step as the operation, so a symlink
``/workspace/x -> /etc`` is refused even when a process in the workspace swaps it in at the last moment.

:func:`confine` adds a separate ``realpath`` round trip for paths handed to a command (grep's rg, git's options): the
command follows symlinks itself, so no provider can confine it; the check narrows that to a race, it cannot close it.
"""

from __future__ import annotations

import posixpath

from corral.errors import InvalidRequestError
from corral.providers.base import WORKSPACE_ROOT, WorkspaceCalls, check_path

__all__ = ["confine", "lexically_confined"]


def _inside(path: str) -> bool:
    return path == WORKSPACE_ROOT or path.startswith(WORKSPACE_ROOT + "/")


def lexically_confined(path: str, *, field_name: str = "path") -> str:
    """Absolute, normalised form of ``path`` (relative to /workspace); refuses paths that leave /workspace."""
    absolute = posixpath.normpath(check_path(path, field_name=field_name))
    if absolute.startswith("//"):
        absolute = "/" + absolute.lstrip("/")
    if not _inside(absolute):
        raise InvalidRequestError(
            f"{field_name}: {path!r} is outside /workspace; paths must stay inside the workspace",
            details={"field": field_name, "path": path},
        )
    return absolute


async def confine(provider: WorkspaceCalls, workspace_id: str, path: str, *, field_name: str = "path") -> str:
    """Like :func:`lexically_confined`, and the path with its symlinks resolved must stay inside too."""
    absolute = lexically_confined(path, field_name=field_name)
    if absolute == WORKSPACE_ROOT:
        return absolute
    resolved = await provider.realpath(workspace_id, absolute)
    if not _inside(resolved):
        raise InvalidRequestError(
            f"{field_name}: {path!r} resolves to {resolved!r} through a symlink, outside /workspace",
            details={"field": field_name, "path": path},
        )
    return absolute
