"""The ``bash`` tool: one persistent shell per session, built on nothing but ``exec``.

No process stays alive between calls. Each call runs ``bash -c`` with a fixed script that restores the session's
state, ``eval``s the agent's command (handed over in an environment variable, never spliced into the script),
then saves the state again from an ``EXIT`` trap, so ``exit 3`` and ``set -e`` failures save it too. The script
itself starts no process (under gVisor each one costs about 8 ms): only bash builtins, no subshell and no command
substitution, except ``mkdir`` on a session's first call. The state lives in the sandbox, in
``/tmp/.corral-shell/<session_id>/``, as two slots ``state.0`` and ``state.1``, each a script of one ``if`` block::

    if (( GEN > __corral_gen )); then __corral_gen=GEN; __corral_reset
    declare -x ...        # declare -px: the exported variables
    __corral_cwd=...      # the working directory; a fresh session starts in /workspace
    fi

A save writes generation N+1 into slot ``(N+1) % 2``, never into the slot holding N, the newest complete state.
The restore sources both slots; the newer complete one wins. Bash parses a whole ``if`` block before it runs any
of it, so a slot cut short by a kill mid-save is a syntax error that runs nothing, and the other slot (the state
before) is used: no ``mv`` needed for atomicity. ``__corral_reset`` unsets every exported variable first (found by
``"${!A@}" ... "${!_@}"``, not ``compgen -e``, which would need a fork), so ``unset`` carries over as well as
``export``. State saved by the earlier format (files ``env`` and ``cwd``) is still read when no slot is there.

Shell functions, aliases, options and unexported variables do not carry over. A call that times out is killed
with its process group before it can save, so it leaves the state of the call before it; so does a command that
replaces the ``EXIT`` trap. Calls of one session are not serialised here (the session service queues them): two at
once both start from the same state and save into the same slot, so overlapping saves can mix.
"""

from __future__ import annotations

import re
import string

from corral.errors import ExecTimeoutError, InvalidRequestError
from corral.providers.base import ExecMode, ExecRequest, WorkspaceCalls
from corral.tools._common import Arguments, ToolLimits, cap_text

__all__ = ["SHELL_STATE_ROOT", "TIMEOUT_EXIT_CODE", "run_bash", "shell_state_dir"]

SHELL_STATE_ROOT = "/tmp/.corral-shell"  # noqa: S108 - inside the sandbox, one directory per session
TIMEOUT_EXIT_CODE = 137
COMMAND_ENV = "CORRAL_BASH_COMMAND"
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

# Every variable name starts with one of these, so "${!A@}" ... "${!_@}" name them all without starting a process
# (``compgen -e`` would need a command substitution, which forks).
_ALL_NAMES = " ".join(f'"${{!{c}@}}"' for c in string.ascii_uppercase + string.ascii_lowercase + "_")

# $1 is the state directory. Every helper name starts with __corral_ to stay out of the agent's way. Nothing here
# starts a process, except the first call of a session, which creates the directory.
SHELL_SCRIPT = rf"""
__corral_dir=$1
set --
__corral_cmd=$CORRAL_BASH_COMMAND
unset CORRAL_BASH_COMMAND
[ -d "$__corral_dir" ] || (umask 077 && mkdir -p -- "$__corral_dir") 2>/dev/null
__corral_gen=0
__corral_cwd=/workspace
__corral_reset() {{
    for __corral_name in {_ALL_NAMES}; do
        [[ ${{!__corral_name@a}} == *x* ]] && unset "$__corral_name"
    done
}}
{{ . "$__corral_dir/state.0"; . "$__corral_dir/state.1"; }} 2>/dev/null
if [ "$__corral_gen" = 0 ] && [ -f "$__corral_dir/env" ]; then
    __corral_reset
    . "$__corral_dir/env" 2>/dev/null
    IFS= read -r -d '' __corral_cwd < "$__corral_dir/cwd" 2>/dev/null
fi
__corral_oldpwd=${{OLDPWD-}}
if ! {{ [ -d "$__corral_cwd" ] && [ -x "$__corral_cwd" ] && cd -- "$__corral_cwd"; }}; then
    printf 'corral: the working directory %s is gone; starting in /workspace\n' "$__corral_cwd" >&2
    cd /workspace || exit 1
fi
[ -n "$__corral_oldpwd" ] && OLDPWD=$__corral_oldpwd
__corral_save() {{
    local g=$((__corral_gen + 1))
    {{
        builtin printf '# corral shell state %s\nif (( %s > __corral_gen )); then\n__corral_gen=%s\n__corral_reset\n' \
            "$g" "$g" "$g"
        builtin declare -px
        builtin printf '__corral_cwd=%q\nfi\n' "$PWD"
    }} >| "$__corral_dir/state.$((g % 2))"
}}
trap '__corral_rc=$?; set +eu; __corral_save; exit $__corral_rc' EXIT
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
