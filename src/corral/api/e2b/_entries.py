"""envd's ``filesystem.EntryInfo``, built the way envd builds it, from the provider's ``stat`` and ``list_dir``.

envd takes ``os.Lstat`` of the path and reports:

* ``type``: the file's type; for a symlink, the type of what it finally points to (``FILE_TYPE_UNSPECIFIED`` when
  that does not exist), with ``symlinkTarget`` set to the fully resolved path (the link's own path when it cannot be
  resolved). ``isSymlink`` stays unset, so the SDK shows the target's type, as it does against E2B.
* ``mode``: the permission bits (``0o777`` only); for a symlink, its target's (0 when dangling).
* ``permissions``: Go's ``FileMode.String()`` of the lstat mode, such as ``-rw-r--r--``, ``drwxr-xr-x``,
  ``Lrwxrwxrwx`` (a symlink) or ``urwxr-xr-x`` (setuid; Go shows special bits as leading letters, not in place).
* ``owner``/``group``: the names of the file's uid and gid in the sandbox (the numbers when they have none).
* ``size`` and ``modifiedTime`` of the path itself, and the file's ``metadata`` (see :mod:`corral.api.e2b._metadata`).

Messages follow protobuf's JSON mapping as envd's Connect server writes them: fields at their default value are left
out, ``size`` is a string, times are RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits.
"""

from __future__ import annotations

import asyncio
import stat as statlib
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from corral.api.e2b._metadata import MetadataStore
from corral.errors import FileOperationError, InvalidRequestError, ResourceLimitError, WorkspaceFileNotFoundError
from corral.providers.base import FileInfo, WorkspaceCalls

__all__ = ["Entry", "EntryReader", "both", "concurrently", "go_permissions", "proto_timestamp"]

_T = TypeVar("_T")
_A = TypeVar("_A")
_B = TypeVar("_B")
_FILE_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY"}
_TYPE_LETTERS = {"dir": "d", "symlink": "L"}  # Go's letters for the lstat types Corral's FileInfo tells apart


def go_permissions(kind: str, mode: int) -> str:
    """Go's ``os.FileMode.String()`` for an lstat ``kind`` and mode bits (permissions, setuid, setgid, sticky).

    Go writes one letter per set mode bit, in the order of its bits (``dalTLDpSugct?``), or ``-`` when none is set,
    then ``rwxrwxrwx`` with ``-`` for each clear permission bit. Corral's ``other`` (a device, FIFO or socket, which
    the provider contract does not tell apart) is shown as Go's ``?`` (irregular).
    """
    letters = _TYPE_LETTERS.get(kind, "")
    letters += "u" if mode & statlib.S_ISUID else ""
    letters += "g" if mode & statlib.S_ISGID else ""
    letters += "t" if mode & statlib.S_ISVTX else ""
    letters += "?" if kind == "other" else ""
    bits = "".join(char if mode & (1 << (8 - i)) else "-" for i, char in enumerate("rwxrwxrwx"))
    return (letters or "-") + bits


def proto_timestamp(seconds: float) -> str:
    """A ``google.protobuf.Timestamp`` in JSON, as Go's protojson writes it (the provider gives microseconds)."""
    whole, micros = divmod(round(seconds * 1_000_000), 1_000_000)
    text = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if micros % 1000:
        text += f".{micros:06d}"
    elif micros:
        text += f".{micros // 1000:03d}"
    return text + "Z"


MAX_LISTED_ENTRIES = 100_000
"""A ListDir answers at most this many entries (the workspace decides how many there are; the answer is in memory)."""
CONCURRENT_CALLS = 32
"""Provider calls :func:`concurrently` runs at once."""


async def concurrently(calls: Iterable[Awaitable[_T]]) -> list[_T]:
    """The results of ``calls`` run at once, in order; on the first failure the others are cancelled and it is raised.

    (``asyncio.gather`` would leave the others running, and a ``TaskGroup`` raises an ``ExceptionGroup`` where the
    callers map single Corral errors.)
    """
    limit = asyncio.Semaphore(CONCURRENT_CALLS)  # a directory of 5,000 symlinks: not 15,000 calls at once

    async def bounded(call: Awaitable[_T]) -> _T:
        async with limit:
            return await call

    tasks = [asyncio.ensure_future(bounded(call)) for call in calls]
    try:
        return [await task for task in tasks]
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def both(first: Awaitable[_A], second: Awaitable[_B]) -> tuple[_A, _B]:
    """Two calls at once, as :func:`concurrently` runs them."""
    results: list[object] = await concurrently([first, second])
    return cast(_A, results[0]), cast(_B, results[1])


@dataclass(frozen=True, slots=True)
class Entry:
    """One path as envd reports it: its lstat, what a symlink resolves to, and its metadata."""

    info: FileInfo
    target_path: str | None = None
    """For a symlink: the fully resolved path, or the link's own path when it cannot be resolved."""
    target: FileInfo | None = None
    """For a symlink: what it points to, None when that does not exist (or the links loop)."""
    metadata: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The ``filesystem.EntryInfo`` message in protobuf JSON (default values left out, as envd sends it)."""
        info = self.info
        kind, mode = info.type, info.mode & 0o777
        if info.type == "symlink":
            kind = self.target.type if self.target is not None else "other"
            mode = self.target.mode & 0o777 if self.target is not None else 0
        entry: dict[str, Any] = {
            "name": info.name,
            "type": _FILE_TYPES.get(kind),
            "path": info.path,
            "size": str(info.size) if info.size else None,
            "mode": mode or None,
            "permissions": go_permissions(info.type, info.mode),
            "owner": info.owner or None,
            "group": info.group or None,
            "modifiedTime": proto_timestamp(info.mtime),
            "metadata": dict(self.metadata) or None,
        }
        if info.type == "symlink":  # an optional field: present whenever set
            entry["symlinkTarget"] = self.target_path if self.target_path is not None else info.path
        return {key: value for key, value in entry.items() if value is not None}


@dataclass(frozen=True, slots=True)
class EntryReader:
    """Builds the entries of one sandbox's paths (absolute and normalised) through ``provider``'s file calls."""

    provider: WorkspaceCalls
    sandbox_id: str

    @property
    def metadata(self) -> MetadataStore:
        """Where this sandbox's file metadata is kept."""
        return MetadataStore(self.provider, self.sandbox_id)

    async def stat(self, path: str) -> Entry:
        """The entry of ``path`` (envd's Stat).

        Raises:
            WorkspaceFileNotFoundError: nothing is at ``path``.
        """
        # The metadata is read alongside the lstat: one round trip for the common case of a file that is no symlink.
        info, metadata = await both(self.provider.stat(self.sandbox_id, path), self.metadata.read(path))
        return await self.complete(info, metadata=metadata)

    async def complete(self, info: FileInfo, *, metadata: Mapping[str, str] | None = None) -> Entry:
        """The entry of a path whose lstat is ``info``: a symlink resolved, the metadata read unless given."""
        if info.type == "symlink":
            target_path, target = await self._resolve(info)
            found = await self.metadata.read(target_path) if target is not None and target.type == "file" else {}
            return Entry(info, target_path, target, found)
        if metadata is None:
            metadata = await self.metadata.read(info.path) if info.type == "file" else {}
        return Entry(info, metadata=metadata)

    async def listing(self, path: str, depth: int) -> list[Entry]:
        """The entries under the directory ``path``, ``depth`` levels deep, in envd's order (envd's ListDir).

        A symlink to a directory is listed at its resolved path; symlinks inside are reported, never walked into.

        Raises:
            WorkspaceFileNotFoundError: nothing is at ``path`` (or a symlink there leads nowhere).
            InvalidRequestError: ``path`` is not a directory.
        """
        root = await self.provider.stat(self.sandbox_id, path)
        directory = path
        if root.type == "symlink":
            resolved, target = await self._resolve(root)
            if target is None:
                raise WorkspaceFileNotFoundError(f"directory not found: {path} is a symlink that leads nowhere")
            root, directory = target, resolved
        if root.type != "dir":
            raise InvalidRequestError(f"path is not a directory: {path}")
        entries: list[Entry] = []
        await self._walk(directory, depth, entries)
        return entries

    async def _walk(self, directory: str, depth: int, out: list[Entry]) -> None:
        # filepath.WalkDir's order: entries sorted by name, each directory followed by what is inside it.
        listed, records = await both(self.provider.list_dir(self.sandbox_id, directory), self.metadata.names(directory))
        entries = {info.path: Entry(info) for info in listed}
        pending = [
            info
            for info in listed
            if info.type == "symlink" or (info.type == "file" and MetadataStore.name(info.name) in records)
        ]
        for entry in await concurrently(self.complete(info) for info in pending):
            entries[entry.info.path] = entry
        for info in listed:
            out.append(entries[info.path])
            if len(out) > MAX_LISTED_ENTRIES:
                raise ResourceLimitError(
                    f"the listing has more than {MAX_LISTED_ENTRIES} entries; list a smaller depth or a subdirectory"
                )
            if info.type == "dir" and depth > 1:
                await self._walk(info.path, depth - 1, out)

    async def _resolve(self, link: FileInfo) -> tuple[str, FileInfo | None]:
        """What a symlink finally points to, as Go's ``filepath.EvalSymlinks`` then ``os.Stat`` see it."""
        try:
            resolved = await self.provider.realpath(self.sandbox_id, link.path)
            target = await self.provider.stat(self.sandbox_id, resolved)
        except (FileOperationError, InvalidRequestError):
            return link.path, None
        if target.type == "symlink":  # realpath gave up on a loop (or a chain too long): EvalSymlinks fails
            return link.path, None
        return resolved, target
