"""The agent tools (bash, read, write, edit, grep, glob, git) on top of any workspace provider, and their policy.

Typical use by the API::

    check_tool_allowed(tool, agent_type.tools)           # 404 unknown tool, 403 not enabled
    result = await Toolbox(provider, workspace_id, session_id=session.id).call(tool, arguments)
    audit(tool, summarize_arguments(tool, arguments), ...)

Paths are relative to ``/workspace``; ``read`` counts lines from 1; grep and glob report paths relative to
``/workspace``. See each module for the details of one tool.
"""

from corral.errors import ToolNotAllowedError, UnknownToolError
from corral.tools._common import ToolLimits
from corral.tools.audit import summarize_arguments
from corral.tools.git import check_git_args
from corral.tools.policy import VALID_TOOLS, ToolPolicy, check_tool_allowed, validate_tool_names
from corral.tools.toolbox import Toolbox

__all__ = [
    "VALID_TOOLS",
    "ToolLimits",
    "ToolNotAllowedError",
    "ToolPolicy",
    "Toolbox",
    "UnknownToolError",
    "check_git_args",
    "check_tool_allowed",
    "summarize_arguments",
    "validate_tool_names",
]
