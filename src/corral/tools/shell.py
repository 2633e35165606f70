"""The ``bash`` tool: one persistent shell per session.

Where the workspace's agent keeps shells (:class:`~corral.providers.base.ShellHost`: the gVisor, Docker and
Firecracker agents), each session has a bash process that lives between calls and runs
:data:`PERSISTENT_SCRIPT`: a call writes the command to a file and a serial to the shell's control socket, and the
shell answers with the status when the command is done, so a call starts no process of its own (``true`` costs no
exec at all) and its end is signalled, not polled. Everything the shell holds carries over while it lives: the
directory, variables exported or not, functions, aliases, options. After each call the shell also saves the exported
variables and the directory to disk, so when it is replaced (a timeout or ``exit`` ended it, its agent was closed
for idleness, the session's shells outnumbered the agent's limit) the next shell starts from them; functions,
aliases, options and unexported variables are then gone.

Elsewhere (E2B, the HTTP provider, the fake) each call runs ``bash -c`` with :data:`SHELL_SCRIPT`, which restores
the saved state, ``eval``s the agent's command (handed over in an environment variable, never spliced into the
script), then saves the state again from an ``EXIT`` trap, so ``exit 3`` and ``set -e`` failures save it too. That
script starts no process either (under gVisor each one costs milliseconds): only bash builtins, no subshell and no
command substitution, except ``mkdir`` on a session's first call.

The state lives in the sandbox, in ``/tmp/.corral-shell/<session_id>/``, as two slots ``state.0`` and ``state.1``,
each a script of one ``if`` block::

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

A call that times out is killed with its shell and the shell's process group (background jobs included) before it
can save, so it leaves the state of the call before it; so does a command that replaces the ``EXIT`` trap and exits.
Calls of one session take turns (the agent serialises them per shell; without one, the session service queues them).
"""

from __future__ import annotations

import contextlib
import re
import string

from corral.errors import ExecTimeoutError, InvalidRequestError
from corral.providers.base import (
    ExecMode,
    ExecRequest,
    ExecResult,
    ShellHost,
    ShellUnavailableError,
    WorkspaceCalls,
)
from corral.tools._common import Arguments, ToolLimits, cap_text

__all__ = ["SHELL_STATE_ROOT", "TIMEOUT_EXIT_CODE", "run_bash", "shell_state_dir"]

SHELL_STATE_ROOT = "/tmp/.corral-shell"  # noqa: S108 - inside the sandbox, one directory per session
TIMEOUT_EXIT_CODE = 137
COMMAND_ENV = "CORRAL_BASH_COMMAND"
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

# Every variable name starts with one of these, so "${!A@}" ... "${!_@}" name them all without starting a process
# (``compgen -e`` would need a command substitution, which forks).
_ALL_NAMES = " ".join(f'"${{!{c}@}}"' for c in string.ascii_uppercase + string.ascii_lowercase + "_")

# Shared by both scripts below (``$__corral_dir`` is the state directory): the restore reads the newest complete
# slot (or the earlier format) into exported variables and ``__corral_cwd``; ``__corral_save`` writes the next
# generation into the other slot.
_RESTORE = rf"""__corral_gen=0
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
"""
_SAVE = r"""__corral_save() {
    local g=$((__corral_gen + 1))
    {
        builtin printf '# corral shell state %s\nif (( %s > __corral_gen )); then\n__corral_gen=%s\n__corral_reset\n' \
            "$g" "$g" "$g"
        builtin declare -px
        builtin printf '__corral_cwd=%q\nfi\n' "$PWD"
    } >| "$__corral_dir/state.$((g % 2))"
    __corral_gen=$g
}
"""

# $1 is the state directory. Every helper name starts with __corral_ to stay out of the agent's way. Nothing here
# starts a process, except the first call of a session, which creates the directory.
SHELL_SCRIPT = rf"""
__corral_dir=$1
set --
__corral_cmd=$CORRAL_BASH_COMMAND
unset CORRAL_BASH_COMMAND
[ -d "$__corral_dir" ] || (umask 077 && mkdir -p -- "$__corral_dir") 2>/dev/null
{_RESTORE}__corral_oldpwd=${{OLDPWD-}}
if ! {{ [ -d "$__corral_cwd" ] && [ -x "$__corral_cwd" ] && cd -- "$__corral_cwd"; }}; then
    printf 'corral: the working directory %s is gone; starting in /workspace\n' "$__corral_cwd" >&2
    cd /workspace || exit 1
fi
[ -n "$__corral_oldpwd" ] && OLDPWD=$__corral_oldpwd
{_SAVE}trap '__corral_rc=$?; set +eu; __corral_save; exit $__corral_rc' EXIT
unset __corral_name __corral_cwd __corral_oldpwd
eval "$__corral_cmd"
"""

# The persistent shell's driver (the agent's ``shell`` op, see corral.guest.agent.Shell): $1 is the state directory.
# It restores the saved state once, as the script above does, then serves calls until the agent closes its stdin:
# per call it reads the serial from stdin, the command from $1/command, runs it with stdin from /dev/null, saves the
# state and answers "<serial> <status>" on stdin (a socket). Each call starts from the shell's own stdin, stdout and
# stderr again (copies kept on high descriptors), whatever ``exec <>`` the call before did. Everything but the
# command's own work is builtins. The EXIT trap saves the state of a command that ends the shell (exit, set -e); the
# shell's exit status is then the command's. set -e, -u, -v and -x hold only for the call that sets them: the driver's
# own steps run without them.
PERSISTENT_SCRIPT = rf"""
__corral_dir=$1
set --
{_RESTORE}{_SAVE}PWD=$__corral_cwd
unset __corral_name __corral_cwd
exec {{__corral_ctl}}<&0 {{__corral_out}}>&1 {{__corral_err}}>&2
while :; do
    exec 0<&"$__corral_ctl" 1>&"$__corral_out" 2>&"$__corral_err"
    IFS= builtin read -r __corral_serial || builtin exit 0
    __corral_cmd=
    IFS= builtin read -r -d '' __corral_cmd < "$__corral_dir/command"
    __corral_oldpwd=${{OLDPWD-}}
    if ! {{ [ -d "$PWD" ] && [ -x "$PWD" ] && builtin cd -- "$PWD"; }} 2>/dev/null; then
        builtin printf 'corral: the working directory %s is gone; starting in /workspace\n' "$PWD" >&2
        builtin cd /workspace || builtin exit 1
    fi
    [ -n "$__corral_oldpwd" ] && OLDPWD=$__corral_oldpwd
    builtin trap '__corral_rc=$?; set +eu; __corral_save; builtin exit $__corral_rc' EXIT
    exec </dev/null
    builtin eval "$__corral_cmd"
    __corral_rc=$?
    builtin set +euvx
    __corral_save
    builtin printf '%s %d\n' "$__corral_serial" "$__corral_rc" >&"$__corral_ctl"
done
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


async def _run(
    provider: WorkspaceCalls, workspace_id: str, session_id: str, command: str, *, timeout_s: float
) -> ExecResult:
    """The command in the session's persistent shell where the workspace keeps one, else in a ``bash -c`` of its
    own (the same state on disk either way)."""
    state_dir = shell_state_dir(session_id)
    if isinstance(provider, ShellHost):
        with contextlib.suppress(ShellUnavailableError):
            request = ExecRequest(
                "/bin/bash", ("-c", PERSISTENT_SCRIPT, "bash", state_dir), mode=ExecMode.ARGV, timeout_s=timeout_s
            )
            return await provider.exec_in_shell(
                workspace_id, request, key=session_id, state_dir=state_dir, command=command
            )
    request = ExecRequest(
        "/bin/bash",
        ("-c", SHELL_SCRIPT, "bash", state_dir),
        mode=ExecMode.ARGV,
        env={COMMAND_ENV: command},
        timeout_s=timeout_s,
    )
    return await provider.exec(workspace_id, request)


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
    try:
        result = await _run(provider, workspace_id, session_id, command, timeout_s=timeout_s)
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
