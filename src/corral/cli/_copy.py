"""``corral workspaces cp``: tar streams both ways, with ``docker cp``'s rules for where things land.

Uploads tar the local path on the fly in a thread (a bounded queue between it and the HTTP body, so a 100 MB tree is
never held whole). Downloads are written by the workspace, so they are hostile. The stream is read once (``r|``) and
nothing is ever written, linked to or touched outside the copy:

1. Names: every name must lie under the one top-level entry asked for, have no empty, ``.`` or ``..`` part and pass
   :func:`tarfile.data_filter` (no absolute names, no devices, sane modes).
2. Files, hard links and directories are written as they come, never through a symlink: each directory on the way is
   opened from DEST with ``O_NOFOLLOW`` (the kernel refuses a symlink, ``ELOOP``), and an entry beneath a name that
   is a link of this archive is refused. A file is created ``O_EXCL | O_NOFOLLOW`` after unlinking whatever
   non-directory was there (never written through), its mode and times set on its descriptor; a directory entry
   whose name is a symlink or a file on disk is refused. A hard link may only name a regular file this copy wrote.
3. Symlinks are created last, after every file and directory, each only if its target, followed component by
   component from the link's directory as the kernel will, neither climbs above DEST nor ends outside the copy, and
   passes through no symlink (neither a link of this archive nor one on disk; the last component may be a link this
   copy created). A name is never created twice, so no later entry retargets a link. Since only such links are
   created from then on, the check stays true; still, each created link is then resolved with
   :func:`os.path.realpath` and removed if it leads out. Each refused entry is one ``warning:`` line.
4. Directory times are set at the end, on descriptors opened with ``O_NOFOLLOW`` (never through a symlink).

The client's memory does not depend on the archive: PAX / GNU long-name headers before one entry are refused past
1 MiB together (tarfile would read them whole), sparse files are refused, tarfile's list of entries is emptied after
each one, and what is remembered per name (for the rules above) is bounded at ``_MAX_TRACKED`` (128 MiB, counting
each name's length plus 128 bytes: about 700 000 entries), past which the download stops with a clear error.
"""

from __future__ import annotations

import errno
import os
import posixpath
import queue
import shutil
import stat
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Self

from corral.errors import InvalidRequestError, WorkspaceFileNotFoundError

if TYPE_CHECKING:
    from corral.client import Files

__all__ = ["WorkspacePath", "download", "parse_location", "upload"]

WORKSPACE_ROOT = "/workspace"
_CHUNK = 256 * 1024  # tar's write buffer: the size of the chunks sent
_QUEUED = 16  # chunks in flight between the tar thread and the HTTP body: at most 4 MiB
_DONE = object()

# Downloads: what a hostile archive may make this client hold (see _bounded_tarinfo and _Book).
_MAX_EXTENDED = 1024 * 1024  # bytes of PAX / GNU long-name headers before one entry, together
_MAX_EXTENDED_COUNT = 16  # and how many such headers
_EXTENDED = frozenset(
    {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK}
)
_MAX_NAME = 4096  # bytes in a name or link target (PATH_MAX: longer ones cannot be written anyway)
_MAX_TRACKED = 128 * 1024 * 1024  # bytes of names and link targets remembered per download, counted as _Book does
_OVERHEAD = 128  # what one remembered name costs beyond its characters (dict or set slot, str header), rounded up
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class WorkspacePath:
    """``ID:/path``: a path inside a workspace (relative ones start at /workspace)."""

    workspace_id: str
    path: str


def parse_location(value: str) -> WorkspacePath | str:
    """``ID:/path`` as a :class:`WorkspacePath`; anything else is a local path. A local path with a colon can be
    written ``./a:b``, as with ``docker cp``."""
    head, sep, tail = value.partition(":")
    if not sep or not head or "/" in head or head.startswith("."):
        return value
    path = tail or "."
    absolute = posixpath.normpath(path if path.startswith("/") else posixpath.join(WORKSPACE_ROOT, path))
    # A trailing slash says "a directory" (docker cp's rule), which normpath would drop.
    return WorkspacePath(head, absolute + "/" if path.endswith("/") and absolute != "/" else absolute)


# --- upload -----------------------------------------------------------------------------------------------------


class _QueueWriter:
    """A write-only file object feeding a bounded queue; ``write`` blocks while the queue is full."""

    def __init__(self, chunks: queue.Queue[object], stop: threading.Event) -> None:
        self._chunks = chunks
        self._stop = stop

    def write(self, data: bytes) -> int:
        while True:
            if self._stop.is_set():
                raise BrokenPipeError("the upload was abandoned")
            try:
                self._chunks.put(bytes(data), timeout=0.5)
            except queue.Full:
                continue
            return len(data)

    def flush(self) -> None:
        """Nothing to flush: every write is queued at once."""


def _tar_stream(source: Path, arcname: str) -> Iterator[bytes]:
    """The tar of ``source`` (symlinks kept as links), produced in a thread as the consumer takes it."""
    chunks: queue.Queue[object] = queue.Queue(maxsize=_QUEUED)
    stop = threading.Event()

    def produce() -> None:
        try:
            writer = _QueueWriter(chunks, stop)
            with tarfile.open(fileobj=writer, mode="w|", bufsize=_CHUNK, format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                tar.add(source, arcname=arcname, recursive=True)
        except BaseException as exc:  # handed to the consumer, which raises it
            _put(chunks, stop, exc)
        else:
            _put(chunks, stop, _DONE)

    thread = threading.Thread(target=produce, name="corral-cp-tar", daemon=True)
    thread.start()
    try:
        while True:
            item = chunks.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, bytes)
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def _put(chunks: queue.Queue[object], stop: threading.Event, item: object) -> None:
    while not stop.is_set():
        try:
            chunks.put(item, timeout=0.5)
        except queue.Full:
            continue
        return


def upload(files: Files, source: Path, target: str) -> str:
    """Copy a local file or directory into the workspace as ``docker cp`` does; returns where it landed.

    ``target`` an existing directory: the source goes inside it under its own name. Otherwise the source becomes
    ``target`` (a directory's content goes into a new directory of that name; missing parents are created).

    Raises:
        FileNotFoundError: ``source`` does not exist.
        InvalidRequestError: a directory onto an existing file.
    """
    if not os.path.lexists(source):
        raise FileNotFoundError(f"{source}: no such file or directory")
    name = Path(os.path.abspath(source)).name
    if not name:
        raise InvalidRequestError(f"{source}: cannot copy the root directory")
    try:
        kind: str | None = files.stat(target).type
    except WorkspaceFileNotFoundError:
        kind = None
    if kind in ("dir", "symlink") or (kind is None and target.endswith("/")):
        into, arcname = target, name
    elif kind is not None and source.is_dir() and not source.is_symlink():
        raise InvalidRequestError(f"{target}: cannot copy a directory onto a file")
    else:
        into, arcname = posixpath.dirname(target.rstrip("/")) or WORKSPACE_ROOT, posixpath.basename(target)
    files.upload_archive(into, _tar_stream(source, arcname))
    return posixpath.join(into, arcname)


# --- download ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where a download's entries go.

    ``root`` is the only directory written in; ``tree`` is the copy within it (``""``: ``root`` itself), inside
    which every link must lead; ``rename`` maps an archive name to its name under ``root`` (``None``: not part of
    the copy; ``""``: the top directory, which is the new target itself).
    """

    root: Path
    tree: str
    rename: Callable[[str], str | None]
    single_file: bool


def _plan(target: Path, top: str, first: tarfile.TarInfo) -> _Plan:
    top_is_dir = first.isdir() or first.name.rstrip("/") != top
    if target.is_dir():  # the copy goes inside, under its own name
        inside = top if top_is_dir else ""
        return _Plan(target, inside, lambda n: n if n == top or n.startswith(top + "/") else None, not top_is_dir)
    if top_is_dir:
        if os.path.lexists(target):
            raise InvalidRequestError(f"{target}: cannot copy a directory onto a file")
        if not target.parent.is_dir():
            raise FileNotFoundError(f"{target.parent}: no such directory")
        target.mkdir()
        return _Plan(
            target, "", lambda n: "" if n == top else n[len(top) + 1 :] if n.startswith(top + "/") else None, False
        )
    if not target.parent.is_dir():
        raise FileNotFoundError(f"{target.parent}: no such directory")
    return _Plan(target.parent, "", lambda n: target.name if n == top else None, True)


def _bounded_tarinfo() -> type[tarfile.TarInfo]:
    """A :class:`tarfile.TarInfo` class for one archive that refuses what tarfile would hold in memory whole.

    tarfile reads a PAX or GNU long-name header (and a chain of them before one entry) into memory at once, and the
    extension blocks of a GNU sparse file into a list without end. This class counts the extended headers since the
    last real entry and refuses more than ``_MAX_EXTENDED`` bytes or ``_MAX_EXTENDED_COUNT`` of them, and refuses
    sparse files, before any of it is read.
    """
    since_entry = [0, 0]  # bytes and number of extended headers read since the last real entry

    class Bounded(tarfile.TarInfo):
        @classmethod
        def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
            info = super().frombuf(buf, encoding, errors)
            if info.type in _EXTENDED:
                since_entry[0] += info.size
                since_entry[1] += 1
                if since_entry[0] > _MAX_EXTENDED or since_entry[1] > _MAX_EXTENDED_COUNT:
                    raise InvalidRequestError(
                        f"the workspace sent tar extended headers (PAX or GNU long names) of {since_entry[0]} bytes "
                        f"in {since_entry[1]} headers before one entry; at most {_MAX_EXTENDED} bytes in "
                        f"{_MAX_EXTENDED_COUNT} headers are accepted"
                    )
            else:
                since_entry[0] = since_entry[1] = 0
            if info.type == tarfile.GNUTYPE_SPARSE:
                raise InvalidRequestError(f"{info.name}: the workspace sent a GNU sparse file, which cp does not read")
            return info

        def _proc_gnusparse_10(self, *_: object) -> None:  # tarfile's hook for PAX sparse 1.0, whose map is unbounded
            raise InvalidRequestError(f"{self.name}: the workspace sent a PAX sparse file, which cp does not read")

    return Bounded


class _Book:
    """What one download remembers about the names it has seen, bounded: each name or link target counts its
    length plus ``_OVERHEAD`` bytes, and past ``_MAX_TRACKED`` bytes in all the download stops."""

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}  # name -> "dir" | "file" | "link": written now, or a link to create later
        self.dirs: list[tuple[str, float]] = []  # directories written, with the time they get at the end
        self.links: list[tuple[str, str, str]] = []  # (name, target, archive name) of the links to create last
        self.created: set[str] = set()  # links created so far
        self._size = 0

    def note(self, *texts: str) -> None:
        self._size += sum(len(t) + _OVERHEAD for t in texts)
        if self._size > _MAX_TRACKED:
            raise InvalidRequestError(
                f"the workspace sent an archive with more entries than cp keeps track of (names of about "
                f"{_MAX_TRACKED // 2**20} MiB in all); copy its subdirectories one by one"
            )


def _walk(root_fd: int, parts: list[str], *, create: bool) -> int:
    """A descriptor of the directory ``parts`` beneath ``root_fd``, opened one component at a time with
    ``O_NOFOLLOW``: the kernel refuses a symlink anywhere on the way (``ELOOP``), a file gives ``ENOTDIR``.
    Missing directories are made when ``create``."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                step = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o777, dir_fd=fd)
                step = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _place(  # noqa: PLR0911 - one return per reason
    tar: tarfile.TarFile, entry: tarfile.TarInfo, plan: _Plan, book: _Book, root_fd: int
) -> bool | str:
    """Write one entry (a symlink is only noted, to be created last); whether it counts as written, or why it is
    refused."""
    name = plan.rename(entry.name.rstrip("/"))
    if name is None:
        return "not inside the path asked for"
    if name == "":  # the top directory itself, copied onto the new target
        return False
    problem = _refusal(entry, name, book)
    if problem:
        return problem
    if entry.issym():
        book.note(name, entry.linkname, entry.name)
        book.kinds[name] = "link"
        book.links.append((name, entry.linkname, entry.name))
        return False
    linkname = entry.linkname
    if entry.islnk():  # a hard link names its target by archive name: renamed alike
        linkname = plan.rename(entry.linkname.rstrip("/")) or ""
        if book.kinds.get(linkname) != "file":
            return "a hard link to something other than a file of this copy"
    try:
        safe = tarfile.data_filter(entry.replace(name=name, linkname=linkname, deep=False), str(plan.root))
    except tarfile.FilterError as exc:
        return str(exc)
    try:
        parent = _walk(root_fd, name.split("/")[:-1], create=True)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return "it lies beneath a symlink or a file"
        raise
    try:
        return _write(tar, entry, safe, parent, root_fd=root_fd, book=book)
    finally:
        os.close(parent)


def _refusal(entry: tarfile.TarInfo, name: str, book: _Book) -> str | None:  # noqa: PLR0911 - one return per reason
    """Why an entry renamed ``name`` is refused by its name alone (and what came before it), if it is."""
    if len(os.fsencode(name)) > _MAX_NAME:
        return f"its name is longer than {_MAX_NAME} bytes"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "its name has an empty, '.' or '..' part"
    if any(book.kinds.get("/".join(parts[:depth])) == "link" for depth in range(1, len(parts))):
        return "it lies beneath a symlink"
    earlier = book.kinds.get(name)
    if entry.issym():
        if earlier is not None:  # never re-created, so never retargeted
            return f"a {earlier} of that name came earlier in the archive"
        if not entry.linkname or len(os.fsencode(entry.linkname)) > _MAX_NAME:
            return f"its target is empty or longer than {_MAX_NAME} bytes"
    elif earlier == "link":
        return "a link of that name came earlier in the archive"
    return None


def _write(
    tar: tarfile.TarFile, entry: tarfile.TarInfo, safe: tarfile.TarInfo, parent: int, *, root_fd: int, book: _Book
) -> bool | str:
    """Write one file, hard link or directory named ``safe.name`` in the directory ``parent``."""
    base = safe.name.rsplit("/", 1)[-1]
    there = _lstat(base, parent)
    if safe.isdir():
        if there is not None and not stat.S_ISDIR(there.st_mode):  # a symlink is never entered, nor its times set
            return "a symlink is already there" if stat.S_ISLNK(there.st_mode) else "a file is already there"
        if there is None:
            os.mkdir(base, 0o777, dir_fd=parent)
        if safe.name not in book.kinds:
            book.note(safe.name)
            book.kinds[safe.name] = "dir"
            book.dirs.append((safe.name, safe.mtime))
        return True
    if there is not None:  # a file or hard link replaces what is there, never writes through it
        if stat.S_ISDIR(there.st_mode):
            return "a directory is already there"
        os.unlink(base, dir_fd=parent)
    if safe.islnk():  # to a regular file this copy wrote (checked by the caller); its times and mode are the file's
        source = safe.linkname.split("/")
        source_dir = _walk(root_fd, source[:-1], create=False)
        try:
            os.link(source[-1], base, src_dir_fd=source_dir, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(source_dir)
        if safe.name not in book.kinds:
            book.note(safe.name)
            book.kinds[safe.name] = "file"
        return True
    fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
    with os.fdopen(fd, "wb") as out:
        data = tar.extractfile(entry)
        if data is not None:
            shutil.copyfileobj(data, out, _CHUNK)
        out.flush()
        os.fchmod(fd, safe.mode)
        os.utime(fd, (safe.mtime, safe.mtime))
    if safe.name not in book.kinds:
        book.note(safe.name)
        book.kinds[safe.name] = "file"
    return True


def _link(root_fd: int, plan: _Plan, book: _Book, name: str, target: str) -> bool | str:  # noqa: PLR0911 - one return per reason
    """Create one symlink of the archive, after every file and directory; whether it was, or why it is refused.

    Its target is followed as the kernel will follow it, one component at a time from the link's directory: it must
    not climb above ``plan.root``, must end inside ``plan.tree``, and must pass through no symlink. A component on
    the way may be neither a link of this archive (created or still to come) nor a symlink on disk; the last one
    may be a link this copy already created (itself checked so), never some other symlink on disk. Since nothing but
    these links is created from here on, what was checked stays true.
    """
    if target.startswith("/"):
        return "its target is an absolute path"
    here = name.split("/")[:-1]
    steps = [step for step in target.split("/") if step not in ("", ".")]
    for index, step in enumerate(steps):
        if step == "..":
            if not here:
                return "its target leads outside the copy"
            here.pop()
            continue
        here.append(step)
        path = "/".join(here)
        last = index == len(steps) - 1
        if last and path in book.created:
            continue
        if (book.kinds.get(path) == "link" and not last) or _is_symlink(root_fd, path):
            return "its target passes through a symlink"
    tree = plan.tree.split("/") if plan.tree else []
    if here[: len(tree)] != tree:
        return "its target leads outside the copy"
    parts = name.split("/")
    try:
        parent = _walk(root_fd, parts[:-1], create=True)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return "it lies beneath a symlink or a file"
        raise
    try:
        there = _lstat(parts[-1], parent)
        if there is not None:
            if stat.S_ISDIR(there.st_mode):
                return "a directory is already there"
            os.unlink(parts[-1], dir_fd=parent)  # something from before this copy: replaced, as docker cp does
        os.symlink(target, parts[-1], dir_fd=parent)
    finally:
        os.close(parent)
    book.created.add(name)
    return True


def _is_symlink(root_fd: int, path: str) -> bool:
    """Whether ``path`` beneath ``root_fd`` is a symlink; its ancestors were checked not to be (so none is followed)."""
    there = _lstat(path, root_fd)
    return there is not None and stat.S_ISLNK(there.st_mode)


def _unlink_escaped(root_fd: int, plan: _Plan, book: _Book, warn: Callable[[str], None]) -> int:
    """The last check, independent of the reasoning in :func:`_link`: every link created is resolved with
    :func:`os.path.realpath` and removed if it leads outside the copy. Returns how many were removed."""
    tree = os.path.realpath(plan.root / plan.tree)
    removed = 0
    for name in sorted(book.created):
        real = os.path.realpath(plan.root / name)
        if real == tree or real.startswith(tree.rstrip("/") + "/"):
            continue
        parts = name.split("/")
        parent = _walk(root_fd, parts[:-1], create=False)
        try:
            os.unlink(parts[-1], dir_fd=parent)
        finally:
            os.close(parent)
        warn(f"skipped {name!r}: its target leads outside the copy")
        removed += 1
    return removed


def _set_directory_times(root_fd: int, book: _Book) -> None:
    """Give directories their times last (writing in them changed them), opened with ``O_NOFOLLOW`` all the way."""
    for name, mtime in reversed(book.dirs):
        try:
            fd = _walk(root_fd, name.split("/"), create=False)
        except OSError:
            continue  # gone or replaced since: not ours to touch
        try:
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)


def extract(stream: IO[bytes], target: Path, top: str, warn: Callable[[str], None]) -> int:
    """Unpack a hostile tar stream whose one top-level entry should be ``top`` (see the module docstring).

    Returns:
        The number of entries written; refused entries are reported through ``warn`` and skipped.

    Raises:
        InvalidRequestError: an empty archive, extended headers over their bound, a sparse file, or more entries
            than the bookkeeping bound.
    """
    with tarfile.open(fileobj=stream, mode="r|", tarinfo=_bounded_tarinfo()) as tar:
        entry = tar.next()
        if entry is None:
            raise InvalidRequestError("the workspace sent an empty archive")
        plan = _plan(target, top, entry)
        book = _Book()
        written = 0
        root_fd = os.open(plan.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            first = True
            while entry is not None:
                # tarfile keeps every entry for random access: a stream read once needs none of them.
                tar.members.clear()  # type: ignore[attr-defined]
                if plan.single_file and not first:
                    warn(f"skipped {entry.name!r}: a file's archive has one entry")
                else:
                    outcome = _place(tar, entry, plan, book, root_fd)
                    if isinstance(outcome, str):
                        warn(f"skipped {entry.name!r}: {outcome}")
                    written += outcome is True
                first = False
                entry = tar.next()
            for name, link_target, archive_name in book.links:
                outcome = _link(root_fd, plan, book, name, link_target)
                if isinstance(outcome, str):
                    warn(f"skipped {archive_name!r}: {outcome}")
                written += outcome is True
            written -= _unlink_escaped(root_fd, plan, book, warn)
            _set_directory_times(root_fd, book)
        finally:
            os.close(root_fd)
    return written


def download(files: Files, source: str, target: Path, warn: Callable[[str], None]) -> int:
    """Copy a file or directory of the workspace to ``target`` as ``docker cp`` does; returns the entries written.

    ``target`` an existing directory: the copy goes inside it under its own name; otherwise it becomes ``target``.
    The archive streams through a pipe from a download thread into :func:`extract`.

    Raises:
        WorkspaceFileNotFoundError: nothing at ``source``.
    """
    top = posixpath.basename(source.rstrip("/")) or "workspace"
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def fetch() -> None:
        with os.fdopen(write_fd, "wb", buffering=0) as pipe:
            try:
                files.download_archive(source, pipe)
            except BaseException as exc:  # raised by the caller, ahead of what extraction saw
                failure.append(exc)

    thread = threading.Thread(target=fetch, name="corral-cp-download", daemon=True)
    thread.start()
    pipe = os.fdopen(read_fd, "rb")
    try:
        count = extract(pipe, target, top, warn)
    except BaseException:
        _finish(pipe, thread, failure, cause=True)
        raise
    _finish(pipe, thread, failure, cause=False)
    return count


def _finish(pipe: IO[bytes], thread: threading.Thread, failure: list[BaseException], *, cause: bool) -> None:
    """Close our end of the pipe (a download thread still writing then stops) and raise the download's failure.

    A broken pipe is ours (we stopped reading: a complete archive's padding, or our own error), never the cause."""
    pipe.close()
    thread.join()
    real = [f for f in failure if not isinstance(f, BrokenPipeError)]
    if real and cause:  # the download failed: that is the cause, not the cut archive it left
        raise real[0] from None
    if real:
        raise real[0]
