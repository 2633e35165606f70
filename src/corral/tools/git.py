"""The ``git`` tool: git in argv mode in ``/workspace``, never running another program nor writing outside.

git runs as root in the workspace sandbox, and many of its settings name programs: hooks, filters, diff and merge
drivers, pagers, editors, credential helpers, transports. The agent can write any file in /workspace except inside
``.git`` directories (the write tool refuses those), so it can plant configuration, hooks and symlinks anywhere else.
Four layers keep git to itself:

1. :func:`check_git_args` (no I/O) refuses, with a :class:`~corral.errors.ToolError` naming the argument and why:

   * subcommands outside :data:`ALLOWED_SUBCOMMANDS`, so an alias or an external ``git-*`` program never runs;
   * global options other than a few flags (``-c``, ``--config-env``, ``--exec-path``, ``--namespace``,
     ``--super-prefix``, ``--list-cmds``, ``--bare`` ...); ``-C`` and ``--work-tree`` must stay inside /workspace,
     and ``--git-dir`` must also name a ``.git`` directory or one inside it;
   * ``--output`` (any abbreviation) everywhere, and ``--upload-pack``, ``--receive-pack``, ``--exec``,
     ``--recurse-submodules``, ``--separate-git-dir``; ``clone -u/-c/--template``, ``init --bare/--template``,
     ``rebase -x``, ``grep -O``, ``archive --remote``, ``apply --unsafe-paths``, ``bisect run``,
     ``bisect visualize <program>``, merge strategies other than git's own and ``--help`` (a documentation viewer);
   * ``ext::`` and ``fd::`` URLs anywhere;
   * every argument that is a local path leaving /workspace: absolute and outside it (also as ``--opt=/path`` or a
     ``file://`` URL), or relative and climbing out with ``..`` from where git runs (after ``-C``). Messages,
     patterns and formats (``-m``, ``-e``, ``--grep=`` ...) are text, not paths;
   * paths git writes to (``init`` and ``clone`` targets, ``worktree`` paths, ``mv`` arguments, ``format-patch -o``,
     ``archive -o``, ``apply --build-fake-ancestor``, ``--work-tree``) that lie in a ``.git`` directory:
     ``git mv -f x .git/config`` would otherwise replace the configuration;
   * ``git config`` writes to keys that run programs or load other configuration.

2. ``-C``, ``--git-dir``, ``--work-tree`` and the written paths (with the directory ``git clone <url>`` names itself)
   are resolved through the workspace's symlinks: they must stay inside /workspace, written paths must not resolve
   into a ``.git`` directory, and a ``format-patch -o`` directory must hold no symlink (git names the files in it).

3. Except for ``init``, ``clone``, ``config``, ``version`` and ``help``, two read-only git calls in the same context
   (the agent's global options, the environment below) find the repository and its configuration keys:
   ``git rev-parse --absolute-git-dir --git-common-dir --show-toplevel`` and
   ``git config --list --name-only --show-scope -z`` (reading configuration runs nothing). The call is refused when
   the git directory is not a ``.git`` directory inside /workspace (any other directory can be written with the
   write tool, so its hooks, configuration, rebase todo lists and symlinks would be the agent's), when the work tree
   (``core.worktree``) leaves /workspace or lies in a ``.git`` directory, and when the configuration holds keys that
   cannot be overridden: ``include.path``/``includeIf.*.path`` (the included file can change after the check) and
   ``remote.<name>.uploadpack``/``receivepack`` (git keeps the first value it reads). Every other key found that
   names a program under a name git cannot know in advance gets an override, checked on git 2.39:

   * ``filter.<name>.clean``/``smudge``/``process`` empty (no filter) and ``filter.<name>.required`` false;
   * ``diff.<name>.textconv``/``command``, ``diff.external``, ``merge.<name>.driver``, ``trailer.<name>.command``/
     ``cmd``, ``tar.<format>.command`` and ``gpg.<format>.program`` empty: git then tries to start a program named
     ``""``, which does not exist, so the diff, merge or archive fails instead of running anything (an empty value
     does not switch these off, so :data:`GIT_SAFETY_CONFIG` cannot set them for every repository);
   * ``alias.<name>`` empty (git refuses to expand it), ``credential.<url>.helper`` empty (it empties the helper
     list), ``remote.<name>.vcs`` empty (an unnamed transport is not allowed) and ``http.<url>.saveCookies`` false.

   The stderr of such a call ends with a note naming the keys (aliases aside, which never run here anyway).

4. The command runs as ``git --no-pager <agent args>`` with :data:`GIT_ENV` (no system or global configuration or
   attributes, no prompts, ``:`` as editor (git runs none), ``cat`` as pager, ``GIT_SSH_COMMAND=ssh`` and
   ``GIT_PROXY_COMMAND=`` (both win over ``core.sshCommand``/``core.gitProxy``), no templates, and
   ``GIT_ALLOW_PROTOCOL`` (it wins over every ``protocol.*`` key) set to https, http, ssh and git, plus file for
   ``clone``/``fetch``/``pull``/``ls-remote``/``remote`` only: git clears ``GIT_CONFIG_*`` for the upload-pack and
   receive-pack it starts in another local repository, and a receive-pack there would run that repository's hooks
   and settings, so a local push is refused by git. The overrides from step 3 and :data:`GIT_SAFETY_CONFIG` (hooks
   path ``/dev/null``, no fsmonitor, no alternate-refs command, no credential helper, signing programs empty, the
   built-in gzip for tgz archives, ``safe.bareRepository=explicit``, no submodule recursion, no autocorrect ...)
   travel as ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_<n>``/``GIT_CONFIG_VALUE_<n>``: the command scope, read after
   every file (so it wins) and inherited by the git processes git starts, with no ``-c`` on the command line.

Steps 2 and 3 are checks before use: a change made between them and the command (by another session on the same
workspace, or a shell) is not seen. Within one session tool calls are queued, and nothing the git tool itself or the
write tool can do changes what a ``.git`` directory holds in a dangerous way.

The commit identity is not supplied: configure ``user.name`` and ``user.email`` in the repository.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.errors import ExecTimeoutError, FileOperationError, InvalidRequestError, ToolError
from corral.orchestrator.paths import confine, lexically_confined
from corral.providers.base import WORKSPACE_ROOT, ExecMode, ExecRequest, ExecResult, WorkspaceCalls
from corral.tools._common import Arguments, ToolLimits, cap_text
from corral.tools.shell import TIMEOUT_EXIT_CODE

__all__ = ["ALLOWED_SUBCOMMANDS", "GIT_ENV", "GIT_SAFETY_CONFIG", "GitPlan", "check_git_args", "run_git"]

_NETWORK_PROTOCOLS = "https:http:ssh:git"
_READS_LOCAL_REPOSITORIES = frozenset({"clone", "fetch", "pull", "ls-remote", "remote"})
"""Subcommands that may read another repository in /workspace over git's local ("file") transport."""

GIT_ENV: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    "XDG_CONFIG_HOME": "/nonexistent",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_EDITOR": ":",
    "GIT_SEQUENCE_EDITOR": ":",
    "GIT_SSH_COMMAND": "ssh",
    "GIT_SSH_VARIANT": "ssh",
    "GIT_PROXY_COMMAND": "",
    "GIT_TEMPLATE_DIR": "",
    "GIT_ALLOW_PROTOCOL": _NETWORK_PROTOCOLS,
    "LC_ALL": "C.UTF-8",
}
"""The environment of every git call (on top of the sandbox's); ``LC_ALL`` keeps git's messages in English."""

GIT_SAFETY_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.alternateRefsCommand", ""),
    ("core.pager", "cat"),
    ("core.editor", ":"),
    ("sequence.editor", ":"),
    ("core.askPass", ""),
    ("credential.helper", ""),
    ("interactive.diffFilter", ""),
    ("merge.default", "text"),
    ("tar.tgz.command", "git archive gzip"),
    ("tar.tar.gz.command", "git archive gzip"),
    ("gpg.program", ""),
    ("gpg.openpgp.program", ""),
    ("gpg.x509.program", ""),
    ("gpg.ssh.program", ""),
    ("gpg.ssh.defaultKeyCommand", ""),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("tag.forceSignAnnotated", "false"),
    ("push.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("merge.verifySignatures", "false"),
    ("protocol.ext.allow", "never"),
    ("protocol.fd.allow", "never"),
    ("help.autocorrect", "0"),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("push.recurseSubmodules", "no"),
    ("http.saveCookies", "false"),
    ("gc.autoDetach", "false"),
    ("safe.bareRepository", "explicit"),
)
"""Overrides for every call: the settings git knows by a fixed name that start programs (or background work)."""

ALLOWED_SUBCOMMANDS = frozenset(
    {
        "add", "annotate", "apply", "archive", "bisect", "blame", "branch", "cat-file", "check-attr",
        "check-ignore", "check-mailmap", "check-ref-format", "checkout", "cherry", "cherry-pick", "clean", "clone",
        "commit", "config", "count-objects", "describe", "diff", "diff-files", "diff-index", "diff-tree", "fetch",
        "for-each-ref", "format-patch", "fsck", "gc", "grep", "hash-object", "help", "init", "log", "ls-files",
        "ls-remote", "ls-tree", "merge", "merge-base", "merge-tree", "mv", "name-rev", "notes", "prune", "pull",
        "push", "range-diff", "rebase", "reflog", "remote", "repack", "reset", "restore", "rev-list", "rev-parse",
        "revert", "rm", "shortlog", "show", "show-branch", "show-ref", "stash", "status", "switch", "tag",
        "update-index", "var", "version", "whatchanged", "worktree",
    }
)  # fmt: skip
"""The git subcommands the tool runs; any other name (an alias, ``submodule``, ``bundle`` ...) is refused."""

_NO_REPOSITORY_CHECK = frozenset({"init", "clone", "config", "version", "help"})
"""Subcommands run without inspecting the current repository: they create one, only read or write its
configuration, or use none."""

_RUNS_PROGRAMS = "it makes git run other programs"

_GLOBAL_FLAGS = frozenset(
    {
        "--no-pager", "-P", "--no-replace-objects", "--literal-pathspecs", "--glob-pathspecs",
        "--noglob-pathspecs", "--icase-pathspecs", "--no-optional-locks", "--version", "-v", "-h", "--html-path",
        "--man-path", "--info-path", "--no-lazy-fetch", "--no-advice",
    }
)  # fmt: skip
_REFUSED_GLOBAL = {
    "-c": "agent-supplied configuration could make git run other programs",
    "--config-env": "agent-supplied configuration could make git run other programs",
    "--exec-path": "it changes where git finds the programs it runs",
    "--namespace": "it changes which references git sees and writes",
    "--super-prefix": "it is internal to git",
    "--list-cmds": "it is internal to git",
    "--bare": "it makes the current directory the git directory; use --git-dir with a .git directory",
    "-p": "a pager is never used here",
    "--paginate": "a pager is never used here",
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
    "submodule": "it runs git in nested repositories this tool has not checked, and its update form runs commands",
    "maintenance": "it schedules background jobs",
    "for-each-repo": "it runs the git commands its configuration names",
    "bundle": "it reads and writes bundle files outside the repository",
    "fast-import": "it writes the files its input names",
}

_DANGEROUS_LONG = {
    "--upload-pack": "it names the program git runs for the other side of a fetch",
    "--receive-pack": "it names the program git runs for the other side of a push",
    "--exec": "it names a program for git to run",
    "--output": "it writes git's output to a file; the output is returned to you instead (archive takes -o <file>)",
    "--recurse-submodules": "it runs git in nested repositories this tool has not checked",
    "--separate-git-dir": "a git directory outside .git could be changed with the write tool",
}
_BUILTIN_STRATEGIES = frozenset({"ort", "recursive", "resolve", "octopus", "ours", "subtree"})
_UPLOAD_PACK_SHORT = {"u": "-u is --upload-pack here: it names a program for git to run"}

_TEXT_LONG = frozenset(
    {
        "--message", "--grep", "--author", "--committer", "--format", "--pretty", "--date", "--since", "--until",
        "--after", "--before", "--trailer", "--subject-prefix", "--signature", "--reason", "--word-diff-regex",
        "--color-words", "--in-reply-to", "--to", "--cc", "--add-header", "--prefix", "--src-prefix",
        "--dst-prefix", "--line-prefix", "--exclude", "--include", "--regexp", "--branch", "--origin",
        "--initial-branch", "--strategy-option", "--cleanup", "--fixup", "--squash", "--sort", "--points-at",
        "--contains", "--no-contains", "--merged", "--no-merged", "--term-good", "--term-bad", "--term-old",
        "--term-new", "--default", "--comment", "--type", "--encoding", "--ignore-rev", "--shallow-exclude",
        "--server-option", "--filter", "--rerere-autoupdate", "--set-upstream-to", "--onto", "--refspec",
        "--shallow-since", "--bundle-uri", "--depth", "--jobs", "--object-format", "--notes", "--relative",
        "--output-indicator-new", "--output-indicator-old", "--output-indicator-context", "--color-moved",
        "--anchored", "--find-object", "--pickaxe-regex", "--decorate-refs", "--decorate-refs-exclude",
    }
)  # fmt: skip
"""Long options whose ``=value`` is text (a message, pattern, format, name) rather than a path."""


@dataclass(frozen=True)
class _Rules:
    """What one subcommand refuses, and how its options take values, beyond what is checked everywhere."""

    long: Mapping[str, str] = field(default_factory=dict)
    """Refused long options (and their abbreviations) and why."""
    short: Mapping[str, str] = field(default_factory=dict)
    """Refused short flags and why."""
    short_with_value: str = ""
    """Short flags that take a value: the rest of their cluster, or the next argument."""
    short_text: str = ""
    """Those of ``short_with_value`` whose value is text, not a path."""
    short_output: str = ""
    """Those of ``short_with_value`` whose value is a path git writes to."""
    long_with_value: frozenset[str] = frozenset()
    """Long options that take the next argument as their value when written without ``=``."""
    long_output: tuple[str, ...] = ()
    """Long options (abbreviations too) whose value is a path git writes to."""
    output_is_directory: bool = False
    """The written paths are directories git fills with files it names itself."""
    strategy_long: bool = False
    strategy_short: bool = False


_TEMPLATE = "a template directory can bring hooks and config along"
_CONFIG_ARG = "agent-supplied configuration could make git run other programs"
_LOG_LIKE = _Rules(short_with_value="SGLO", short_text="SGL")
_CLONE_WITH_VALUE = frozenset(
    {
        "--origin", "--branch", "--depth", "--reference", "--reference-if-able", "--shallow-since",
        "--shallow-exclude", "--server-option", "--filter", "--bundle-uri", "--jobs",
    }
)  # fmt: skip
_RULES: dict[str, _Rules] = {
    "clone": _Rules(
        long={"--config": _CONFIG_ARG, "--template": _TEMPLATE, "--recursive": "it clones submodules too"},
        short={**_UPLOAD_PACK_SHORT, "c": "-c is --config here: agent-supplied configuration could run programs"},
        short_with_value="obucj",
        short_text="obj",
        long_with_value=_CLONE_WITH_VALUE,
    ),
    "init": _Rules(
        long={
            "--template": _TEMPLATE,
            "--bare": "a bare repository outside a .git directory could be changed with the write tool",
        },
        short_with_value="b",
        short_text="b",
        long_with_value=frozenset({"--initial-branch", "--object-format"}),
    ),
    "fetch": _Rules(short=_UPLOAD_PACK_SHORT, short_with_value="jo", short_text="jo"),
    "pull": _Rules(
        short=_UPLOAD_PACK_SHORT, short_with_value="sXjo", short_text="Xjo", strategy_long=True, strategy_short=True
    ),
    "ls-remote": _Rules(short=_UPLOAD_PACK_SHORT, short_with_value="uo", short_text="o"),
    "rebase": _Rules(
        short={"x": "-x is --exec: it runs a shell command after each commit"},
        short_with_value="xsXC",
        short_text="XC",
        strategy_long=True,
        strategy_short=True,
    ),
    "merge": _Rules(short_with_value="sXmF", short_text="Xm", strategy_long=True, strategy_short=True),
    "cherry-pick": _Rules(short_with_value="mX", short_text="mX", strategy_long=True),
    "revert": _Rules(short_with_value="mX", short_text="mX", strategy_long=True),
    "commit": _Rules(short_with_value="mFCct", short_text="mCc"),
    "tag": _Rules(short_with_value="mFu", short_text="mu"),
    "notes": _Rules(short_with_value="mFCc", short_text="mCc"),
    "stash": _Rules(short_with_value="m", short_text="m"),
    "grep": _Rules(
        long={"--open-files-in-pager": "it opens the matches in a program it names"},
        short={"O": "-O opens the matches in a program it names"},
        short_with_value="efABCm",
        short_text="eABCm",
    ),
    "blame": _Rules(short_with_value="LS", short_text="L"),
    "annotate": _Rules(short_with_value="LS", short_text="L"),
    "branch": _Rules(short_with_value="u", short_text="u"),
    "checkout": _Rules(short_with_value="bB", short_text="bB"),
    "switch": _Rules(short_with_value="cC", short_text="cC"),
    "restore": _Rules(short_with_value="s", short_text="s"),
    "clean": _Rules(short_with_value="e", short_text="e"),
    "remote": _Rules(short_with_value="tm", short_text="tm"),
    "worktree": _Rules(short_with_value="bB", short_text="bB", long_with_value=frozenset({"--reason", "--orphan"})),
    "format-patch": _Rules(
        short_with_value="SGLOov",
        short_text="SGLv",
        short_output="o",
        long_output=("--output-directory",),
        output_is_directory=True,
    ),
    "archive": _Rules(
        long={"--remote": "it runs git-upload-archive in the repository it names, unchecked"},
        short_with_value="o",
        short_output="o",
    ),
    "apply": _Rules(
        long={"--unsafe-paths": "it lets a patch write outside the repository"},
        short_with_value="pC",
        short_text="pC",
        long_output=("--build-fake-ancestor",),
    ),
    **dict.fromkeys(
        ("log", "show", "diff", "whatchanged", "diff-tree", "diff-files", "diff-index", "range-diff"), _LOG_LIKE
    ),
}

# git config: keys whose values are programs, commands, or other config to load.
_DANGEROUS_KEYS = (
    "alias.*", "core.sshcommand", "core.pager", "core.editor", "core.fsmonitor", "core.hookspath", "core.askpass",
    "core.gitproxy", "core.worktree", "core.alternaterefscommand", "credential", "credential.*", "diff.external",
    "diff.*.textconv", "diff.*.command", "difftool.*", "merge.*.driver", "merge.default", "mergetool.*",
    "filter.*", "gpg.*", "sequence.editor", "uploadpack.*", "receivepack.*", "url.*", "include.*", "includeif.*",
    "pager.*", "submodule.*", "remote.*.uploadpack", "remote.*.receivepack", "remote.*.vcs", "tar.*.command",
    "trailer.*.command", "trailer.*.cmd", "imap.tunnel", "sendemail.*", "web.browser", "browser.*", "man.*",
    "interactive.difffilter", "protocol.*", "ssh.variant", "init.templatedir", "safe.*", "http.savecookies",
    "http.*.savecookies", "http.cookiefile", "http.*.cookiefile", "help.autocorrect", "maintenance.*",
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


def _in_git_dir(path: str) -> bool:
    return ".git" in path.split("/")


@dataclass
class GitPlan:
    """A checked command line: the agent's arguments and the paths to check in the workspace before running it."""

    args: list[str]
    confined: list[tuple[str, str]] = field(default_factory=list)
    """``(option, absolute path)`` pairs of ``-C``/``--git-dir``/``--work-tree``, still to be resolved through
    symlinks."""
    outputs: list[tuple[str, str]] = field(default_factory=list)
    """``(argument, absolute path)`` pairs git writes to: once resolved they must not lie in a ``.git`` directory."""
    output_dirs: list[tuple[str, str]] = field(default_factory=list)
    """Those of ``outputs`` that are directories git writes files of its own naming into: they must hold no symlink
    (``format-patch -o d`` would write ``d/0001-<subject>.patch`` through one)."""
    subcommand: str | None = None
    start: int = 0
    """Index of the subcommand in ``args``: what comes before are the global options."""


def _inside(option: str, path: str) -> str:
    """The normalised absolute path, refused when it leaves ``/workspace`` lexically."""
    try:
        return lexically_confined(path, field_name=option)
    except InvalidRequestError as exc:
        raise _refuse(option, f"{path!r} is outside /workspace; git may only work inside the workspace") from exc


def _check_global(args: list[str], plan: GitPlan) -> str:
    """Check the options before the subcommand; set ``plan.start`` and return the directory git runs in."""
    base = WORKSPACE_ROOT
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if arg == "-C" or name in ("--git-dir", "--work-tree"):
            if not eq:
                i += 1
                if i >= len(args):
                    raise ToolError(f"git: {name} needs a value", details={"option": name})
                value = args[i]
            path = _inside(name, posixpath.join(base, value))
            if name == "-C":
                base = path
            elif name == "--git-dir" and not _in_git_dir(path):
                raise _refuse(
                    name,
                    f"{value!r} is not a .git directory; git may only use a repository whose git directory is a "
                    ".git directory (any other directory can be changed with the write tool)",
                )
            elif name == "--work-tree":
                if _in_git_dir(path):
                    raise _refuse(name, f"{value!r} lies in a .git directory; git would write its files there")
                plan.outputs.append((name, path))
            plan.confined.append((name, path))
        elif name in _REFUSED_GLOBAL or arg.startswith("--exec-path"):
            key = "--exec-path" if arg.startswith("--exec-path") else name
            raise _refuse(key, _REFUSED_GLOBAL[key])
        elif arg == "--help":
            raise _refuse(arg, "it starts a documentation viewer; use `git <command> -h`")
        elif arg not in _GLOBAL_FLAGS:
            raise _refuse(arg, "it is not a global option this tool allows")
        i += 1
    plan.start = i
    return base


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


def _local_path(value: str) -> str | None:
    """The local path an argument names when it looks like one that could leave /workspace, else None."""
    if value[:7].lower() == "file://":
        rest = value[7:]
        return rest if rest.startswith("/") else "/" + rest.partition("/")[2]
    if value.startswith("/") or ".." in value.split("/"):
        return value
    return None


def _check_path(label: str, value: str, base: str) -> None:
    """Refuse ``value`` when it is a local path leaving /workspace (relative ones start at ``base``)."""
    path = _local_path(value)
    if path is None:
        return
    try:
        lexically_confined(posixpath.join(base, path), field_name=label)
    except InvalidRequestError as exc:
        # text given as a separate argument (`--grep /x`) is taken for a path; the --name=value form is not
        hint = " (text that is not a path goes in its option's --name=value form)" if label == value else ""
        raise _refuse(
            label, f"{value!r} is a path outside /workspace; git may only work inside the workspace{hint}"
        ) from exc


def _add_output(plan: GitPlan, label: str, value: str, base: str, *, directory: bool = False) -> None:
    """Record a path git writes to; refused when it leaves /workspace or lies in a ``.git`` directory."""
    path = _inside(label, posixpath.join(base, value))
    if _in_git_dir(path):
        raise _refuse(label, f"{value!r} lies in a .git directory; git would write there")
    plan.outputs.append((label, path))
    if directory:
        plan.output_dirs.append((label, path))


@dataclass
class _Scanner:
    """One pass over a subcommand's arguments: checks every option and path-like argument, collects positionals."""

    sub: str
    rest: list[str]
    plan: GitPlan
    base: str
    """The directory git runs in (after ``-C``); relative paths start there."""
    rules: _Rules = field(init=False)
    positionals: list[str] = field(default_factory=list)
    pattern_given: bool = False
    """grep: a pattern came with -e/-f/--regexp/--file, so the first positional is not one."""

    def __post_init__(self) -> None:
        self.rules = _RULES.get(self.sub, _Rules())

    def run(self) -> list[str]:
        options_ended = False
        i = 0
        while i < len(self.rest):
            arg = self.rest[i]
            if options_ended or arg == "-" or not arg.startswith("-"):
                self.positionals.append(arg)
            elif arg in ("--", "--end-of-options"):
                options_ended = True
            elif arg.startswith("--"):
                i = self._long(arg, i)
            else:
                i = self._short(arg, i)
            i += 1
        text_first = self.sub == "grep" and not self.pattern_given
        for index, value in enumerate(self.positionals):
            if not (text_first and index == 0):
                _check_path(value, value, self.base)
        return self.positionals

    def _long(self, arg: str, i: int) -> int:
        rules = self.rules
        name, eq, value = arg.partition("=")
        for full, reason in (*_DANGEROUS_LONG.items(), *rules.long.items()):
            if _abbreviates(name, full):
                raise _refuse(full, reason)
        if _abbreviates(name, "--help"):
            raise _refuse("--help", "it starts a documentation viewer; use -h")
        if _abbreviates(name, "--submodule") and value != "short":
            raise _refuse("--submodule", "it runs git in nested repositories this tool has not checked; use =short")
        if rules.strategy_long and _abbreviates(name, "--strategy"):
            value, i = _value(value, bool(eq), self.rest, i)
            _check_strategy("--strategy", value)
            return i
        for full in rules.long_output:
            if _abbreviates(name, full):
                value, i = _value(value, bool(eq), self.rest, i)
                _add_output(self.plan, full, value, self.base, directory=rules.output_is_directory)
                return i
        self.pattern_given = self.pattern_given or name in ("--regexp", "--file")
        if not eq and name in rules.long_with_value:
            value, i = _value("", False, self.rest, i)
        elif not eq:
            return i
        if name not in _TEXT_LONG:
            _check_path(name, value, self.base)
        return i

    def _short(self, arg: str, i: int) -> int:
        """A cluster such as ``-qu cmd`` or ``-xcmd``: flags up to the first one that takes a value."""
        rules = self.rules
        for pos, flag in enumerate(arg[1:], start=1):
            if flag in rules.short:
                raise _refuse(f"-{flag}", rules.short[flag])
            if flag in rules.short_with_value:
                value, i = _value(arg[pos + 1 :], False, self.rest, i)
                self.pattern_given = self.pattern_given or flag in ("e", "f")
                if flag == "s" and rules.strategy_short:
                    _check_strategy("-s", value)
                elif flag in rules.short_output:
                    _add_output(self.plan, f"-{flag}", value, self.base, directory=rules.output_is_directory)
                elif flag not in rules.short_text:
                    _check_path(f"-{flag}", value, self.base)
                break
        return i


def _clone_directory(source: str, *, bare: bool) -> str:
    """The directory ``git clone <source>`` creates, named as git names it (``git_url_basename``)."""
    start = source.partition("://")[2] if "://" in source else source
    host, slash, path = start.partition("/")
    start = host.rpartition("@")[2] + slash + path
    name = start.rstrip("/ \t\n")
    if len(name) > 5 and name.endswith("/.git"):
        name = name[:-5].rstrip("/")
    name = name[max(name.rfind("/"), name.rfind(":")) + 1 :].removesuffix(".git")
    name = " ".join(name.split())  # git folds runs of whitespace and control characters into one space
    if not name:
        return "."
    return f"{name}.git" if bare else name


def _check_outputs(sub: str, positionals: list[str], plan: GitPlan, base: str) -> None:
    """Record the positional arguments git writes to: new repositories, worktrees, moved files."""
    targets: list[str] = []
    if sub == "init":
        targets = positionals or ["."]
    elif sub == "clone" and len(positionals) >= 2:
        targets = positionals[1:]
    elif sub == "clone" and positionals:
        targets = [_clone_directory(positionals[0], bare="--bare" in plan.args or "--mirror" in plan.args)]
    elif sub == "mv":
        targets = positionals
    elif sub == "worktree" and positionals[:1] == ["add"]:
        targets = positionals[1:2]
    elif sub == "worktree" and positionals[:1] == ["move"]:
        targets = positionals[2:3]
    for target in targets:
        _add_output(plan, target, target, base)


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


def _check_subcommand(sub: str, rest: list[str]) -> None:
    """Refuse subcommands (and forms of them) that run programs or are not on the allowlist."""
    if sub in _REFUSED_SUBCOMMANDS or sub.startswith("credential-"):
        if sub == "submodule" and _first_positional(rest) == "foreach":
            raise _refuse("submodule foreach", "it runs a shell command in every submodule")
        raise _refuse(sub, _REFUSED_SUBCOMMANDS.get(sub, "it talks to credential helper programs"))
    if sub not in ALLOWED_SUBCOMMANDS:
        raise _refuse(
            sub,
            "it is not a git command this tool runs (aliases and other programs never run); allowed: "
            + ", ".join(sorted(ALLOWED_SUBCOMMANDS)),
        )
    listing = {"-a", "--all", "-g", "--guides", "-c", "--config"}.intersection(rest)
    if sub == "help" and not listing and (_first_positional(rest) or set(rest) - {"--verbose"}):
        raise _refuse("help", "it starts a documentation viewer; use `git <command> -h` or `git help -a`")
    if sub == "bisect":
        positionals = [a for a in rest if not a.startswith("-")]
        if positionals[:1] == ["run"]:
            raise _refuse("bisect run", "it runs a command at every step")
        if positionals[:1] in (["visualize"], ["view"]) and len(positionals) > 1:
            raise _refuse(f"bisect {positionals[0]} {positionals[1]}", "it runs the program it names")


def check_git_args(args: list[str]) -> GitPlan:
    """Check the agent's git arguments without touching the workspace.

    Raises:
        ToolError: naming the refused argument or subcommand and why it is refused.
    """
    plan = GitPlan(list(args))
    for arg in args:
        lowered = arg.lower()
        if "ext::" in lowered or "fd::" in lowered:
            raise _refuse(arg, "the ext:: and fd:: transports run arbitrary commands")
    base = _check_global(args, plan)
    if plan.start >= len(args):
        return plan
    sub, rest = args[plan.start], args[plan.start + 1 :]
    plan.subcommand = sub
    _check_subcommand(sub, rest)
    if sub == "config":
        _check_config(rest)
    positionals = _Scanner(sub, rest, plan, base).run()
    _check_outputs(sub, positionals, plan, base)
    return plan


# --- running ----------------------------------------------------------------------------------------------------


def _config_env(overrides: list[tuple[str, str]]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(overrides))}
    for n, (key, value) in enumerate(overrides):
        env[f"GIT_CONFIG_KEY_{n}"] = key
        env[f"GIT_CONFIG_VALUE_{n}"] = value
    return env


_EMPTIED = frozenset(
    {
        ("diff", "textconv"), ("diff", "command"), ("merge", "driver"), ("remote", "vcs"), ("trailer", "command"),
        ("trailer", "cmd"), ("credential", "helper"), ("tar", "command"), ("gpg", "program"),
    }
)  # fmt: skip
"""``(section, key)`` pairs, under any subsection, that an empty value keeps from running anything."""


def _neutralise(key: str) -> list[tuple[str, str]]:
    """Overrides that stop a configuration key (as ``git config --name-only`` prints it) from starting a program."""
    section, _, rest = key.partition(".")
    sub, _, var = rest.rpartition(".")
    if section == "filter" and sub:
        emptied = [(f"filter.{sub}.{v}", "") for v in ("clean", "smudge", "process")]
        return [*emptied, (f"filter.{sub}.required", "false")]
    if section == "alias" or key in ("diff.external", "gpg.ssh.defaultkeycommand") or (section, var) in _EMPTIED:
        return [(key, "")]
    if section == "http" and var == "savecookies":
        return [(key, "false")]
    return []


def _unoverridable(key: str) -> str | None:
    """Why a configuration key stops the call, or None."""
    section, _, rest = key.partition(".")
    var = rest.rpartition(".")[2]
    if section in ("include", "includeif") and var == "path":
        return "it includes another configuration file, which could change after this check"
    if section == "remote" and var in ("uploadpack", "receivepack"):
        return "it names a program git runs, and git keeps the first value it reads, so it cannot be overridden"
    return None


@dataclass(frozen=True)
class _Findings:
    """What inspecting the repository found: overrides to add and the keys they neutralise."""

    overrides: tuple[tuple[str, str], ...] = ()
    neutralised: tuple[str, ...] = ()


def _result(result: ExecResult, limits: ToolLimits, note: str = "") -> dict[str, object]:
    stdout, _ = cap_text(result.stdout, limits.output_chars, dropped_by_provider=result.truncated)
    stderr, _ = cap_text(result.stderr, limits.output_chars, dropped_by_provider=result.truncated)
    if note:
        separator = "\n" if stderr and not stderr.endswith("\n") else ""
        stderr = f"{stderr}{separator}{note}\n"
    return {"exit_code": result.exit_code, "stdout": stdout, "stderr": stderr}


async def _git(
    provider: WorkspaceCalls, workspace_id: str, args: list[str], env: Mapping[str, str], limits: ToolLimits
) -> ExecResult:
    request = ExecRequest(
        "git",
        ("--no-pager", *args),
        mode=ExecMode.ARGV,
        cwd=WORKSPACE_ROOT,
        env=dict(env),
        timeout_s=limits.git_timeout_s,
    )
    return await provider.exec(workspace_id, request)


def _repository_error(what: str, path: str, reason: str) -> ToolError:
    return ToolError(
        f"git: refused: the repository's {what} {path!r} {reason}",
        details={"refused": "repository", "path": path, "reason": reason},
    )


def _check_locations(lines: list[str], has_work_tree: bool) -> None:
    """The git and common directories must be .git directories inside /workspace; the work tree must not be."""
    expected = 3 if has_work_tree else 2
    if len(lines) != expected:  # a path holding a newline would shift the lines: refuse rather than guess
        raise ToolError(
            "git: refused: could not tell where the repository is (a path with a line break?)",
            details={"refused": "repository", "reason": "unexpected rev-parse output"},
        )
    for what, path in (("git directory", lines[0]), ("common git directory", lines[1])):
        if not _inside_workspace(path):
            raise _repository_error(what, path, "is outside /workspace")
        if not _in_git_dir(path):
            raise _repository_error(
                what,
                path,
                "is not a .git directory; the git tool only uses repositories whose git directory is a .git "
                "directory (any other directory can be changed with the write tool)",
            )
    if has_work_tree:
        tree = lines[2]
        if not _inside_workspace(tree):
            raise _repository_error("work tree", tree, "is outside /workspace (core.worktree?)")
        if _in_git_dir(tree):
            raise _repository_error("work tree", tree, "lies in a .git directory (core.worktree?)")


def _inside_workspace(path: str) -> bool:
    return path == WORKSPACE_ROOT or path.startswith(WORKSPACE_ROOT + "/")


async def _inspect_repository(
    provider: WorkspaceCalls, workspace_id: str, plan: GitPlan, env: Mapping[str, str], limits: ToolLimits
) -> _Findings | ExecResult:
    """Where the repository is and which of its configuration keys need overriding; an ExecResult when git failed
    (bad configuration, missing directory), to be reported as the call's result."""
    global_args = plan.args[: plan.start]
    where = await _git(
        provider,
        workspace_id,
        [*global_args, "rev-parse", "--absolute-git-dir", "--path-format=absolute", "--git-common-dir",
         "--show-toplevel"],
        env,
        limits,
    )  # fmt: skip
    lines = where.stdout.decode("utf-8", errors="replace").splitlines()
    stderr = where.stderr.decode("utf-8", errors="replace")
    if where.exit_code != 0 and "not a git repository" in stderr:
        return _Findings()  # no repository, so no repository configuration: the command fails or makes one
    if where.exit_code != 0 and "must be run in a work tree" not in stderr:
        return where
    _check_locations(lines, has_work_tree=where.exit_code == 0)
    listing = await _git(
        provider, workspace_id, [*global_args, "config", "--list", "--name-only", "--show-scope", "-z"], env, limits
    )
    if listing.exit_code != 0:
        return listing
    fields = listing.stdout.decode("utf-8", errors="replace").split("\0")
    keys = sorted({key for scope, key in zip(fields[::2], fields[1::2], strict=False) if scope != "command"})
    overrides: list[tuple[str, str]] = []
    neutralised: list[str] = []
    for key in keys:
        reason = _unoverridable(key)
        if reason is not None:
            raise _refuse(
                key,
                f"the repository configuration sets it and {reason}; the git tool does not run while it is set "
                f"(remove it with `git config --unset-all {key}`)",
            )
        found = _neutralise(key)
        overrides += found
        if found and not key.startswith("alias."):
            neutralised.append(key)
    return _Findings(tuple(dict.fromkeys(overrides)), tuple(neutralised))


async def _resolve_paths(provider: WorkspaceCalls, workspace_id: str, plan: GitPlan) -> None:
    """``-C``/``--git-dir``/``--work-tree`` and written paths must stay inside through symlinks, written paths must
    not resolve into a ``.git`` directory, and directories git names files in must hold no symlink."""
    for option, path in plan.confined:
        try:
            await confine(provider, workspace_id, path, field_name=option)
        except InvalidRequestError as exc:
            raise _refuse(option, exc.message) from exc
    for label, path in plan.outputs:
        resolved = await provider.realpath(workspace_id, path)
        if not _inside_workspace(resolved):
            raise _refuse(label, f"{path!r} resolves to {resolved!r} through a symlink, outside /workspace")
        if _in_git_dir(resolved):
            raise _refuse(label, f"{path!r} resolves to {resolved!r}, in a .git directory; git would write there")
    for label, path in plan.output_dirs:
        try:
            entries = await provider.list_dir(workspace_id, path)
        except FileOperationError:
            continue  # not a directory yet: git makes it
        links = sorted(entry.name for entry in entries if entry.type == "symlink")
        if links:
            raise _refuse(label, f"{path!r} holds symlinks ({', '.join(links[:5])}); git could write through them")


async def run_git(provider: WorkspaceCalls, workspace_id: str, raw: object, limits: ToolLimits) -> dict[str, object]:
    """``git {args: [...]}`` -> ``{exit_code, stdout, stderr}``; a nonzero exit is a result, not an error.

    Raises:
        ToolError: the arguments, a path they name, or the repository they act on is refused (see the module).
    """
    plan = check_git_args(Arguments("git", raw, ("args",)).string_list("args"))
    await _resolve_paths(provider, workspace_id, plan)
    env = dict(GIT_ENV)
    if plan.subcommand in _READS_LOCAL_REPOSITORIES:
        env["GIT_ALLOW_PROTOCOL"] = f"{_NETWORK_PROTOCOLS}:file"
    static = _config_env(list(GIT_SAFETY_CONFIG))
    try:
        findings = _Findings()
        if plan.subcommand is not None and plan.subcommand not in _NO_REPOSITORY_CHECK:
            inspected = await _inspect_repository(provider, workspace_id, plan, {**env, **static}, limits)
            if isinstance(inspected, ExecResult):
                return _result(inspected, limits)
            findings = inspected
        # the safety settings come last: where both name a key, the last value wins
        env.update(_config_env([*findings.overrides, *GIT_SAFETY_CONFIG]))
        result = await _git(provider, workspace_id, plan.args, env, limits)
    except ExecTimeoutError as exc:
        stdout, _ = cap_text(exc.stdout, limits.output_chars)
        stderr, _ = cap_text(exc.stderr, limits.output_chars)
        note = f"[git timed out after {limits.git_timeout_s:g} s and was killed]"
        return {"exit_code": TIMEOUT_EXIT_CODE, "stdout": stdout, "stderr": f"{stderr}\n{note}".lstrip("\n")}
    note = ""
    if findings.neutralised:
        note = (
            "[git tool: these repository settings would make git run a program and were switched off: "
            f"{', '.join(findings.neutralised)}]"
        )
    return _result(result, limits, note)
