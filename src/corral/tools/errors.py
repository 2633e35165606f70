"""The errors of the tool policy: a tool outside the agent type's list (403) and a tool name that does not exist (404).

Both subclass :class:`corral.errors.ToolError`, so the API's error handler renders them like every Corral error.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.errors import ToolError

__all__ = ["ToolNotAllowedError", "UnknownToolError"]


class ToolNotAllowedError(ToolError):
    """The tool exists but the session's agent type does not enable it."""

    code = "tool_not_allowed"
    http_status = 403

    def __init__(self, tool: str) -> None:
        super().__init__(f"Tool '{tool}' is not enabled for this agent type", details={"tool": tool})
        self.tool = tool


class UnknownToolError(ToolError):
    """No tool of that name exists."""

    code = "unknown_tool"
    http_status = 404

    def __init__(self, tool: str, valid: Iterable[str]) -> None:
        valid = list(valid)
        super().__init__(
            f"Unknown tool {tool!r}; valid tools: {', '.join(valid)}", details={"tool": tool, "valid_tools": valid}
        )
        self.tool = tool
