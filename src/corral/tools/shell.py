"""The ``bash`` tool: one persistent shell per session, built on nothing but ``exec``.

No process stays alive between calls. Each call runs ``bash -c`` with a fixed script that restores the session's
state, ``eval``s the agent's command (handed over in an environment variable, never spliced into the script),
then saves the state again from an ``EXIT`` trap, so ``exit 3`` and ``set -e`` failures save it too. The state lives
in the sandbox, in ``/tmp/.corral-shell/<session_id>/``:

* ``cwd``: the working directory (``printf %s "$PWD"``); a fresh session starts in ``/workspace``;
* ``env``: the exported variables (``declare -px``). On restore every exported variable is unset first, so
  ``unset`` carries over as well as ``export``.

Shell functions, aliases, options and unexported variables do not carry over. A call that times out is killed
with its process group before it can save, so it leaves the state of the call before it; so does a command that
replaces the ``EXIT`` trap. Calls of one session are not serialised here: two at once both start from the same
state and the last to finish wins.
"""

from __future__ import annotations

import re

from corral.errors import ExecTimeoutError, InvalidRequestError
from corral.providers.base import ExecMode, ExecRequest, WorkspaceCalls
from corral.tools._common import Arguments, ToolLimits, cap_text

__all__ = ["SHELL_STATE_ROOT", "TIMEOUT_EXIT_CODE", "run_bash", "shell_state_dir"]

SHELL_STATE_ROOT = "/tmp/.corral-shell"  # noqa: S108 - inside the sandbox, one directory per session
TIMEOUT_EXIT_CODE = 137
COMMAND_ENV = "CORRAL_BASH_COMMAND"
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

# $1 is the state directory. Every helper name starts with __corral_ to stay out of the agent's way.
SHELL_SCRIPT = r"""
__corral_dir=$1
set --
__corral_cmd=$CORRAL_BASH_COMMAND
unset CORRAL_BASH_COMMAND
(umask 077 && mkdir -p -- "$__corral_dir") 2>/dev/null
__corral_cwd=/workspace
if [ -f "$__corral_dir/env" ]; then
    for __corral_name in $(compgen -e); do unset "$__corral_name" 2>/dev/null; done
    . "$__corral_dir/env" 2>/dev/null
    [ -f "$__corral_dir/cwd" ] && __corral_cwd=$(< "$__corral_dir/cwd")
fi
__corral_oldpwd=${OLDPWD-}
if ! cd -- "$__corral_cwd" 2>/dev/null; then
    printf 'corral: the working directory %s is gone; starting in /workspace\n' "$__corral_cwd" >&2
    cd /workspace || exit 1
fi
[ -n "$__corral_oldpwd" ] && OLDPWD=$__corral_oldpwd
__corral_save() {
    {
        declare -px > "$__corral_dir/env.$$" && command -p mv -f -- "$__corral_dir/env.$$" "$__corral_dir/env"
        printf '%s' "$PWD" > "$__corral_dir/cwd.$$" && command -p mv -f -- "$__corral_dir/cwd.$$" "$__corral_dir/cwd"
    } 2>/dev/null
}
trap '__corral_rc=$?; __corral_save; exit $__corral_rc' EXIT
unset __corral_name __corral_cwd __corral_oldpwd
eval "$__corral_cmd"
"""


def shell_state_dir(session_id: str) -> str:
    """Where a session's shell state lives inside the sandbox.

    Raises:
        InvalidRequestError: the id is not 1-128 letters, digits, ``_``, ``.`` or ``-`` (starting alphanumeric).
    """
    if not _SESSION_ID.match(session_id):
        raise InvalidRequestError(
            f"session_id: {session_id!r} must be 1-128 letters, digits, '_', '.' or '-', starting with a letter or "
            "digit",
            details={"field": "session_id"},
        )
    return f"{SHELL_STATE_ROOT}/{session_id}"


async def run_bash(
    provider: WorkspaceCalls, workspace_id: str, session_id: str, raw: object, limits: ToolLimits
) -> dict[str, object]:
    """``bash {command, timeout_s?}`` -> ``{exit_code, stdout, stderr, timed_out, truncated}``."""
    args = Arguments("bash", raw, ("command", "timeout_s"))
    command = args.string("command")
    size = len(command.encode("utf-8"))
    if size > limits.bash_max_command_bytes:
        raise InvalidRequestError(
            f"command: must be at most {limits.bash_max_command_bytes} bytes, got {size}; write a long script to a "
            "file with the write tool and run that file",
            details={"field": "command"},
        )
    timeout_s = args.number("timeout_s", default=limits.bash_timeout_s, maximum=limits.bash_max_timeout_s)
    request = ExecRequest(
        "/bin/bash",
        ("-c", SHELL_SCRIPT, "bash", shell_state_dir(session_id)),
        mode=ExecMode.ARGV,
        env={COMMAND_ENV: command},
        timeout_s=timeout_s,
    )
    try:
        result = await provider.exec(workspace_id, request)
    except ExecTimeoutError as exc:
        stdout, out_cut = cap_text(exc.stdout, limits.output_chars)
        stderr, err_cut = cap_text(exc.stderr, limits.output_chars)
        note = f"[command timed out after {timeout_s:g} s and was killed]"
        stderr = f"{stderr}\n{note}" if stderr else note
        return {
            "exit_code": TIMEOUT_EXIT_CODE,
            "stdout": stdout,
            "stderr": stderr,
            "timed_out": True,
            "truncated": out_cut or err_cut,
        }
    stdout, out_cut = cap_text(result.stdout, limits.output_chars, dropped_by_provider=result.truncated)
    stderr, err_cut = cap_text(result.stderr, limits.output_chars, dropped_by_provider=result.truncated)
    return {
        "exit_code": result.exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "timed_out": False,
        "truncated": out_cut or err_cut,
    }
