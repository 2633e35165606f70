"""The ``git`` tool: git in argv mode in ``/workspace``, refusing whatever makes git run other programs.

Every call runs ``git --no-pager -c core.hooksPath=/dev/null -c core.fsmonitor=false -c protocol.ext.allow=never
... <agent args>`` with ``GIT_CONFIG_NOSYSTEM=1``, ``GIT_CONFIG_GLOBAL=/dev/null`` and ``GIT_TERMINAL_PROMPT=0``, so
hooks, fsmonitor, the ``ext::`` transport, pagers, editors and credential helpers never start. Before that,
:func:`check_git_args` refuses (with a :class:`~corral.errors.ToolError` naming the option and why):

* global options that change git's configuration or programs (``-c``, ``--config-env``, ``--exec-path``) and unknown
  ones; ``-C``, ``--git-dir`` and ``--work-tree`` are allowed only inside ``/workspace``;
* ``ext::`` and ``fd::`` URLs anywhere in the arguments;
* ``--upload-pack``, ``--receive-pack`` and ``--exec`` (and their abbreviations) on any subcommand, ``-u`` on
  fetch/clone/pull/ls-remote, ``-c``/``--config``/``--template`` on clone and init, ``rebase -x/--exec``,
  ``grep -O``, merge strategies other than git's built-in ones, ``--help`` (it starts a documentation viewer);
* subcommands that exist to run programs or serve (``difftool``, ``mergetool``, ``filter-branch``, ``daemon`` ...),
  ``submodule foreach`` and ``bisect run``;
* ``git config`` writes to keys that run programs or pull in other config (``alias.*``, ``core.sshCommand``,
  ``filter.*``, ``include.path`` ...), and ``--file``, ``--global``, ``--system`` and ``--edit``.

The commit identity is not supplied: configure ``user.name`` and ``user.email`` in the repository.
"""

from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass, field

from corral.errors import ExecTimeoutError, InvalidRequestError, ToolError
from corral.orchestrator.paths import confine, lexically_confined
from corral.providers.base import WORKSPACE_ROOT, ExecMode, ExecRequest, WorkspaceProvider
from corral.tools._common import Arguments, ToolLimits, cap_text
from corral.tools.shell import TIMEOUT_EXIT_CODE

__all__ = ["GIT_ENV", "GIT_SAFETY_CONFIG", "GitPlan", "check_git_args", "run_git"]

GIT_ENV: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_EDITOR": "true",
    "GIT_SEQUENCE_EDITOR": "true",
}
GIT_SAFETY_CONFIG: tuple[str, ...] = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "protocol.ext.allow=never",
    "protocol.fd.allow=never",
    "credential.helper=",
    "core.pager=cat",
    "core.editor=true",
    "sequence.editor=true",
)

_RUNS_PROGRAMS = "it makes git run other programs"

_GLOBAL_FLAGS = frozenset(
    {
        "--no-pager", "-P", "-p", "--paginate", "--bare", "--no-replace-objects", "--literal-pathspecs",
        "--glob-pathspecs", "--noglob-pathspecs", "--icase-pathspecs", "--no-optional-locks", "--version", "-v",
        "-h", "--html-path", "--man-path", "--info-path", "--no-lazy-fetch", "--no-advice",
    }
)  # fmt: skip
_REFUSED_GLOBAL = {
    "-c": "agent-supplied configuration could make git run other programs",
    "--config-env": "agent-supplied configuration could make git run other programs",
    "--exec-path": "it changes where git finds the programs it runs",
    "--super-prefix": "it is internal to git",
    "--list-cmds": "it is internal to git",
}

_REFUSED_SUBCOMMANDS = {
    "difftool": _RUNS_PROGRAMS,
    "mergetool": _RUNS_PROGRAMS,
    "filter-branch": "it runs shell commands given as arguments",
    "filter-repo": "it runs code given as arguments",
    "daemon": "it starts a server",
    "instaweb": "it starts a web server and a browser",
    "web--browse": "it starts a browser",
    "credential": "it talks to credential helper programs",
    "upload-pack": "it is the server side of fetch",
    "receive-pack": "it is the server side of push",
    "upload-archive": "it is the server side of archive",
    "http-backend": "it is a server",
    "shell": "it is a restricted login shell",
    "remote-ext": "it runs the command in its URL",
    "remote-fd": "it is a transport helper",
    "hook": "it runs hooks",
    "fsmonitor--daemon": "it starts a daemon",
    "send-email": "it runs mail programs",
}

_DANGEROUS_LONG = {
    "--upload-pack": "it names the program git runs for the other side of a fetch",
    "--receive-pack": "it names the program git runs for the other side of a push",
    "--exec": "it names a program for git to run",
}
_BUILTIN_STRATEGIES = frozenset({"ort", "recursive", "resolve", "octopus", "ours", "subtree"})
_UPLOAD_PACK_SHORT = {"u": "-u is --upload-pack here: it names a program for git to run"}


@dataclass(frozen=True)
class _Rules:
    """What one subcommand refuses beyond the options refused everywhere."""

    long: dict[str, str] = field(default_factory=dict)
    short: dict[str, str] = field(default_factory=dict)
    short_with_value: str = ""
    strategy_long: bool = False
    strategy_short: bool = False
    confined_long: tuple[str, ...] = ()


_TEMPLATE = "a template directory can bring hooks and config along"
_RULES: dict[str, _Rules] = {
    "clone": _Rules(
        long={"--config": "agent-supplied configuration could make git run other programs", "--template": _TEMPLATE},
        short={**_UPLOAD_PACK_SHORT, "c": "-c is --config here: agent-supplied configuration could run programs"},
        short_with_value="obucj",
        confined_long=("--separate-git-dir",),
    ),
    "init": _Rules(long={"--template": _TEMPLATE}, confined_long=("--separate-git-dir",)),
    "fetch": _Rules(short=_UPLOAD_PACK_SHORT, short_with_value="jo"),
    "pull": _Rules(short=_UPLOAD_PACK_SHORT, short_with_value="sXjo", strategy_long=True, strategy_short=True),
    "ls-remote": _Rules(short=_UPLOAD_PACK_SHORT, short_with_value="uo"),
    "rebase": _Rules(
        short={"x": "-x is --exec: it runs a shell command after each commit"},
        short_with_value="xsXC",
        strategy_long=True,
        strategy_short=True,
    ),
    "merge": _Rules(short_with_value="sXmF", strategy_long=True, strategy_short=True),
    "cherry-pick": _Rules(short_with_value="mX", strategy_long=True),
    "revert": _Rules(short_with_value="mX", strategy_long=True),
    "grep": _Rules(
        long={"--open-files-in-pager": "it opens the matches in a program it names"},
        short={"O": "-O opens the matches in a program it names"},
        short_with_value="efABCm",
    ),
}

# git config: keys whose values are programs, commands, or other config to load.
_DANGEROUS_KEYS = (
    "alias.*", "core.sshcommand", "core.pager", "core.editor", "core.fsmonitor", "core.hookspath", "core.askpass",
    "core.gitproxy", "core.worktree", "core.alternaterefscommand", "credential", "credential.*", "diff.external",
    "diff.*.textconv", "diff.*.command", "difftool.*", "merge.*.driver", "mergetool.*", "filter.*", "gpg.*",
    "sequence.editor", "uploadpack.*", "receivepack.*", "url.*", "include.*", "includeif.*", "pager.*",
    "submodule.*", "remote.*.uploadpack", "remote.*.receivepack", "remote.*.vcs", "tar.*.command",
    "trailer.*.command", "trailer.*.cmd", "imap.tunnel", "sendemail.*", "web.browser", "browser.*", "man.*",
    "interactive.difffilter", "protocol.*",
)  # fmt: skip
_DANGEROUS_SECTIONS = frozenset(k.split(".")[0] for k in _DANGEROUS_KEYS)
_CONFIG_REFUSED = {
    "--file": "only the repository's own config may be used",
    "-f": "only the repository's own config may be used",
    "--blob": "only the repository's own config may be used",
    "--global": "only the repository's own config may be used",
    "--system": "only the repository's own config may be used",
    "--edit": "it opens an editor",
    "-e": "it opens an editor",
}
_CONFIG_WITH_VALUE = frozenset({"--type", "--default", "--comment", "--file", "-f", "--blob"})
_CONFIG_READ = frozenset(
    {"--get", "--get-all", "--get-regexp", "--get-urlmatch", "--list", "-l", "--get-color", "--get-colorbool"}
)
_CONFIG_REMOVE = frozenset({"--unset", "--unset-all", "--remove-section"})
_CONFIG_ACTIONS = frozenset({"get", "list", "set", "unset", "rename-section", "remove-section", "edit"})


def _refuse(option: str, reason: str) -> ToolError:
    return ToolError(f"git: {option!r} is refused: {reason}", details={"refused": option, "reason": reason})


def _abbreviates(name: str, full: str) -> bool:
    """git accepts unambiguous prefixes of long options: ``--upl`` is ``--upload-pack``."""
    return len(name) >= 3 and full.startswith(name)


@dataclass
class GitPlan:
    """A checked command line: the agent's arguments and the paths that must stay inside ``/workspace``."""

    args: list[str]
    confined: list[tuple[str, str]] = field(default_factory=list)
    """``(option, absolute path)`` pairs still to be resolved through symlinks."""


def _inside(option: str, path: str) -> str:
    """The normalised absolute path, refused when it leaves ``/workspace`` lexically."""
    try:
        return lexically_confined(path, field_name=option)
    except InvalidRequestError as exc:
        raise _refuse(option, f"{path!r} is outside /workspace; git may only work inside the workspace") from exc


def _check_global(args: list[str], plan: GitPlan) -> int:
    """Check the options before the subcommand; return the subcommand's index."""
    base = WORKSPACE_ROOT
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if arg == "-C" or name in ("--git-dir", "--work-tree", "--namespace"):
            if not eq:
                i += 1
                if i >= len(args):
                    raise ToolError(f"git: {name} needs a value", details={"option": name})
                value = args[i]
            if name == "-C":
                base = _inside(name, posixpath.join(base, value))
                plan.confined.append((name, base))
            elif name != "--namespace":
                plan.confined.append((name, _inside(name, posixpath.join(base, value))))
        elif name in _REFUSED_GLOBAL or arg.startswith("--exec-path"):
            key = "--exec-path" if arg.startswith("--exec-path") else name
            raise _refuse(key, _REFUSED_GLOBAL[key])
        elif arg == "--help":
            raise _refuse(arg, "it starts a documentation viewer; use `git <command> -h`")
        elif arg not in _GLOBAL_FLAGS:
            raise _refuse(arg, "it is not a global option this tool allows")
        i += 1
    return i


def _check_strategy(option: str, value: str) -> None:
    if value not in _BUILTIN_STRATEGIES:
        raise _refuse(
            f"{option} {value}",
            f"only git's built-in merge strategies ({', '.join(sorted(_BUILTIN_STRATEGIES))}) may be used; "
            "others are external programs",
        )


def _value(arg_value: str, has_eq: bool, rest: list[str], i: int) -> tuple[str, int]:
    """An option's value: after ``=`` (or stuck), else the next argument."""
    if has_eq or arg_value or i + 1 >= len(rest):
        return arg_value, i
    return rest[i + 1], i + 1


def _check_long(arg: str, rest: list[str], i: int, rules: _Rules, plan: GitPlan) -> int:
    name, eq, value = arg.partition("=")
    for full, reason in (*_DANGEROUS_LONG.items(), *rules.long.items()):
        if _abbreviates(name, full):
            raise _refuse(full, reason)
    if _abbreviates(name, "--help"):
        raise _refuse("--help", "it starts a documentation viewer; use -h")
    if rules.strategy_long and _abbreviates(name, "--strategy"):
        value, i = _value(value, bool(eq), rest, i)
        _check_strategy("--strategy", value)
    for full in rules.confined_long:
        if _abbreviates(name, full):
            value, i = _value(value, bool(eq), rest, i)
            plan.confined.append((full, _inside(full, posixpath.join(WORKSPACE_ROOT, value))))
    return i


def _check_short(arg: str, rest: list[str], i: int, rules: _Rules) -> int:
    """A cluster such as ``-qu cmd`` or ``-xcmd``: flags up to the first one that takes a value."""
    for pos, flag in enumerate(arg[1:], start=1):
        if flag in rules.short:
            raise _refuse(f"-{flag}", rules.short[flag])
        if flag in rules.short_with_value:
            value, i = _value(arg[pos + 1 :], False, rest, i)
            if flag == "s" and rules.strategy_short:
                _check_strategy("-s", value)
            break
    return i


def _check_options(sub: str, rest: list[str], plan: GitPlan) -> None:
    rules = _RULES.get(sub, _Rules())
    i = 0
    while i < len(rest) and rest[i] != "--":
        arg = rest[i]
        if arg.startswith("--"):
            i = _check_long(arg, rest, i, rules, plan)
        elif arg.startswith("-") and len(arg) > 1:
            i = _check_short(arg, rest, i, rules)
        i += 1


def _first_positional(rest: list[str]) -> str | None:
    return next((a for a in rest if not a.startswith("-")), None)


def _dangerous_key(key: str) -> bool:
    lowered = key.lower()
    return any(fnmatch.fnmatchcase(lowered, pattern) for pattern in _DANGEROUS_KEYS)


def _check_config(rest: list[str]) -> None:
    flags: list[str] = []
    positionals: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        name = arg.partition("=")[0] if arg.startswith("--") else arg[:2] if arg.startswith("-") else arg
        for full, reason in _CONFIG_REFUSED.items():
            if name == full or (full.startswith("--") and _abbreviates(name, full)):
                raise _refuse(full, reason)
        if arg.startswith("-") and arg != "-":
            flags.append(name)
            if name in _CONFIG_WITH_VALUE and arg == name:
                i += 1
        else:
            positionals.append(arg)
        i += 1
    action = positionals.pop(0) if positionals and positionals[0] in _CONFIG_ACTIONS else None
    if action == "edit":
        raise _refuse("config edit", "it opens an editor")
    if action in ("get", "list") or _CONFIG_READ.intersection(flags):
        return
    if action in ("unset", "remove-section") or _CONFIG_REMOVE.intersection(flags):
        return  # removing configuration never adds a program to run
    if action == "rename-section" or any(_abbreviates(f, "--rename-section") for f in flags):
        if len(positionals) >= 2 and positionals[1].split(".")[0].lower() in _DANGEROUS_SECTIONS:
            raise _refuse(
                f"config --rename-section {positionals[1]}",
                f"keys in the {positionals[1].split('.')[0]!r} section can make git run programs",
            )
        return
    writes = action == "set" or {"--add", "--replace-all"}.intersection(flags) or len(positionals) >= 2
    if writes and positionals and _dangerous_key(positionals[0]):
        raise _refuse(
            f"config {positionals[0]}",
            "this key makes git run programs, load other configuration or leave /workspace",
        )


def check_git_args(args: list[str]) -> GitPlan:
    """Check the agent's git arguments without touching the workspace.

    Raises:
        ToolError: naming the refused option or subcommand and why it is refused.
    """
    plan = GitPlan(list(args))
    for arg in args:
        lowered = arg.lower()
        if "ext::" in lowered or "fd::" in lowered:
            raise _refuse(arg, "the ext:: and fd:: transports run arbitrary commands")
    start = _check_global(args, plan)
    if start >= len(args):
        return plan
    sub, rest = args[start], args[start + 1 :]
    if sub in _REFUSED_SUBCOMMANDS or sub.startswith("credential-"):
        raise _refuse(sub, _REFUSED_SUBCOMMANDS.get(sub, "it talks to credential helper programs"))
    listing = {"-a", "--all", "-g", "--guides", "-c", "--config"}.intersection(rest)
    if sub == "help" and not listing and (_first_positional(rest) or set(rest) - {"--verbose"}):
        raise _refuse("help", "it starts a documentation viewer; use `git <command> -h` or `git help -a`")
    if sub == "submodule" and _first_positional(rest) == "foreach":
        raise _refuse("submodule foreach", "it runs a shell command in every submodule")
    if sub == "bisect" and _first_positional(rest) == "run":
        raise _refuse("bisect run", "it runs a command at every step")
    if sub == "config":
        _check_config(rest)
    _check_options(sub, rest, plan)
    return plan


async def run_git(provider: WorkspaceProvider, workspace_id: str, raw: object, limits: ToolLimits) -> dict[str, object]:
    """``git {args: [...]}`` -> ``{exit_code, stdout, stderr}``; a nonzero exit is a result, not an error."""
    plan = check_git_args(Arguments("git", raw, ("args",)).string_list("args"))
    for option, path in plan.confined:
        try:
            await confine(provider, workspace_id, path, field_name=option)
        except InvalidRequestError as exc:
            raise _refuse(option, exc.message) from exc
    safety = [item for setting in GIT_SAFETY_CONFIG for item in ("-c", setting)]
    request = ExecRequest(
        "git",
        ("--no-pager", *safety, *plan.args),
        mode=ExecMode.ARGV,
        cwd=WORKSPACE_ROOT,
        env=GIT_ENV,
        timeout_s=limits.git_timeout_s,
    )
    try:
        result = await provider.exec(workspace_id, request)
    except ExecTimeoutError as exc:
        stdout, _ = cap_text(exc.stdout, limits.output_chars)
        stderr, _ = cap_text(exc.stderr, limits.output_chars)
        note = f"[git timed out after {limits.git_timeout_s:g} s and was killed]"
        return {"exit_code": TIMEOUT_EXIT_CODE, "stdout": stdout, "stderr": f"{stderr}\n{note}".lstrip("\n")}
    stdout, _ = cap_text(result.stdout, limits.output_chars, dropped_by_provider=result.truncated)
    stderr, _ = cap_text(result.stderr, limits.output_chars, dropped_by_provider=result.truncated)
    return {"exit_code": result.exit_code, "stdout": stdout, "stderr": stderr}
