"""What every tool shares: limits, argument validation, output capping and the path forms tools report."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from corral.errors import InvalidRequestError
from corral.providers.base import WORKSPACE_ROOT

__all__ = ["Arguments", "ToolLimits", "cap_text", "workspace_relative"]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Caps and deadlines of the tools; the defaults suit an interactive agent."""

    bash_timeout_s: float = 120.0
    bash_max_timeout_s: float = 3600.0
    bash_max_command_bytes: int = 100_000
    """The command travels in an environment variable; Linux caps one at 128 KiB."""
    output_chars: int = 30_000
    """Per stream, for bash and git; the rest is replaced by a visible marker line."""
    read_default_lines: int = 2000
    read_max_lines: int = 100_000
    read_max_bytes: int = 10 * MiB
    read_max_chars: int = 256_000
    """The most text one read returns, whatever ``limit`` says."""
    write_max_bytes: int = 10 * MiB
    edit_max_bytes: int = 10 * MiB
    grep_max_matches: int = 500
    grep_max_line_chars: int = 500
    grep_timeout_s: float = 60.0
    glob_max_paths: int = 1000
    git_timeout_s: float = 120.0
    binary_sniff_bytes: int = 8192


def cap_text(data: bytes, limit: int, *, dropped_by_provider: bool = False) -> tuple[str, bool]:
    """Decode ``data`` (invalid UTF-8 replaced) and keep ``limit`` characters, marking what was cut.

    ``dropped_by_provider`` says the provider already dropped output past its own (much larger) cap, so the count
    in the marker is a lower bound.
    """
    text = data.decode("utf-8", errors="replace")
    if len(text) <= limit:
        return text, False
    kept = text[:limit]
    more = max(len(data) - len(kept.encode("utf-8", errors="replace")), 0)
    marker = f"{more} more bytes" if not dropped_by_provider else f"{more}+ more bytes"
    return f"{kept}\n[... output truncated: {marker} ...]", True


def workspace_relative(path: str) -> str:
    """``/workspace/src/a.py`` -> ``src/a.py``; ``/workspace`` -> ``.``; anything else is returned as it is."""
    if path == WORKSPACE_ROOT:
        return "."
    prefix = WORKSPACE_ROOT + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def _invalid(name: str, problem: str) -> InvalidRequestError:
    return InvalidRequestError(f"{name}: {problem}", details={"field": name})


class Arguments:
    """A tool's JSON arguments, checked one by one; every problem names the argument and what is allowed."""

    def __init__(self, tool: str, raw: object, allowed: tuple[str, ...]) -> None:
        if not isinstance(raw, Mapping):
            raise InvalidRequestError(
                f"{tool}: arguments must be a JSON object with {', '.join(allowed)}", details={"tool": tool}
            )
        unknown = sorted(str(k) for k in raw if k not in allowed)
        if unknown:
            raise InvalidRequestError(
                f"{tool}: unknown argument(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}",
                details={"tool": tool, "unknown": unknown, "allowed": list(allowed)},
            )
        self.tool = tool
        self.raw: Mapping[str, object] = raw

    def string(self, name: str, *, non_empty: bool = True, max_chars: int | None = None) -> str:
        """A required string (no NUL bytes)."""
        value = self.raw.get(name)
        if value is None:
            raise _invalid(name, "is required" + (" (a non-empty string)" if non_empty else " (a string)"))
        return self._check_string(name, value, non_empty=non_empty, max_chars=max_chars)

    def optional_string(self, name: str, *, max_chars: int | None = None) -> str | None:
        """A non-empty string, or None when absent or null."""
        value = self.raw.get(name)
        if value is None:
            return None
        return self._check_string(name, value, non_empty=True, max_chars=max_chars)

    @staticmethod
    def _check_string(name: str, value: object, *, non_empty: bool, max_chars: int | None) -> str:
        if not isinstance(value, str):
            raise _invalid(name, f"must be a string, got {type(value).__name__}")
        if non_empty and not value:
            raise _invalid(name, "must be a non-empty string")
        if "\x00" in value:
            raise _invalid(name, "must not contain a NUL byte")
        if max_chars is not None and len(value) > max_chars:
            raise _invalid(name, f"must be at most {max_chars} characters, got {len(value)}")
        return value

    def integer(self, name: str, *, default: int, minimum: int, maximum: int) -> int:
        """An optional integer within ``[minimum, maximum]``."""
        value = self.raw.get(name)
        if value is None:
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise _invalid(name, f"must be an integer from {minimum} to {maximum}, got {value!r}")
        if not minimum <= value <= maximum:
            raise _invalid(name, f"must be an integer from {minimum} to {maximum}, got {value}")
        return value

    def number(self, name: str, *, default: float, maximum: float) -> float:
        """An optional number greater than zero and at most ``maximum``."""
        value = self.raw.get(name)
        if value is None:
            return default
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise _invalid(name, f"must be a number of seconds greater than 0 and at most {maximum:g}, got {value!r}")
        if not 0 < value <= maximum:
            raise _invalid(name, f"must be greater than 0 and at most {maximum:g}, got {value:g}")
        return float(value)

    def boolean(self, name: str, *, default: bool = False) -> bool:
        """An optional true/false."""
        value = self.raw.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise _invalid(name, f"must be true or false, got {value!r}")
        return value

    def string_list(self, name: str, *, max_items: int = 1000) -> list[str]:
        """A required list of strings (each may be empty, none may hold a NUL byte)."""
        value = self.raw.get(name)
        if value is None:
            raise _invalid(name, "is required (a list of strings)")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _invalid(name, "must be a list of strings")
        if len(value) > max_items:
            raise _invalid(name, f"must hold at most {max_items} items, got {len(value)}")
        if any("\x00" in v for v in value):
            raise _invalid(name, "items must not contain a NUL byte")
        return list(value)
