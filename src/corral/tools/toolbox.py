"""The agent tools of one session, bound to one workspace on any :class:`WorkspaceCalls`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from corral.errors import UnknownToolError
from corral.providers.base import WorkspaceCalls
from corral.tools._common import ToolLimits
from corral.tools.files import edit_file, read_file, write_file
from corral.tools.git import run_git
from corral.tools.policy import VALID_TOOLS
from corral.tools.search import glob_paths, grep
from corral.tools.shell import run_bash, shell_state_dir

__all__ = ["Toolbox"]

ToolResult = dict[str, object]


class Toolbox:
    """``bash``, ``read``, ``write``, ``edit``, ``grep``, ``glob`` and ``git`` for one session's workspace.

    Each method takes the tool's JSON arguments as a dict and returns its JSON-able result. Bad arguments raise
    :class:`~corral.errors.InvalidRequestError`; refusals and failures :class:`~corral.errors.ToolError`; provider
    errors (workspace gone, file missing) pass through unchanged. The tool policy is not checked here: call
    :func:`corral.tools.check_tool_allowed` first.
    """

    def __init__(
        self,
        provider: WorkspaceCalls,
        workspace_id: str,
        *,
        session_id: str,
        limits: ToolLimits | None = None,
    ) -> None:
        shell_state_dir(session_id)  # validates the id now rather than on the first bash call
        self.provider = provider
        self.workspace_id = workspace_id
        self.session_id = session_id
        self.limits = limits or ToolLimits()

    async def call(self, tool: str, arguments: object) -> ToolResult:
        """Dispatch by name.

        Raises:
            UnknownToolError: ``tool`` is not one of :data:`~corral.tools.VALID_TOOLS`.
        """
        handlers: dict[str, Callable[[object], Awaitable[ToolResult]]] = {
            "bash": self.bash,
            "read": self.read,
            "write": self.write,
            "edit": self.edit,
            "grep": self.grep,
            "glob": self.glob,
            "git": self.git,
        }
        handler = handlers.get(tool)
        if handler is None:
            raise UnknownToolError(tool, VALID_TOOLS)
        return await handler(arguments)

    async def bash(self, arguments: object) -> ToolResult:
        """``{command, timeout_s?}`` -> ``{exit_code, stdout, stderr, timed_out, truncated}``."""
        return await run_bash(self.provider, self.workspace_id, self.session_id, arguments, self.limits)

    async def read(self, arguments: object) -> ToolResult:
        """``{path, offset?, limit?}`` -> ``{content, total_lines, truncated}``; ``offset`` is a 1-based line."""
        return await read_file(self.provider, self.workspace_id, arguments, self.limits)

    async def write(self, arguments: object) -> ToolResult:
        """``{path, content}`` -> ``{bytes_written}``."""
        return await write_file(self.provider, self.workspace_id, arguments, self.limits)

    async def edit(self, arguments: object) -> ToolResult:
        """``{path, old_string, new_string, replace_all?}`` -> ``{replacements}``."""
        return await edit_file(self.provider, self.workspace_id, arguments, self.limits)

    async def grep(self, arguments: object) -> ToolResult:
        """``{pattern, path?, include?, case_insensitive?}`` -> ``{matches: [{path, line_number, line}], truncated}``.

        Paths are relative to ``/workspace``.
        """
        return await grep(self.provider, self.workspace_id, arguments, self.limits)

    async def glob(self, arguments: object) -> ToolResult:
        """``{pattern, path?}`` -> ``{paths, truncated}``."""
        return await glob_paths(self.provider, self.workspace_id, arguments, self.limits)

    async def git(self, arguments: object) -> ToolResult:
        """``{args: [...]}`` -> ``{exit_code, stdout, stderr}``."""
        return await run_git(self.provider, self.workspace_id, arguments, self.limits)
