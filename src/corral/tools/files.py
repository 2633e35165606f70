"""The ``read``, ``write`` and ``edit`` tools, on the provider's streaming file calls.

Paths are relative to ``/workspace`` (absolute ones must be inside it): ``..`` leading out is refused lexically, and
every file call runs with ``beneath=/workspace``, so the provider refuses symlinks leading out without a race.
``write`` and ``edit`` also refuse anything inside a ``.git`` directory (checked on the path as given and as
resolved), so hooks or config that would make git run programs cannot be planted through them.

``read`` counts lines from 1: ``offset`` is the number of the first line returned (default 1) and ``limit`` the most
lines returned. ``content`` is the file's text for those lines, exactly as stored (no line-number prefixes), so it
can be fed back to ``edit``.
"""

from __future__ import annotations

from corral.errors import InvalidRequestError, ToolError
from corral.orchestrator.paths import lexically_confined
from corral.providers.base import WORKSPACE_ROOT, WorkspaceCalls
from corral.tools._common import Arguments, ToolLimits, workspace_relative

__all__ = ["edit_file", "read_file", "write_file"]


def _binary_error(display: str) -> ToolError:
    return ToolError(
        f"{display} is a binary file (it holds NUL bytes); read and edit only handle text",
        details={"path": display},
    )


async def _writable_path(provider: WorkspaceCalls, workspace_id: str, path: str) -> tuple[str, str]:
    """The confined absolute path to write to and its display form; refuses ``.git`` internals."""
    absolute = lexically_confined(path)
    display = workspace_relative(absolute)
    resolved = await provider.realpath(workspace_id, absolute, beneath=WORKSPACE_ROOT)
    for candidate in (absolute, resolved):
        if ".git" in candidate.split("/"):
            raise ToolError(
                f"{display}: writing inside a .git directory is refused (git hooks and config there could make git "
                "run programs); change the repository with the git tool instead",
                details={"path": display},
            )
    return absolute, display


class _LineWindow:
    """Collects lines ``first .. first+limit-1`` (1-based) from a byte stream while counting all lines."""

    def __init__(self, first: int, limit: int, max_chars: int) -> None:
        self.first, self.last, self.max_chars = first, first + limit - 1, max_chars
        self.lines: list[str] = []
        self.chars = 0
        self.count = 0
        self.truncated = False

    def add(self, line: bytes) -> None:
        self.count += 1
        if self.count < self.first:
            return
        if self.count > self.last or self.chars >= self.max_chars:
            self.truncated = True
            return
        text = line.decode("utf-8", errors="replace")
        room = self.max_chars - self.chars
        if len(text) > room:
            text, self.truncated = text[:room], True
        self.lines.append(text)
        self.chars += len(text)


async def read_file(provider: WorkspaceCalls, workspace_id: str, raw: object, limits: ToolLimits) -> dict[str, object]:
    """``read {path, offset?, limit?}`` -> ``{content, total_lines, truncated}``."""
    args = Arguments("read", raw, ("path", "offset", "limit"))
    path = args.string("path")
    offset = args.integer("offset", default=1, minimum=1, maximum=2**31)
    limit = args.integer("limit", default=limits.read_default_lines, minimum=1, maximum=limits.read_max_lines)
    absolute = lexically_confined(path)
    display = workspace_relative(absolute)
    window = _LineWindow(offset, limit, limits.read_max_chars)
    pending = b""
    seen = 0
    sniffed = 0
    stream = await provider.read_file(workspace_id, absolute, beneath=WORKSPACE_ROOT)
    try:
        async for received in stream:
            if sniffed < limits.binary_sniff_bytes:
                head = received[: limits.binary_sniff_bytes - sniffed]
                if b"\x00" in head:
                    raise _binary_error(display)
                sniffed += len(head)
            room = limits.read_max_bytes - seen
            chunk = received[:room]
            if len(received) > room:
                window.truncated = True
            seen += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                window.add(line + b"\n")
            if seen >= limits.read_max_bytes and window.truncated:
                break
    finally:
        await stream.aclose()  # leaving early stops the agent reading the file
    if pending:
        window.add(pending)
    return {"content": "".join(window.lines), "total_lines": window.count, "truncated": window.truncated}


async def write_file(provider: WorkspaceCalls, workspace_id: str, raw: object, limits: ToolLimits) -> dict[str, object]:
    """``write {path, content}`` -> ``{bytes_written}``; missing parent directories are created."""
    args = Arguments("write", raw, ("path", "content"))
    path = args.string("path")
    value = args.raw.get("content")
    if not isinstance(value, str):
        raise InvalidRequestError("content: is required (a string, possibly empty)", details={"field": "content"})
    data = value.encode("utf-8")
    if len(data) > limits.write_max_bytes:
        raise InvalidRequestError(
            f"content: must be at most {limits.write_max_bytes} bytes, got {len(data)}", details={"field": "content"}
        )
    absolute, _display = await _writable_path(provider, workspace_id, path)
    written = await provider.write_file(workspace_id, absolute, data, beneath=WORKSPACE_ROOT)
    return {"bytes_written": written}


async def _read_all(
    provider: WorkspaceCalls, workspace_id: str, absolute: str, display: str, limits: ToolLimits
) -> bytes:
    buf = bytearray()
    stream = await provider.read_file(workspace_id, absolute, beneath=WORKSPACE_ROOT)
    try:
        async for chunk in stream:
            buf += chunk
            if len(buf) > limits.edit_max_bytes:
                raise ToolError(
                    f"{display} is larger than {limits.edit_max_bytes} bytes; edit refuses files that big",
                    details={"path": display},
                )
    finally:
        await stream.aclose()
    if b"\x00" in buf[: limits.binary_sniff_bytes]:
        raise _binary_error(display)
    return bytes(buf)


async def edit_file(provider: WorkspaceCalls, workspace_id: str, raw: object, limits: ToolLimits) -> dict[str, object]:
    """``edit {path, old_string, new_string, replace_all?}`` -> ``{replacements}``.

    The match is exact (bytes of the UTF-8 text); the file's mode is kept.
    """
    args = Arguments("edit", raw, ("path", "old_string", "new_string", "replace_all"))
    path = args.string("path")
    old = args.string("old_string", non_empty=False)
    new = args.string("new_string", non_empty=False)
    replace_all = args.boolean("replace_all")
    if not old:
        raise InvalidRequestError(
            "old_string: must be non-empty; to create or overwrite a whole file use write",
            details={"field": "old_string"},
        )
    if old == new:
        raise InvalidRequestError(
            "new_string: must differ from old_string; the edit would change nothing", details={"field": "new_string"}
        )
    absolute, display = await _writable_path(provider, workspace_id, path)
    data = await _read_all(provider, workspace_id, absolute, display, limits)
    old_b, new_b = old.encode("utf-8"), new.encode("utf-8")
    count = data.count(old_b)
    if count == 0:
        raise ToolError(f"old_string not found in {display}", details={"path": display, "occurrences": 0})
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_string occurs {count} times in {display}; make it unique or pass replace_all",
            details={"path": display, "occurrences": count},
        )
    await provider.write_file(workspace_id, absolute, data.replace(old_b, new_b), beneath=WORKSPACE_ROOT)
    return {"replacements": count}
