"""The in-memory file system of a fake workspace: files, directories and symlinks in dicts keyed by path.

Symlinks are modelled: every path is resolved the way the kernel does (``..`` is collapsed lexically first), and file
calls given ``beneath`` refuse paths and symlinks that lead outside it.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from corral.errors import FileOperationError, InvalidRequestError, WorkspaceFileNotFoundError
from corral.providers.base import WORKSPACE_ROOT, FileInfo, escape_error

__all__ = ["CHUNK_SIZE", "FileSystem", "normalize"]

CHUNK_SIZE = 64 * 1024
"""Size of the chunks ``read_file`` yields and of the output chunks of ``cat``."""

_TMP = "/tmp"  # noqa: S108 - the sandbox's own /tmp, which the fake keeps in memory
_UNDELETABLE = frozenset({"/", WORKSPACE_ROOT, _TMP})  # mount points: a real rm fails with EBUSY
_MAX_SYMLINK_HOPS = 40  # Linux's limit
_HOMES = {"/root": 0o700, "/home": 0o755, "/home/user": 0o755}


def normalize(path: str, cwd: str = WORKSPACE_ROOT) -> str:
    """Make ``path`` absolute (relative to ``cwd``) and collapse ``.``, ``..`` and repeated slashes."""
    joined = path if path.startswith("/") else f"{cwd}/{path}"
    normal = posixpath.normpath(joined)
    return "/" + normal.lstrip("/")  # normpath keeps a leading "//"


def _not_found(path: str) -> WorkspaceFileNotFoundError:
    return WorkspaceFileNotFoundError(f"{path}: No such file or directory", details={"path": path})


def _os_error(path: str, reason: str, errno_name: str) -> FileOperationError:
    return FileOperationError(f"{path}: {reason}", details={"path": path, "errno": errno_name})


def _is_under(path: str, root: str) -> bool:
    return root in ("/", path) or path.startswith(root + "/")


def _escape(path: str, root: str, via: str) -> InvalidRequestError:
    return escape_error(path, root, via)


@dataclass(slots=True)
class _File:
    data: bytes
    mode: int
    mtime: float


@dataclass(slots=True)
class _Dir:
    mode: int
    mtime: float


class FileSystem:
    """Files and directories keyed by normalised absolute path. Every method takes normalised paths."""

    def __init__(self) -> None:
        now = time.time()
        self.files: dict[str, _File] = {}
        self.dirs: dict[str, _Dir] = {"/": _Dir(0o755, now), WORKSPACE_ROOT: _Dir(0o755, now), _TMP: _Dir(0o1777, now)}
        # The homes of the base image's users (root and E2B's ``user``), where E2B commands start.
        self.dirs |= {home: _Dir(mode, now) for home, mode in _HOMES.items()}
        self.links: dict[str, str] = {}  # symlink path -> target, as given to ``ln -s``

    def resolve(self, path: str, *, follow: bool = True, beneath: str | None = None) -> str:
        """``path`` with its symlinks resolved: every directory on the way, and the last component with ``follow``.

        Missing components are kept as they are. With ``beneath``, a path, symlink or ``..`` leading outside that
        directory raises InvalidRequestError, as the agent of the real providers does.
        """
        root = None if beneath is None else normalize(beneath)
        if root is not None and not _is_under(path, root):
            raise _escape(path, root, "")
        floor = 0 if root is None else len([p for p in root.split("/") if p])  # components ``..`` may not go below
        todo = [p for p in path.split("/") if p not in ("", ".")][::-1]
        done: list[str] = []
        hops, via = 0, ""
        while todo:
            part = todo.pop()
            if part == "..":
                if root is not None and len(done) <= floor:
                    raise _escape(path, root, via or " through '..'")
                if done:
                    done.pop()
                continue
            current = "/" + "/".join([*done, part])
            target = self.links.get(current)
            if target is None or (not todo and not follow):
                done.append(part)
                continue
            hops += 1
            if hops > _MAX_SYMLINK_HOPS:
                raise _os_error(path, "Too many levels of symbolic links", "ELOOP")
            via = f" through the symlink {current} -> {target}"
            if target.startswith("/"):
                if root is not None and not (target == root or target.startswith(root.rstrip("/") + "/")):
                    raise _escape(path, root, via)
                done = []
            todo.extend([p for p in target.split("/") if p not in ("", ".")][::-1])
        return "/" + "/".join(done)

    def symlink(self, target: str, path: str) -> None:
        if self._exists(path):
            raise _os_error(path, "File exists", "EEXIST")
        self._check_parent(path, create=False)
        self.links[path] = target

    def info(self, path: str) -> FileInfo:
        name = posixpath.basename(path) or "/"
        if (target := self.links.get(path)) is not None:
            return FileInfo(path, name, "symlink", len(target.encode()), 0o777, time.time(), symlink_target=target)
        if (file := self.files.get(path)) is not None:
            return FileInfo(path=path, name=name, type="file", size=len(file.data), mode=file.mode, mtime=file.mtime)
        if (folder := self.dirs.get(path)) is not None:
            return FileInfo(path=path, name=name, type="dir", size=0, mode=folder.mode, mtime=folder.mtime)
        raise _not_found(path)

    def read(self, path: str) -> bytes:
        if path in self.dirs:
            raise _os_error(path, "Is a directory", "EISDIR")
        if (file := self.files.get(path)) is None:
            raise _not_found(path)
        return file.data

    def _check_parent(self, path: str, *, create: bool) -> None:
        """Ensure the parent directory of ``path`` exists, creating it (and its parents) when ``create``."""
        parent = posixpath.dirname(path)
        if parent in self.dirs:
            return
        if parent in self.files:
            raise _os_error(parent, "Not a directory", "ENOTDIR")
        if not create:
            raise _not_found(parent)
        self._check_parent(parent, create=True)
        self.dirs[parent] = _Dir(0o755, time.time())

    def write(self, path: str, data: bytes, *, mode: int | None = None, parents: bool = True) -> None:
        if path in self.dirs:
            raise _os_error(path, "Is a directory", "EISDIR")
        self._check_parent(path, create=parents)
        old = self.files.get(path)
        new_mode = mode if mode is not None else (old.mode if old is not None else 0o644)
        self.files[path] = _File(data, new_mode & 0o7777, time.time())

    def append(self, path: str, data: bytes) -> None:
        old = self.files.get(path)
        self.write(path, (old.data if old is not None else b"") + data)

    def touch(self, path: str) -> None:
        if (folder := self.dirs.get(path)) is not None:
            folder.mtime = time.time()
        elif (file := self.files.get(path)) is not None:
            file.mtime = time.time()
        else:
            self.write(path, b"", parents=False)

    def descendants(self, root: str) -> list[str]:
        """Every path strictly below ``root``."""
        return [p for p in [*self.dirs, *self.files, *self.links] if p != root and _is_under(p, root)]

    def listdir(self, path: str) -> list[FileInfo]:
        if path in self.files:
            raise _os_error(path, "Not a directory", "ENOTDIR")
        if path not in self.dirs:
            raise _not_found(path)
        children = [p for p in [*self.dirs, *self.files, *self.links] if p != path and posixpath.dirname(p) == path]
        return sorted((self.info(child) for child in children), key=lambda entry: entry.name)

    def delete(self, path: str, *, recursive: bool) -> None:
        if path in self.files:
            del self.files[path]
            return
        if path in self.links:
            del self.links[path]
            return
        if path not in self.dirs:
            raise _not_found(path)
        if path in _UNDELETABLE:
            raise _os_error(path, "Device or resource busy", "EBUSY")
        below = self.descendants(path)
        if below and not recursive:
            raise _os_error(path, "Directory not empty", "ENOTEMPTY")
        for p in [path, *below]:
            self.files.pop(p, None)
            self.dirs.pop(p, None)
            self.links.pop(p, None)

    def move(self, src: str, dst: str) -> None:
        """``rename(2)`` semantics, plus creating the parents of ``dst``; a symlink is moved, not followed."""
        if not self._exists(src):
            raise _not_found(src)
        if src == dst:
            return
        if src in _UNDELETABLE:
            raise _os_error(src, "Device or resource busy", "EBUSY")
        if src in self.dirs and _is_under(dst, src):
            raise _os_error(dst, "Invalid argument (cannot move a directory into itself)", "EINVAL")
        if src not in self.dirs and dst in self.dirs:
            raise _os_error(dst, "Is a directory", "EISDIR")
        if src in self.dirs and dst in self.files:
            raise _os_error(dst, "Not a directory", "ENOTDIR")
        if dst in self.dirs and self.descendants(dst):
            raise _os_error(dst, "Directory not empty", "ENOTEMPTY")
        self._check_parent(dst, create=True)
        self.dirs.pop(dst, None)
        self.files.pop(dst, None)
        self.links.pop(dst, None)
        for old in [src, *self.descendants(src)]:
            new = dst + old[len(src) :]
            if old in self.files:
                self.files[new] = self.files.pop(old)
            elif old in self.links:
                self.links[new] = self.links.pop(old)
            else:
                self.dirs[new] = self.dirs.pop(old)

    def chmod(self, path: str, mode: int) -> None:
        entry: _File | _Dir | None = self.files.get(path) or self.dirs.get(path)
        if entry is None:
            raise _not_found(path)
        entry.mode = mode & 0o7777

    def glob(self, pattern: str, root: str, limit: int) -> list[str]:
        full = pattern if pattern.startswith("/") else f"{root}/{pattern}"
        parts = [p for p in full.split("/") if p not in ("", ".")]
        literal = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))
        base = "/" + "/".join(parts[:literal])  # only paths below the literal prefix can match
        candidates = [base, *self.descendants(base)]
        return sorted(p for p in candidates if _glob_match(parts, p.split("/")[1:]) and self._exists(p))[:limit]

    def _exists(self, path: str) -> bool:
        return path in self.files or path in self.dirs or path in self.links

    def copy(self) -> FileSystem:
        """An independent copy: no later change to one is seen by the other (contents are immutable bytes)."""
        twin = FileSystem.__new__(FileSystem)
        twin.files = {path: _File(f.data, f.mode, f.mtime) for path, f in self.files.items()}
        twin.dirs = {path: _Dir(d.mode, d.mtime) for path, d in self.dirs.items()}
        twin.links = dict(self.links)
        return twin

    def size(self) -> int:
        """Bytes held: file contents plus symlink targets, what a copy of this file system costs."""
        return sum(len(f.data) for f in self.files.values()) + sum(len(t.encode()) for t in self.links.values())


def _glob_match(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Match path segments against pattern segments; ``**`` stands for any number of segments, including none."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_glob_match(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _glob_match(rest, parts[1:])
