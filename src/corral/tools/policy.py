"""Which tools exist and which ones an agent type may call."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from corral.errors import InvalidRequestError, ToolNotAllowedError, UnknownToolError

__all__ = ["VALID_TOOLS", "ToolPolicy", "check_tool_allowed", "validate_tool_names"]

VALID_TOOLS: tuple[str, ...] = ("bash", "read", "write", "edit", "grep", "glob", "git")


def check_tool_allowed(tool: str, allowed: Iterable[str]) -> None:
    """Raise unless ``tool`` is a known tool and in ``allowed``.

    Raises:
        UnknownToolError: ``tool`` is not one of :data:`VALID_TOOLS` (404).
        ToolNotAllowedError: the agent type does not enable it (403).
    """
    if tool not in VALID_TOOLS:
        raise UnknownToolError(tool, VALID_TOOLS)
    if tool not in set(allowed):
        raise ToolNotAllowedError(tool)


def validate_tool_names(tools: Iterable[object], *, field_name: str = "tools") -> tuple[str, ...]:
    """The tool list of a workspace config, deduplicated in order; unknown names are refused all at once.

    Raises:
        InvalidRequestError: listing every invalid name and the valid options.
    """
    if isinstance(tools, str | bytes):
        raise InvalidRequestError(f"{field_name}: must be a list of tool names", details={"field": field_name})
    names = list(tools)
    invalid = [t for t in names if not isinstance(t, str) or t not in VALID_TOOLS]
    if invalid:
        raise InvalidRequestError(
            f"{field_name}: invalid tool name(s) {', '.join(repr(t) for t in invalid)}; "
            f"valid tools: {', '.join(VALID_TOOLS)}",
            details={"field": field_name, "invalid": invalid, "valid_tools": list(VALID_TOOLS)},
        )
    return tuple(dict.fromkeys(str(t) for t in names))


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """The tools one agent type enables."""

    allowed: frozenset[str]

    @classmethod
    def of(cls, tools: Iterable[object]) -> ToolPolicy:
        """A policy from a config's tool list (validated)."""
        return cls(frozenset(validate_tool_names(tools)))

    def check(self, tool: str) -> None:
        """See :func:`check_tool_allowed`."""
        check_tool_allowed(tool, self.allowed)

    def allows(self, tool: str) -> bool:
        """True when ``tool`` may be called."""
        return tool in self.allowed
