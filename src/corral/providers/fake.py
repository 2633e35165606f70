"""An in-memory provider: the test double for the layers above providers (orchestrator, API).

Nothing leaves the process: a workspace is a dict of files and a dict of directories, and ``exec`` runs a tiny
deterministic interpreter that understands just enough ``/bin/sh`` for the conformance suite and for unit tests:

* statements joined by ``;``, newlines, ``&&`` and ``||``; ``#`` comments;
* single and double quotes, backslash escapes, ``$VAR``, ``${VAR}`` and ``$?`` (shell mode only);
* redirects ``>&2``, ``1>&2``, ``2>&1``, ``> FILE``, ``>> FILE``, ``2> FILE`` (``/dev/null`` discards);
* the commands ``echo [-n]``, ``printf`` (``%s``, ``%d``, ``%%``, ``\\n``, ``\\t``), ``exit N``, ``true``,
  ``false``, ``:``, ``sleep N`` (a real ``asyncio.sleep``), ``cat FILE...``, ``touch FILE...``, ``pwd``, ``cd DIR``,
  ``ln -s TARGET LINK`` and ``sh -c SCRIPT``. Anything else exits 127 with ``sh: 1: NAME: not found``; pipes,
  subshells, background jobs and command substitution exit 2 with a syntax error rather than doing something
  surprising.

In argv mode ``argv[0]`` names one of those commands and the rest are literal arguments: nothing is parsed or
expanded, exactly as with a real ``execve``. Output is streamed after every statement, so ``echo a; sleep 1; echo b``
yields ``a`` a second before ``b``. Symlinks are modelled: every path is resolved the way the kernel does (``..`` is
collapsed lexically first), and file calls given ``beneath`` refuse paths and symlinks that lead outside it.

Failure injection for tests: set :attr:`FakeProvider.fail_create`, :attr:`FakeProvider.healthy` /
:attr:`FakeProvider.health_error` and :attr:`FakeProvider.create_delay_s`; :attr:`FakeProvider.calls` records every
call as ``(method, workspace_id)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import posixpath
import re
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Literal

from corral.errors import (
    ExecTimeoutError,
    FileOperationError,
    InvalidRequestError,
    ProviderUnavailableError,
    SandboxNotFoundError,
    WorkspaceFileNotFoundError,
    WorkspaceStateError,
)
from corral.providers.base import (
    WORKSPACE_ROOT,
    Capabilities,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecRequest,
    ExecResult,
    FileInfo,
    Health,
    SandboxState,
    WorkspaceSpec,
    check_path,
    escape_error,
)

__all__ = ["CHUNK_SIZE", "FakeProvider"]

CHUNK_SIZE = 64 * 1024
"""Size of the chunks ``read_file`` yields and of the output chunks of ``cat``."""

_TMP = "/tmp"  # noqa: S108 - the sandbox's own /tmp, which the fake keeps in memory
_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
_UNDELETABLE = frozenset({"/", WORKSPACE_ROOT, _TMP})  # mount points: a real rm fails with EBUSY
_KILLED_EXIT_CODE = 137  # 128 + SIGKILL, what a runtime reports for a process killed by stop or destroy
_MAX_SYMLINK_HOPS = 40  # Linux's limit


# --- the file system ----------------------------------------------------------------------------------------------


def _normalize(path: str, cwd: str = WORKSPACE_ROOT) -> str:
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


def _as(info: FileInfo, path: str) -> FileInfo:
    """``info`` reported under ``path``, the path as given (symlinks on the way may have led elsewhere)."""
    return replace(info, path=path, name=posixpath.basename(path) or "/")


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


class _FileSystem:
    """Files and directories keyed by normalised absolute path. Every method takes normalised paths."""

    def __init__(self) -> None:
        now = time.time()
        self.files: dict[str, _File] = {}
        self.dirs: dict[str, _Dir] = {"/": _Dir(0o755, now), WORKSPACE_ROOT: _Dir(0o755, now), _TMP: _Dir(0o1777, now)}
        self.links: dict[str, str] = {}  # symlink path -> target, as given to ``ln -s``

    def resolve(self, path: str, *, follow: bool = True, beneath: str | None = None) -> str:
        """``path`` with its symlinks resolved: every directory on the way, and the last component with ``follow``.

        Missing components are kept as they are. With ``beneath``, a path, symlink or ``..`` leading outside that
        directory raises InvalidRequestError, as the agent of the real providers does.
        """
        root = None if beneath is None else _normalize(beneath)
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


def _glob_match(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Match path segments against pattern segments; ``**`` stands for any number of segments, including none."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_glob_match(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _glob_match(rest, parts[1:])


# --- the shell ----------------------------------------------------------------------------------------------------


class _ShellSyntaxError(Exception):
    """The script uses syntax the fake shell does not understand."""


class _Exit(Exception):
    """``exit N`` ends the script: control flow, not an error."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Killed(Exception):
    """The workspace was stopped or destroyed while the command ran."""


@dataclass(frozen=True, slots=True)
class _Seg:
    """Part of a word: literal text, or (``var``) the name of a variable to expand."""

    text: str
    quoted: bool = False
    var: bool = False


@dataclass(frozen=True, slots=True)
class _Word:
    segs: tuple[_Seg, ...]


@dataclass(frozen=True, slots=True)
class _Redirect:
    fd: int
    dup: int | None = None
    target: _Word | None = None
    append: bool = False


@dataclass(frozen=True, slots=True)
class _Command:
    words: tuple[_Word, ...]
    redirects: tuple[_Redirect, ...]


_Token = _Word | _Redirect | str
_AndOr = tuple[tuple[str, _Command], ...]  # (operator joining it to the previous command: "", "&&" or "||", command)

_META = " \t\n;&|<>()`"
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IFS_RE = re.compile(r"[ \t\n]+")
_DOUBLE_QUOTE_ESCAPES = '$`"\\'


def _read_var(script: str, i: int, *, quoted: bool) -> tuple[_Seg, int]:
    """Read what follows a ``$`` at ``script[i]``."""
    if script.startswith("(", i):
        raise _ShellSyntaxError("command substitution $(...) is not supported by the fake shell")
    if script.startswith("?", i):
        return _Seg("?", quoted, var=True), i + 1
    if script.startswith("{", i):
        end = script.find("}", i)
        name = script[i + 1 : end] if end != -1 else ""
        if not _NAME_RE.fullmatch(name):
            raise _ShellSyntaxError(f"${{{name}: bad substitution")
        return _Seg(name, quoted, var=True), end + 1
    if m := _NAME_RE.match(script, i):
        return _Seg(m.group(), quoted, var=True), m.end()
    return _Seg("$", quoted), i


def _read_double_quoted(script: str, i: int, segs: list[_Seg]) -> int:
    """Append the parts of a double-quoted string starting after its ``"`` to ``segs``; return the end."""
    segs.append(_Seg("", quoted=True))  # so that "" is an empty argument, not nothing
    while i < len(script):
        c = script[i]
        if c == '"':
            return i + 1
        if c == "`":
            raise _ShellSyntaxError("command substitution `...` is not supported by the fake shell")
        if c == "\\" and script[i + 1 : i + 2] in tuple(_DOUBLE_QUOTE_ESCAPES):
            segs.append(_Seg(script[i + 1], quoted=True))
            i += 2
        elif c == "$":
            seg, i = _read_var(script, i + 1, quoted=True)
            segs.append(seg)
        else:
            segs.append(_Seg(c, quoted=True))
            i += 1
    raise _ShellSyntaxError("Unterminated quoted string")


def _read_word(script: str, i: int) -> tuple[_Word, int]:
    segs: list[_Seg] = []
    n = len(script)
    while i < n and script[i] not in _META:
        c = script[i]
        if c == "'":
            end = script.find("'", i + 1)
            if end == -1:
                raise _ShellSyntaxError("Unterminated quoted string")
            segs.append(_Seg(script[i + 1 : end], quoted=True))
            i = end + 1
        elif c == '"':
            i = _read_double_quoted(script, i + 1, segs)
        elif c == "\\":
            if script.startswith("\n", i + 1):  # line continuation
                i += 2
            else:
                segs.append(_Seg(script[i + 1 : i + 2] or "\\", quoted=True))
                i += 2
        elif c == "$":
            seg, i = _read_var(script, i + 1, quoted=False)
            segs.append(seg)
        else:
            segs.append(_Seg(c))
            i += 1
    return _Word(tuple(segs)), i


def _tokenize(script: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(script)
    while i < n:
        c = script[i]
        if c in " \t":
            i += 1
        elif c == "#":
            end = script.find("\n", i)
            i = n if end == -1 else end
        elif c in ";\n":
            tokens.append(c)
            i += 1
        elif script.startswith(("&&", "||"), i):
            tokens.append(script[i : i + 2])
            i += 2
        elif c == ">" or (c in "12" and script.startswith(">", i + 1)):
            fd = 1 if c == ">" else int(c)
            i += 1 if c == ">" else 2
            append = script.startswith(">", i)
            i += append
            if script.startswith("&", i):
                if i + 1 >= n or script[i + 1] not in "12":
                    raise _ShellSyntaxError("only >&1 and >&2 are supported by the fake shell")
                tokens.append(_Redirect(fd, dup=int(script[i + 1])))
                i += 2
                continue
            while i < n and script[i] in " \t":
                i += 1
            target, i = _read_word(script, i)
            if not target.segs:
                raise _ShellSyntaxError("redirection unexpected")
            tokens.append(_Redirect(fd, target=target, append=append))
        elif c in _META:
            raise _ShellSyntaxError(f'"{c}" is not supported by the fake shell')
        else:
            word, i = _read_word(script, i)
            tokens.append(word)
    return tokens


def _parse(script: str) -> list[_AndOr]:
    """Split a script into and-or lists of simple commands."""
    program: list[_AndOr] = []
    and_or: list[tuple[str, _Command]] = []
    words: list[_Word] = []
    redirects: list[_Redirect] = []
    pending_op = ""
    for item in [*_tokenize(script), None]:  # None marks the end of the script
        if isinstance(item, _Word):
            words.append(item)
            continue
        if isinstance(item, _Redirect):
            redirects.append(item)
            continue
        if words or redirects:
            and_or.append((pending_op, _Command(tuple(words), tuple(redirects))))
            words, redirects, pending_op = [], [], ""
        elif pending_op:
            if item == "\n":
                continue  # `a &&` may go on on the next line
            raise _ShellSyntaxError("end of file unexpected" if item is None else f'"{item}" unexpected')
        elif item in (";", "&&", "||"):
            raise _ShellSyntaxError(f'"{item}" unexpected')
        if item in ("&&", "||"):
            pending_op = item
        elif and_or:
            program.append(tuple(and_or))
            and_or = []
    return program


@dataclass(frozen=True, slots=True)
class _Sink:
    """Where a file descriptor goes: an output stream, a file, or nowhere."""

    stream: Literal["stdout", "stderr"] | None = None
    path: str | None = None


_STDOUT = _Sink(stream="stdout")
_STDERR = _Sink(stream="stderr")
_NULL = _Sink()

_PRINTF_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


class _Shell:
    """Runs one command line; output goes to ``pending`` until the caller flushes it."""

    def __init__(
        self,
        fs: _FileSystem,
        *,
        env: dict[str, str],
        cwd: str,
        halt: asyncio.Event,
        pending: list[ExecOutput],
        sinks: dict[int, _Sink] | None = None,
    ) -> None:
        self.fs = fs
        self.env = env
        self.cwd = cwd
        self.halt = halt
        self.pending = pending
        self.sinks = dict(sinks) if sinks is not None else {1: _STDOUT, 2: _STDERR}
        self.status = 0
        self.commands: dict[str, Callable[[list[str]], Awaitable[int]]] = {
            "echo": self._echo,
            "printf": self._printf,
            "exit": self._exit,
            "true": self._true,
            ":": self._true,
            "false": self._false,
            "sleep": self._sleep,
            "cat": self._cat,
            "touch": self._touch,
            "pwd": self._pwd,
            "cd": self._cd,
            "ln": self._ln,
            "sh": self._sh,
        }

    # -- running --------------------------------------------------------------------------------------------------

    async def steps(self, script: str) -> AsyncIterator[None]:
        """Run a script, pausing after every command so its output can be flushed. ``status`` holds the result."""
        try:
            program = _parse(script)
        except _ShellSyntaxError as exc:
            self.write(2, f"sh: 1: Syntax error: {exc}\n".encode())
            self.status = 2
            return
        try:
            for and_or in program:
                for op, command in and_or:
                    if (op == "&&" and self.status != 0) or (op == "||" and self.status == 0):
                        continue
                    self.status = await self.run_command(command)
                    yield
        except _Exit as exc:
            self.status = exc.code

    async def run_command(self, command: _Command) -> int:
        if self.halt.is_set():
            raise _Killed
        fields = [f for word in command.words for f in self._expand(word)]
        saved = dict(self.sinks)
        try:
            for redirect in command.redirects:
                if (error := self._redirect(redirect)) is not None:
                    self.write(2, f"sh: 1: {error}\n".encode())
                    return 2
            return await self.run_program(fields, not_found="sh: 1: {}: not found") if fields else 0
        finally:
            self.sinks = saved

    async def run_program(self, argv: list[str], *, not_found: str) -> int:
        """Run one command with literal arguments; ``not_found`` formats the message for an unknown one."""
        program = self.commands.get(posixpath.basename(argv[0]))
        if program is None:
            self.write(2, (not_found.format(argv[0]) + "\n").encode())
            return 127
        return await program(argv[1:])

    def _expand(self, word: _Word) -> list[str]:
        """Expand variables; unquoted expansions are split on whitespace like ``sh`` does."""
        fields: list[str] = []
        current: str | None = None
        for seg in word.segs:
            if not seg.var:
                current = (current or "") + seg.text
                continue
            value = str(self.status) if seg.text == "?" else self.env.get(seg.text, "")
            if seg.quoted:
                current = (current or "") + value
                continue
            for k, piece in enumerate(_IFS_RE.split(value)):
                if k > 0 and current is not None:
                    fields.append(current)
                    current = None
                if piece:
                    current = (current or "") + piece
        if current is not None:
            fields.append(current)
        return fields

    def _redirect(self, redirect: _Redirect) -> str | None:
        """Apply one redirect to ``sinks``; return an error message if it cannot be done."""
        if redirect.dup is not None:
            self.sinks[redirect.fd] = self.sinks[redirect.dup]
            return None
        assert redirect.target is not None
        targets = self._expand(redirect.target)
        if len(targets) != 1:
            return f"{''.join(targets) or '${...}'}: ambiguous redirect"
        target = targets[0]
        if target == "/dev/null":
            self.sinks[redirect.fd] = _NULL
            return None
        try:
            path = self._real(target)
            if not redirect.append or path not in self.fs.files:
                self.fs.write(path, b"", parents=False)
        except FileOperationError as exc:
            reason = "Directory nonexistent" if isinstance(exc, WorkspaceFileNotFoundError) else exc.message
            return f"cannot create {target}: {reason.rpartition(': ')[2]}"
        self.sinks[redirect.fd] = _Sink(path=path)
        return None

    def write(self, fd: int, data: bytes) -> None:
        sink = self.sinks[fd]
        if sink.path is not None:
            # If the file vanished meanwhile, a real process would go on writing to the unlinked inode.
            with contextlib.suppress(FileOperationError):
                self.fs.append(sink.path, data)
        elif sink.stream is not None:
            self.pending.extend(
                ExecOutput(sink.stream, data[i : i + CHUNK_SIZE]) for i in range(0, len(data), CHUNK_SIZE)
            )

    def _error(self, message: str) -> None:
        self.write(2, f"{message}\n".encode())

    def _real(self, arg: str) -> str:
        """The path an argument names, relative to the working directory, with its symlinks followed."""
        return self.fs.resolve(_normalize(arg, self.cwd))

    # -- commands -------------------------------------------------------------------------------------------------

    async def _echo(self, args: list[str]) -> int:
        newline = not args or args[0] != "-n"
        words = args if newline else args[1:]
        self.write(1, (" ".join(words) + ("\n" if newline else "")).encode())
        return 0

    async def _printf(self, args: list[str]) -> int:
        if not args:
            self._error("printf: usage: printf format [arg ...]")
            return 2
        fmt, values, status = args[0], list(args[1:]), 0
        out: list[str] = []
        while True:
            consumed, i = False, 0
            while i < len(fmt):
                c, nxt = fmt[i], fmt[i + 1 : i + 2]
                if c == "\\" and nxt:
                    out.append(_PRINTF_ESCAPES.get(nxt, c + nxt))
                    i += 2
                elif c == "%" and nxt in ("s", "d"):
                    value = values.pop(0) if values else ""
                    consumed = True
                    if nxt == "d":
                        try:
                            value = str(int(value or "0"))
                        except ValueError:
                            self._error(f"printf: {value}: expected numeric value")
                            value, status = "0", 1
                    out.append(value)
                    i += 2
                elif c == "%" and nxt == "%":
                    out.append("%")
                    i += 2
                else:
                    out.append(c)
                    i += 1
            if not values or not consumed:
                break
        self.write(1, "".join(out).encode())
        return status

    async def _exit(self, args: list[str]) -> int:
        if not args:
            raise _Exit(self.status)
        try:
            code = int(args[0])
        except ValueError:
            self._error(f"sh: 1: exit: Illegal number: {args[0]}")
            raise _Exit(2) from None
        raise _Exit(code & 0xFF)

    async def _true(self, args: list[str]) -> int:
        return 0

    async def _false(self, args: list[str]) -> int:
        return 1

    async def _sleep(self, args: list[str]) -> int:
        total = 0.0
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        for arg in args:
            number, factor = (arg[:-1], units[arg[-1]]) if arg[-1:] in units else (arg, 1)
            try:
                seconds = float(number) * factor
            except ValueError:
                seconds = math.nan
            if not math.isfinite(seconds) or seconds < 0:
                self._error(f"sleep: invalid time interval '{arg}'")
                return 1
            total += seconds
        if not args:
            self._error("sleep: missing operand")
            return 1
        try:
            async with asyncio.timeout(total):
                await self.halt.wait()
        except TimeoutError:
            return 0  # slept the whole time
        raise _Killed

    async def _cat(self, args: list[str]) -> int:
        status = 0
        for arg in args:
            if arg == "-":
                continue  # there is no stdin: reading it gives nothing
            try:
                self.write(1, self.fs.read(self._real(arg)))
            except FileOperationError as exc:
                self._error(f"cat: {arg}: {exc.message.rpartition(': ')[2]}")
                status = 1
        return status

    async def _touch(self, args: list[str]) -> int:
        status = 0
        for arg in args:
            try:
                self.fs.touch(self._real(arg))
            except FileOperationError as exc:
                self._error(f"touch: cannot touch '{arg}': {exc.message.rpartition(': ')[2]}")
                status = 1
        return status

    async def _pwd(self, args: list[str]) -> int:
        self.write(1, f"{self.cwd}\n".encode())
        return 0

    async def _cd(self, args: list[str]) -> int:
        target = args[0] if args else self.env.get("HOME", "/")
        try:
            path = self._real(target)
        except FileOperationError:
            path = ""
        if path not in self.fs.dirs:
            self._error(f"sh: 1: cd: can't cd to {target}")
            return 2
        self.cwd = path
        return 0

    async def _ln(self, args: list[str]) -> int:
        if len(args) != 3 or args[0] != "-s":
            self._error("ln: the fake shell only runs `ln -s TARGET LINK`")
            return 1
        try:
            self.fs.symlink(args[1], self.fs.resolve(_normalize(args[2], self.cwd), follow=False))
        except FileOperationError as exc:
            self._error(f"ln: failed to create symbolic link '{args[2]}': {exc.message.rpartition(': ')[2]}")
            return 1
        return 0

    async def _sh(self, args: list[str]) -> int:
        if len(args) < 2 or args[0] != "-c":
            self._error("sh: the fake shell only runs `sh -c SCRIPT`")
            return 2
        child = _Shell(self.fs, env=self.env, cwd=self.cwd, halt=self.halt, pending=self.pending, sinks=self.sinks)
        async for _ in child.steps(args[1]):
            pass  # the parent flushes the output after this whole command
        return child.status


# --- the provider -------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Workspace:
    spec: WorkspaceSpec
    fs: _FileSystem = field(default_factory=_FileSystem)
    running: bool = True
    halt: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the workspace stops or is destroyed: running commands are killed."""


def _is_shell_c(argv: Sequence[str]) -> bool:
    return len(argv) >= 3 and posixpath.basename(argv[0]) == "sh" and argv[1] == "-c"


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), CHUNK_SIZE):
        yield bytes(view[start : start + CHUNK_SIZE])


class FakeProvider:
    """A :class:`~corral.providers.base.WorkspaceProvider` that keeps every workspace in memory.

    Attributes:
        fail_create: when set, ``create`` raises ``ProviderUnavailableError(name, fail_create)``.
        healthy: what ``health()`` reports.
        health_error: the error ``health()`` reports while ``healthy`` is false.
        create_delay_s: how long ``create`` takes (a real ``asyncio.sleep``, so it can be cancelled).
        exec_timeout_s: the deadline ``exec`` applies when the request has none (``None``: no deadline).
        calls: every call as ``(method, workspace_id)``; ``workspace_id`` is ``""`` for provider-wide calls.
        closed: whether ``aclose`` was called.
    """

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.fail_create: str | None = None
        self.healthy = True
        self.health_error = "fake provider marked unhealthy"
        self.create_delay_s = 0.0
        self.exec_timeout_s: float | None = None
        self.calls: list[tuple[str, str]] = []
        self.closed = False
        self._workspaces: dict[str, _Workspace] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def create(self, spec: WorkspaceSpec) -> None:
        """Create the workspace (after ``create_delay_s``) or raise the injected ``fail_create`` error."""
        self.calls.append(("create", spec.id))
        if self.fail_create is not None:
            raise ProviderUnavailableError(self.name, self.fail_create)
        self._check_free(spec.id)
        if self.create_delay_s > 0:
            await asyncio.sleep(self.create_delay_s)
        self._check_free(spec.id)
        self._workspaces[spec.id] = _Workspace(spec)

    async def destroy(self, workspace_id: str) -> None:
        """Forget the workspace and kill its running commands; a missing one is fine."""
        self.calls.append(("destroy", workspace_id))
        workspace = self._workspaces.pop(workspace_id, None)
        if workspace is not None:
            workspace.halt.set()

    async def stop(self, workspace_id: str) -> None:
        """Kill running commands and refuse exec and file calls until ``resume``; all files are kept."""
        self.calls.append(("stop", workspace_id))
        workspace = self._get(workspace_id)
        workspace.running = False
        workspace.halt.set()

    async def resume(self, workspace_id: str) -> None:
        """Make a stopped workspace usable again; a running one is left alone."""
        self.calls.append(("resume", workspace_id))
        workspace = self._get(workspace_id)
        if not workspace.running:
            workspace.running = True
            workspace.halt = asyncio.Event()

    def known_dead(self, workspace_id: str) -> bool:
        """True when the workspace is gone or stopped (the fake sees its whole runtime; see DeathWatcher)."""
        workspace = self._workspaces.get(workspace_id)
        return workspace is None or not workspace.running

    async def state(self, workspace_id: str) -> SandboxState:
        """Running, stopped or missing."""
        self.calls.append(("state", workspace_id))
        workspace = self._workspaces.get(workspace_id)
        if workspace is None:
            return SandboxState.MISSING
        return SandboxState.RUNNING if workspace.running else SandboxState.STOPPED

    async def list_workspaces(self) -> list[str]:
        """Ids of all workspaces, running or stopped, sorted."""
        self.calls.append(("list_workspaces", ""))
        return sorted(self._workspaces)

    # -- exec -----------------------------------------------------------------------------------------------------

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """Run the command to completion with the fake interpreter."""
        self.calls.append(("exec", workspace_id))
        timeout_s = request.timeout_s if request.timeout_s is not None else self.exec_timeout_s
        stdout, stderr = bytearray(), bytearray()
        events = self._events(workspace_id, request, timeout_s)
        try:
            async for event in events:
                if isinstance(event, ExecExit):
                    return ExecResult(event.exit_code, bytes(stdout), bytes(stderr), event.duration_ms)
                (stdout if event.stream == "stdout" else stderr).extend(event.data)
        finally:
            await events.aclose()
        raise AssertionError("the fake interpreter ended without an exit event")  # pragma: no cover

    async def exec_stream(self, workspace_id: str, request: ExecRequest) -> AsyncGenerator[ExecEvent, None]:
        """Yield the output of every statement as it finishes, then the exit; closing early kills the command."""
        self.calls.append(("exec_stream", workspace_id))
        events = self._events(workspace_id, request, request.timeout_s)
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()

    async def _events(
        self, workspace_id: str, request: ExecRequest, timeout_s: float | None
    ) -> AsyncGenerator[ExecEvent, None]:
        """Interpret the request, applying the deadline to every step (never around a ``yield``)."""
        request.validate()
        workspace = self._running(workspace_id)
        start = time.monotonic()
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        stdout, stderr = bytearray(), bytearray()
        run = self._interpret(workspace, request)
        try:
            while True:
                step = asyncio.timeout_at(deadline)
                try:
                    async with step:
                        event = await anext(run)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if not step.expired():
                        raise
                    raise ExecTimeoutError(
                        f"command timed out after {timeout_s:g}s",
                        stdout=bytes(stdout),
                        stderr=bytes(stderr),
                        duration_ms=(time.monotonic() - start) * 1000,
                    ) from None
                if isinstance(event, ExecOutput):
                    (stdout if event.stream == "stdout" else stderr).extend(event.data)
                yield event
        finally:
            await run.aclose()

    async def _interpret(self, workspace: _Workspace, request: ExecRequest) -> AsyncGenerator[ExecEvent, None]:
        start = time.monotonic()
        pending: list[ExecOutput] = []
        env = {**_BASE_ENV, **workspace.spec.env, **request.env}
        cwd = workspace.fs.resolve(_normalize(request.cwd))
        shell = _Shell(workspace.fs, env=env, cwd=cwd, halt=workspace.halt, pending=pending)
        argv = request.argv()
        try:
            if cwd not in workspace.fs.dirs:
                shell.write(2, f"chdir to cwd ({request.cwd}) failed: No such file or directory\n".encode())
                shell.status = 126
            elif _is_shell_c(argv):
                async for _ in shell.steps(argv[2]):
                    for output in pending:
                        yield output
                    pending.clear()
            else:
                shell.status = await shell.run_program(argv, not_found="{}: executable file not found in $PATH")
        except _Exit as exc:  # `exit` run directly in argv mode
            shell.status = exc.code
        except _Killed:
            shell.status = _KILLED_EXIT_CODE
        for output in pending:
            yield output
        yield ExecExit(exit_code=shell.status, duration_ms=(time.monotonic() - start) * 1000)

    # -- files ----------------------------------------------------------------------------------------------------

    async def read_file(self, workspace_id: str, path: str, *, beneath: str | None = None) -> AsyncIterator[bytes]:
        """Check the path now, then return an iterator over 64 KiB chunks of a snapshot of the content."""
        self.calls.append(("read_file", workspace_id))
        fs = self._running(workspace_id).fs
        data = fs.read(fs.resolve(_normalize(check_path(path)), beneath=beneath))
        return _chunks(data)

    async def write_file(
        self,
        workspace_id: str,
        path: str,
        data: bytes | AsyncIterable[bytes],
        *,
        mode: int | None = None,
        beneath: str | None = None,
    ) -> int:
        """Store the content (collected from the iterable if need be) once it is complete."""
        self.calls.append(("write_file", workspace_id))
        target = self._running(workspace_id).fs.resolve(_normalize(check_path(path)), beneath=beneath)
        if isinstance(data, bytes | bytearray | memoryview):
            content = bytes(data)
        else:
            buffer = bytearray()
            async for chunk in data:
                buffer.extend(chunk)
            content = bytes(buffer)
        fs = self._running(workspace_id).fs  # it may have stopped meanwhile
        fs.write(fs.resolve(target, beneath=beneath), content, mode=mode)  # a symlink may have appeared meanwhile
        return len(content)

    async def list_dir(self, workspace_id: str, path: str, *, beneath: str | None = None) -> list[FileInfo]:
        """Entries of the directory, sorted by name, reported under the path as given."""
        self.calls.append(("list_dir", workspace_id))
        fs = self._running(workspace_id).fs
        requested = _normalize(check_path(path))
        entries = fs.listdir(fs.resolve(requested, beneath=beneath))
        return [_as(e, posixpath.join(requested, e.name)) for e in entries]

    async def delete(
        self, workspace_id: str, path: str, *, recursive: bool = False, beneath: str | None = None
    ) -> None:
        """Remove a file, symlink or directory; a non-empty directory needs ``recursive``."""
        self.calls.append(("delete", workspace_id))
        fs = self._running(workspace_id).fs
        fs.delete(fs.resolve(_normalize(check_path(path)), follow=False, beneath=beneath), recursive=recursive)

    async def move(self, workspace_id: str, src: str, dst: str, *, beneath: str | None = None) -> None:
        """Rename with ``rename(2)`` semantics, creating the parents of ``dst``."""
        self.calls.append(("move", workspace_id))
        fs = self._running(workspace_id).fs
        source = fs.resolve(_normalize(check_path(src, field_name="src")), follow=False, beneath=beneath)
        fs.move(source, fs.resolve(_normalize(check_path(dst, field_name="dst")), follow=False, beneath=beneath))

    async def chmod(self, workspace_id: str, path: str, mode: int, *, beneath: str | None = None) -> None:
        """Set the permission bits."""
        self.calls.append(("chmod", workspace_id))
        fs = self._running(workspace_id).fs
        fs.chmod(fs.resolve(_normalize(check_path(path)), beneath=beneath), mode)

    async def stat(self, workspace_id: str, path: str, *, beneath: str | None = None) -> FileInfo:
        """Information about a file, directory or symlink (a final symlink is not followed)."""
        self.calls.append(("stat", workspace_id))
        fs = self._running(workspace_id).fs
        requested = _normalize(check_path(path))
        return _as(fs.info(fs.resolve(requested, follow=False, beneath=beneath)), requested)

    async def glob(
        self,
        workspace_id: str,
        pattern: str,
        *,
        root: str = WORKSPACE_ROOT,
        limit: int = 10_000,
        beneath: str | None = None,
    ) -> list[str]:
        """Files, directories and symlinks under ``root`` matching ``pattern``, sorted, at most ``limit``.

        Symlinks are matched but never walked into.
        """
        self.calls.append(("glob", workspace_id))
        check_path(pattern, field_name="pattern")
        if beneath is not None and (pattern.startswith("/") or ".." in pattern.split("/")):
            raise _escape(pattern, _normalize(beneath), " (a glob pattern must be relative and must not hold '..')")
        fs = self._running(workspace_id).fs
        requested = _normalize(check_path(root, field_name="root"))
        real = fs.resolve(requested, beneath=beneath)
        found = fs.glob(pattern, real, limit)
        return [requested + p[len(real) :] if real != "/" else requested.rstrip("/") + p for p in found]

    async def realpath(self, workspace_id: str, path: str, *, beneath: str | None = None) -> str:
        """The normalised absolute path with its symlinks resolved (missing components are kept)."""
        self.calls.append(("realpath", workspace_id))
        return self._running(workspace_id).fs.resolve(_normalize(check_path(path)), beneath=beneath)

    # -- provider -------------------------------------------------------------------------------------------------

    async def health(self) -> Health:
        """Report ``healthy`` and ``health_error``."""
        self.calls.append(("health", ""))
        return Health(
            healthy=self.healthy,
            error=None if self.healthy else self.health_error,
            details={"workspaces": len(self._workspaces)},
        )

    async def capabilities(self) -> Capabilities:
        """No isolation, everything else in memory and instantaneous."""
        self.calls.append(("capabilities", ""))
        return Capabilities(
            isolation="none",
            persistence=True,
            snapshots=False,
            warm_pool=True,
            streaming=True,
            disk_limit="none",
            requirements=(),
            startup_latency_ms=1.0,
            resources={
                "cpu_count": 4,
                "memory_bytes": 16 * 1024**3,
                "disk_free_bytes": 100 * 1024**3,
                "workspaces": len(self._workspaces),
            },
        )

    async def aclose(self) -> None:
        """Mark the provider closed; workspaces are kept, as the contract says."""
        self.calls.append(("aclose", ""))
        self.closed = True

    # -- helpers --------------------------------------------------------------------------------------------------

    def _check_free(self, workspace_id: str) -> None:
        if workspace_id in self._workspaces:
            raise WorkspaceStateError(f"workspace {workspace_id} already exists", details={"id": workspace_id})

    def _get(self, workspace_id: str) -> _Workspace:
        workspace = self._workspaces.get(workspace_id)
        if workspace is None:
            raise SandboxNotFoundError(f"workspace {workspace_id} not found", details={"id": workspace_id})
        return workspace

    def _running(self, workspace_id: str) -> _Workspace:
        workspace = self._get(workspace_id)
        if not workspace.running:
            raise WorkspaceStateError(f"workspace {workspace_id} is stopped", details={"id": workspace_id})
        return workspace
