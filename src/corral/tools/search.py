"""The ``grep`` and ``glob`` tools.

Both report paths relative to ``/workspace`` (``src/a.py``), the form every file tool takes back.

``grep`` runs ripgrep in argv mode (no shell): ``rg --json --hidden`` with the pattern passed as
``--regexp=<pattern>`` and the path after ``--``, sorted by path. It honours ``.gitignore``, searches hidden files but
never ``.git/``, skips binary files, and stops (killing rg) once it has one match more than the cap.

``glob`` uses the provider's glob (``**`` spans directories; hidden names only match patterns that spell the dot).
Patterns are relative to ``path`` (default ``/workspace``) and may not be absolute or climb with ``..``; the glob
runs with ``beneath=/workspace``, so a symlink leading out as ``path`` is refused and symlinks below it are matched
but never walked into.
"""

from __future__ import annotations

import base64
import json
import posixpath
from typing import Any

from corral.errors import ExecTimeoutError, InvalidRequestError, ToolError
from corral.orchestrator.paths import confine, lexically_confined
from corral.providers.base import WORKSPACE_ROOT, ExecEvent, ExecExit, ExecMode, ExecRequest, WorkspaceCalls
from corral.tools._common import Arguments, ToolLimits, workspace_relative

__all__ = ["glob_paths", "grep", "rg_argv"]

_RG_NOT_FOUND_CODES = (126, 127)


def rg_argv(pattern: str, target: str, *, include: str | None, case_insensitive: bool) -> list[str]:
    """The ripgrep arguments for one search; every agent-supplied value is glued to its option or follows ``--``."""
    argv = ["--json", "--no-config", "--sort=path", "--hidden", f"--regexp={pattern}"]
    if case_insensitive:
        argv.append("--ignore-case")
    if include is not None:
        argv.append(f"--glob={include}")
    argv += ["--glob=!.git", "--", target]
    return argv


def _text(field: dict[str, Any]) -> str:
    """rg's ``{"text": ...}`` or, for invalid UTF-8, ``{"bytes": base64}``."""
    if "text" in field:
        return str(field["text"])
    return base64.b64decode(field.get("bytes", "")).decode("utf-8", errors="replace")


def _match(event: dict[str, Any], max_line_chars: int) -> dict[str, object]:
    data = event["data"]
    line = _text(data["lines"]).rstrip("\r\n")
    if len(line) > max_line_chars:
        line = line[:max_line_chars] + " [... line truncated ...]"
    return {"path": posixpath.normpath(_text(data["path"])), "line_number": data["line_number"], "line": line}


class _RgCollector:
    """Parses ``rg --json`` output as it streams in, keeping matches and a bounded stderr."""

    def __init__(self, limits: ToolLimits) -> None:
        self.limits = limits
        self.matches: list[dict[str, object]] = []
        self.stderr = bytearray()
        self.exit_code: int | None = None
        self._pending = b""

    def feed(self, event: ExecEvent) -> bool:
        """Take one event; True once there is one match more than the cap (the caller stops rg)."""
        if isinstance(event, ExecExit):
            self.exit_code = event.exit_code
        elif event.stream == "stderr":
            self.stderr += event.data[: max(64 * 1024 - len(self.stderr), 0)]
        else:
            *lines, self._pending = (self._pending + event.data).split(b"\n")
            for line in lines:
                parsed = json.loads(line) if line.strip() else {}
                if parsed.get("type") == "match":
                    self.matches.append(_match(parsed, self.limits.grep_max_line_chars))
        return len(self.matches) > self.limits.grep_max_matches


async def grep(provider: WorkspaceCalls, workspace_id: str, raw: object, limits: ToolLimits) -> dict[str, object]:
    """``grep {pattern, path?, include?, case_insensitive?}`` -> ``{matches: [{path, line_number, line}], truncated}``.

    A search that passes the match cap or the deadline returns what it found with ``truncated: true``.
    """
    args = Arguments("grep", raw, ("pattern", "path", "include", "case_insensitive"))
    pattern = args.string("pattern", max_chars=10_000)
    path = args.optional_string("path") or "."
    include = args.optional_string("include", max_chars=1000)
    case_insensitive = args.boolean("case_insensitive")
    target = workspace_relative(await confine(provider, workspace_id, path))
    request = ExecRequest(
        "rg",
        tuple(rg_argv(pattern, target, include=include, case_insensitive=case_insensitive)),
        mode=ExecMode.ARGV,
        cwd=WORKSPACE_ROOT,
        timeout_s=limits.grep_timeout_s,
    )
    out = _RgCollector(limits)
    truncated = False
    events = provider.exec_stream(workspace_id, request)
    try:
        async for event in events:
            if out.feed(event):
                truncated = True
                break
    except ExecTimeoutError:
        truncated = True  # what was found before the deadline is returned
    finally:
        await events.aclose()  # stops rg when we leave early
    if truncated:
        return {"matches": out.matches[: limits.grep_max_matches], "truncated": True}
    _raise_for_rg_failure(out)
    return {"matches": out.matches, "truncated": False}


def _raise_for_rg_failure(out: _RgCollector) -> None:
    message = out.stderr.decode("utf-8", errors="replace").strip()
    if out.exit_code in _RG_NOT_FOUND_CODES:
        raise ToolError(f"grep needs ripgrep (rg) in the workspace image, and it could not run: {message}")
    if out.exit_code == 2 and not out.matches:
        if "regex" in message.lower():  # "regex parse error", "the literal '\n' is not allowed in a regex"
            raise InvalidRequestError(
                f"pattern: not a valid regular expression: {message}", details={"field": "pattern"}
            )
        raise ToolError(f"grep failed: {message}")


def _check_glob_pattern(pattern: str) -> None:
    if pattern.startswith("/"):
        raise InvalidRequestError(
            "pattern: must be relative (to path, default /workspace), not absolute", details={"field": "pattern"}
        )
    if ".." in pattern.split("/"):
        raise InvalidRequestError(
            "pattern: must not contain '..'; pass the directory to search as path", details={"field": "pattern"}
        )


async def glob_paths(provider: WorkspaceCalls, workspace_id: str, raw: object, limits: ToolLimits) -> dict[str, object]:
    """``glob {pattern, path?}`` -> ``{paths, truncated}``, paths sorted and relative to ``/workspace``."""
    args = Arguments("glob", raw, ("pattern", "path"))
    pattern = args.string("pattern", max_chars=1000)
    _check_glob_pattern(pattern)
    root = lexically_confined(args.optional_string("path") or ".")
    found = await provider.glob(
        workspace_id, pattern, root=root, limit=limits.glob_max_paths + 1, beneath=WORKSPACE_ROOT
    )
    paths = [workspace_relative(p) for p in found if p.startswith(WORKSPACE_ROOT + "/")]
    return {"paths": paths[: limits.glob_max_paths], "truncated": len(found) > limits.glob_max_paths}
