"""The tool policy, argument checks that need no workspace, git argument screening and audit summaries."""

from __future__ import annotations

from typing import Any, cast

import pytest

from corral.errors import InvalidRequestError, ToolError
from corral.providers.base import WorkspaceProvider
from corral.tools import (
    VALID_TOOLS,
    Toolbox,
    ToolNotAllowedError,
    ToolPolicy,
    UnknownToolError,
    check_git_args,
    check_tool_allowed,
    summarize_arguments,
    validate_tool_names,
)
from corral.tools._common import cap_text

pytestmark = pytest.mark.unit


class NoProvider:
    """A provider that fails the test if any tool reaches it."""

    name = "none"

    def __getattr__(self, item: str) -> Any:
        raise AssertionError(f"provider.{item} must not be reached for an invalid call")


@pytest.fixture
def toolbox() -> Toolbox:
    """A toolbox whose provider must never be called."""
    return Toolbox(cast(WorkspaceProvider, NoProvider()), "w1", session_id="s1")


# --- policy ---------------------------------------------------------------------------------------------------------


def test_valid_tools_are_the_seven_of_the_design() -> None:
    """VALID_TOOLS lists exactly the seven tools, in the design's order."""
    assert VALID_TOOLS == ("bash", "read", "write", "edit", "grep", "glob", "git")


def test_tool_outside_the_list_is_forbidden_with_the_exact_message() -> None:
    """A known tool the agent type does not enable is a 403 with the seed's message."""
    with pytest.raises(ToolNotAllowedError) as caught:
        check_tool_allowed("bash", ["read", "grep"])
    error = caught.value
    assert isinstance(error, ToolError)
    assert (error.http_status, error.code) == (403, "tool_not_allowed")
    assert error.message == "Tool 'bash' is not enabled for this agent type"
    assert error.to_json()["error"]["code"] == "tool_not_allowed"


def test_unknown_tool_is_not_found_and_lists_valid_tools() -> None:
    """A tool name that does not exist is a 404 naming the valid tools."""
    with pytest.raises(UnknownToolError) as caught:
        check_tool_allowed("ssh", VALID_TOOLS)
    assert (caught.value.http_status, caught.value.code) == (404, "unknown_tool")
    assert "bash, read, write, edit, grep, glob, git" in caught.value.message


def test_allowed_tool_passes_and_policy_wraps_the_check() -> None:
    """An enabled tool passes; ToolPolicy validates, deduplicates and checks the same way."""
    check_tool_allowed("read", ["read"])
    policy = ToolPolicy.of(["read", "grep", "read"])
    assert policy.allowed == frozenset({"read", "grep"})
    assert policy.allows("grep") and not policy.allows("bash")
    with pytest.raises(ToolNotAllowedError, match=r"^Tool 'git' is not enabled for this agent type$"):
        policy.check("git")


def test_invalid_tool_names_are_listed_with_the_valid_options() -> None:
    """A config naming unknown tools is refused with every invalid name and the valid list."""
    with pytest.raises(InvalidRequestError) as caught:
        validate_tool_names(["bash", "ssh", "telnet"])
    assert "'ssh', 'telnet'" in caught.value.message
    assert caught.value.details["valid_tools"] == list(VALID_TOOLS)
    with pytest.raises(InvalidRequestError, match="list of tool names"):
        validate_tool_names("bash")
    assert validate_tool_names(["git", "bash", "git"]) == ("git", "bash")


# --- argument validation without a workspace ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("bash", {}, "command: is required"),
        ("bash", {"command": ""}, "command: must be a non-empty string"),
        ("bash", {"command": 42}, "command: must be a string"),
        ("bash", {"command": "ls", "timeout_s": 0}, "timeout_s: must be greater than 0"),
        ("bash", {"command": "ls", "timeout_s": True}, "timeout_s: must be a number"),
        ("bash", {"command": "ls", "timeout_s": 10_000}, "at most 3600"),
        ("bash", {"command": "ls", "cwd": "/"}, "unknown argument.*cwd; allowed: command, timeout_s"),
        ("bash", ["ls"], "arguments must be a JSON object"),
        ("read", {}, "path: is required"),
        ("read", {"path": "a", "offset": 0}, "offset: must be an integer from 1"),
        ("read", {"path": "a", "limit": 1.5}, "limit: must be an integer"),
        ("read", {"path": "a\x00b"}, "path: must not contain a NUL byte"),
        ("write", {"path": "a"}, "content: is required"),
        ("write", {"path": "a", "content": b"bytes"}, "content: is required"),
        ("edit", {"path": "a", "old_string": "x", "new_string": "x"}, "new_string: must differ"),
        ("edit", {"path": "a", "old_string": "", "new_string": "x"}, "old_string: must be non-empty"),
        ("edit", {"path": "a", "old_string": "x"}, "new_string: is required"),
        ("edit", {"path": "a", "old_string": "x", "new_string": "y", "replace_all": 1}, "replace_all: must be true"),
        ("grep", {"path": "src"}, "pattern: is required"),
        ("grep", {"pattern": "x", "case_insensitive": "yes"}, "case_insensitive: must be true or false"),
        ("glob", {"pattern": "/etc/*"}, "pattern: must be relative"),
        ("glob", {"pattern": "src/../../*"}, "pattern: must not contain '..'"),
        ("git", {"args": "status"}, "args: must be a list of strings"),
        ("git", {}, "args: is required"),
    ],
)
async def test_bad_arguments_are_refused_before_the_workspace_is_touched(
    toolbox: Toolbox, tool: str, arguments: object, message: str
) -> None:
    """Each malformed argument raises InvalidRequestError naming it, without a provider call."""
    with pytest.raises(InvalidRequestError, match=message):
        await toolbox.call(tool, arguments)


async def test_toolbox_refuses_unknown_tools_and_bad_session_ids(toolbox: Toolbox) -> None:
    """call() with an unknown tool is an UnknownToolError; a session id unfit for a directory name is refused."""
    with pytest.raises(UnknownToolError):
        await toolbox.call("ssh", {})
    for bad in ("", "../x", "a/b", ".hidden", "x" * 200):
        with pytest.raises(InvalidRequestError, match="session_id"):
            Toolbox(cast(WorkspaceProvider, NoProvider()), "w1", session_id=bad)


def test_cap_text_marks_what_it_cuts() -> None:
    """Output past the cap ends with a marker counting the dropped bytes; short output is untouched."""
    assert cap_text(b"short", 10) == ("short", False)
    assert cap_text(b"a" * 15, 10) == ("a" * 10 + "\n[... output truncated: 5 more bytes ...]", True)
    assert cap_text(b"a" * 15, 10, dropped_by_provider=True)[0].endswith("[... output truncated: 5+ more bytes ...]")


# --- git argument screening -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--short"],
        ["commit", "-m", "message with -c and --exec-looking words"],
        ["switch", "-c", "feature"],
        ["log", "--oneline", "-5"],
        ["config", "user.name", "Agent"],
        ["config", "--get", "alias.st"],
        ["config", "--unset", "core.pager"],
        ["merge", "-s", "ours", "topic"],
        ["rebase", "-i", "--strategy=ort", "main"],
        ["-C", "sub", "status"],
        ["--git-dir=/workspace/.git", "--work-tree", "/workspace", "status"],
        ["help", "-a"],
        ["diff", "--", "--exec"],
        [],
    ],
)
def test_ordinary_git_commands_pass(args: list[str]) -> None:
    """Everyday git command lines are accepted unchanged."""
    assert check_git_args(args).args == args


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "core.pager=sh", "log"], "'-c' is refused: agent-supplied configuration"),
        (["--config-env", "core.editor=E", "commit"], "'--config-env' is refused"),
        (["--exec-path"], "'--exec-path' is refused"),
        (["--frobnicate", "status"], "not a global option"),
        (["--help"], "documentation viewer"),
        (["log", "--help"], "documentation viewer"),
        (["help", "log"], "documentation viewer"),
        (["fetch", "--upload-pack", "sh"], "'--upload-pack' is refused"),
        (["fetch", "--uplo=sh"], "'--upload-pack' is refused"),
        (["fetch", "-qu"], "'-u' is refused"),
        (["pull", "-u", "sh"], "'-u' is refused"),
        (["clone", "-usht", "src", "dst"], "'-u' is refused"),
        (["clone", "--config=alias.x=!sh", "src"], "'--config' is refused"),
        (["clone", "-c", "core.sshCommand=sh", "src"], "'-c' is refused"),
        (["clone", "--template=tpl", "src"], "'--template' is refused"),
        (["init", "--separate-git-dir=/tmp/g"], "'--separate-git-dir' is refused"),
        (["ls-remote", "-u", "sh", "origin"], "'-u' is refused"),
        (["push", "--recei=sh", "x"], "'--receive-pack' is refused"),
        (["push", "--exec=sh", "origin"], "'--exec' is refused"),
        (["rebase", "-x", "make", "main"], "'-x' is refused"),
        (["rebase", "-ixmake", "main"], "'-x' is refused"),
        (["rebase", "--exe", "make", "main"], "'--exec' is refused"),
        (["rebase", "-s", "evil", "main"], "'-s evil' is refused"),
        (["merge", "--strategy=../../tmp/x", "t"], "'--strategy ../../tmp/x' is refused"),
        (["cherry-pick", "--strategy", "evil", "abc"], "'--strategy evil' is refused"),
        (["grep", "--open-files-in-pager=vim", "x"], "'--open-files-in-pager' is refused"),
        (["grep", "-iOvim", "x"], "'-O' is refused"),
        (["remote", "add", "o", "ext::sh -c id"], "ext:: and fd:: transports"),
        (["fetch", "FD::7"], "ext:: and fd:: transports"),
        (["-C", "/tmp", "status"], "'-C' is refused: '/tmp' is outside /workspace"),
        (["-C", "sub", "-C", "../..", "status"], "'-C' is refused"),
        (["--git-dir", "../x", "status"], "'--git-dir' is refused"),
        (["--work-tree=/", "status"], "'--work-tree' is refused"),
        (["config", "core.sshCommand", "sh"], "'config core.sshCommand' is refused"),
        (["config", "--local", "Alias.X", "!sh"], "'config Alias.X' is refused"),
        (["config", "--replace-all", "core.hooksPath", "/tmp"], "'config core.hooksPath' is refused"),
        (["config", "--type", "bool", "core.fsmonitor", "true"], "'config core.fsmonitor' is refused"),
        (["config", "diff.pdf.textconv", "sh"], "'config diff.pdf.textconv' is refused"),
        (["config", "merge.ours.driver", "sh"], "'config merge.ours.driver' is refused"),
        (["config", "credential.helper", "store"], "'config credential.helper' is refused"),
        (["config", "url.ext::sh.insteadOf", "x"], "ext:: and fd:: transports"),
        (["config", "url.https://a/.insteadOf", "x"], "'config url.https://a/.insteadOf' is refused"),
        (["config", "gpg.program", "sh"], "'config gpg.program' is refused"),
        (["config", "includeIf.gitdir:/.path", "x"], "is refused"),
        (["config", "uploadpack.packObjectsHook", "sh"], "is refused"),
        (["config", "--rename-section", "foo", "core"], "'config --rename-section core' is refused"),
        (["config", "--rename-s", "foo", "alias"], "'config --rename-section alias' is refused"),
        (["config", "--global", "user.name", "x"], "'--global' is refused"),
        (["config", "--fil=/tmp/c", "a.b", "c"], "'--file' is refused"),
        (["config", "-e"], "'-e' is refused: it opens an editor"),
        (["difftool"], "'difftool' is refused"),
        (["mergetool"], "'mergetool' is refused"),
        (["filter-branch"], "'filter-branch' is refused"),
        (["filter-repo"], "'filter-repo' is refused"),
        (["submodule", "--quiet", "foreach", "id"], "'submodule foreach' is refused"),
        (["bisect", "run", "make"], "'bisect run' is refused"),
        (["daemon"], "'daemon' is refused"),
        (["instaweb"], "'instaweb' is refused"),
        (["web--browse", "x"], "'web--browse' is refused"),
        (["credential", "fill"], "'credential' is refused"),
        (["credential-cache", "exit"], "'credential-cache' is refused"),
        (["upload-pack", "."], "'upload-pack' is refused"),
        (["receive-pack", "."], "'receive-pack' is refused"),
        (["shell"], "'shell' is refused"),
    ],
)
def test_git_arguments_that_run_programs_or_leave_the_workspace_are_refused(args: list[str], message: str) -> None:
    """Each refused option or subcommand raises a ToolError naming it and saying why."""
    with pytest.raises(ToolError, match=message) as caught:
        check_git_args(args)
    assert caught.value.details.get("refused")


def test_git_confined_paths_are_collected_for_the_symlink_check() -> None:
    """-C, --git-dir and --work-tree inside the workspace are handed on, resolved against the -C chain."""
    plan = check_git_args(["-C", "a", "--git-dir=../b/.git", "--work-tree", ".", "status"])
    assert plan.confined == [
        ("-C", "/workspace/a"),
        ("--git-dir", "/workspace/b/.git"),
        ("--work-tree", "/workspace/a"),
    ]


# --- audit summaries ------------------------------------------------------------------------------------------------


def test_summaries_are_short_and_never_hold_file_content() -> None:
    """bash keeps the first 200 characters; write and edit give path and byte counts, never the text."""
    long_command = "echo " + "x" * 500
    summary = summarize_arguments("bash", {"command": long_command, "timeout_s": 5})
    assert summary.startswith("echo xxx") and len(summary) < 260 and "(timeout 5 s)" in summary
    secret = "TOP-SECRET-CONTENT"
    write = summarize_arguments("write", {"path": "src/a.py", "content": secret * 10})
    assert write == "src/a.py (180 bytes)"
    edit = summarize_arguments("edit", {"path": "a", "old_string": secret, "new_string": "x", "replace_all": True})
    assert secret not in edit and edit == "a (old 18 bytes, new 1 bytes) replace_all"
    assert summarize_arguments("git", {"args": ["commit", "-m", "two words"]}) == "git commit -m 'two words'"
    assert summarize_arguments("grep", {"pattern": "def", "include": "*.py", "case_insensitive": True}) == (
        "def in . include=*.py -i"
    )
    assert summarize_arguments("read", {"path": "a", "offset": 3}) == "a offset=3 limit=default"
    assert summarize_arguments("glob", {"pattern": "**/*.py"}) == "**/*.py in ."


def test_summaries_survive_malformed_arguments() -> None:
    """Garbage arguments still give a summary rather than an exception."""
    assert summarize_arguments("bash", None) == "bash: invalid arguments (NoneType)"
    assert summarize_arguments("git", {"args": 7}) == "git 7"
    assert summarize_arguments("ssh", {"host": "x"}) == "ssh: ['host']"
    assert "\n" not in summarize_arguments("bash", {"command": "a\nb"})
