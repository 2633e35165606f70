"""The fake ``/bin/sh``: a tiny deterministic interpreter of just enough shell for the conformance suite and unit tests.

It understands:

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
yields ``a`` a second before ``b``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import posixpath
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from corral.errors import FileOperationError, WorkspaceFileNotFoundError
from corral.providers.base import ExecOutput
from corral.providers.fake.fs import CHUNK_SIZE, FileSystem, normalize

__all__ = ["Exit", "Killed", "Shell"]


class _ShellSyntaxError(Exception):
    """The script uses syntax the fake shell does not understand."""


class Exit(Exception):
    """``exit N`` ends the script: control flow, not an error."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Killed(Exception):
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


class Shell:
    """Runs one command line; output goes to ``pending`` until the caller flushes it."""

    def __init__(
        self,
        fs: FileSystem,
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
        except Exit as exc:
            self.status = exc.code

    async def run_command(self, command: _Command) -> int:
        if self.halt.is_set():
            raise Killed
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
        return self.fs.resolve(normalize(arg, self.cwd))

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
            raise Exit(self.status)
        try:
            code = int(args[0])
        except ValueError:
            self._error(f"sh: 1: exit: Illegal number: {args[0]}")
            raise Exit(2) from None
        raise Exit(code & 0xFF)

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
        raise Killed

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
            self.fs.symlink(args[1], self.fs.resolve(normalize(args[2], self.cwd), follow=False))
        except FileOperationError as exc:
            self._error(f"ln: failed to create symbolic link '{args[2]}': {exc.message.rpartition(': ')[2]}")
            return 1
        return 0

    async def _sh(self, args: list[str]) -> int:
        if len(args) < 2 or args[0] != "-c":
            self._error("sh: the fake shell only runs `sh -c SCRIPT`")
            return 2
        child = Shell(self.fs, env=self.env, cwd=self.cwd, halt=self.halt, pending=self.pending, sinks=self.sinks)
        async for _ in child.steps(args[1]):
            pass  # the parent flushes the output after this whole command
        return child.status
