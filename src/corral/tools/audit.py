"""One-line summaries of tool arguments for the audit log: enough to follow what an agent did, never whole files.

Credentials are masked before anything is clipped (``git clone https://***@host/repo.git``, ``?access_token=***``,
``GITHUB_TOKEN=***``), so a cut can never leave half a secret that the masking no longer recognises.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import Any

from corral.credentials import redact_text

__all__ = ["summarize_arguments"]

_MAX = 200


def _clip(text: str, limit: int = _MAX) -> str:
    text = redact_text(text).replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + f"... (+{len(text) - limit} chars)"


def _size(value: object) -> str:
    return f"{len(value.encode('utf-8'))} bytes" if isinstance(value, str) else "no content"


def _path(args: Mapping[Any, Any]) -> str:
    return _clip(str(args.get("path") or "."), 120)


def _bash(args: Mapping[Any, Any]) -> str:
    timeout = f" (timeout {args['timeout_s']} s)" if args.get("timeout_s") is not None else ""
    return _clip(str(args.get("command", ""))) + timeout


def _read(args: Mapping[Any, Any]) -> str:
    return f"{_path(args)} offset={args.get('offset', 1)} limit={args.get('limit', 'default')}"


def _write(args: Mapping[Any, Any]) -> str:
    return f"{_path(args)} ({_size(args.get('content'))})"


def _edit(args: Mapping[Any, Any]) -> str:
    mode = " replace_all" if args.get("replace_all") else ""
    return f"{_path(args)} (old {_size(args.get('old_string'))}, new {_size(args.get('new_string'))}){mode}"


def _grep(args: Mapping[Any, Any]) -> str:
    extra = f" include={_clip(str(args['include']), 80)}" if args.get("include") else ""
    case = " -i" if args.get("case_insensitive") else ""
    return f"{_clip(str(args.get('pattern', '')), 120)} in {_path(args)}{extra}{case}"


def _glob(args: Mapping[Any, Any]) -> str:
    return f"{_clip(str(args.get('pattern', '')), 120)} in {_path(args)}"


def _git(args: Mapping[Any, Any]) -> str:
    raw = args.get("args")
    words = [str(a) for a in raw] if isinstance(raw, list) else [str(raw)]
    return _clip("git " + shlex.join(words))


_SUMMARIES: dict[str, Callable[[Mapping[Any, Any]], str]] = {
    "bash": _bash,
    "read": _read,
    "write": _write,
    "edit": _edit,
    "grep": _grep,
    "glob": _glob,
    "git": _git,
}


def summarize_arguments(tool: str, args: object) -> str:
    """A short, safe description of one call; never raises, whatever ``args`` holds.

    bash: the command's first 200 characters; write and edit: the path and byte counts, never the content.
    Credentials in any of it are masked as ``***``.
    """
    if not isinstance(args, Mapping):
        return f"{tool}: invalid arguments ({type(args).__name__})"
    summary = _SUMMARIES.get(tool)
    if summary is None:
        return _clip(f"{tool}: {sorted(str(k) for k in args)}")
    return summary(args)
