"""The git tool's argument checks (no workspace needed): the subcommand allowlist, paths that leave /workspace or
write into ``.git``, and options that write files or run programs."""

from __future__ import annotations

import pytest

from corral.errors import ToolError
from corral.tools.git import ALLOWED_SUBCOMMANDS, check_git_args

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "args",
    [
        ["commit", "-m", "/etc/passwd: a message is text, not a path"],
        ["commit", "-m/x", "--author=A <a@b>"],
        ["tag", "-a", "v1", "-m", "../../.."],
        ["log", "--grep=/usr/bin", "--format=/%h", "-S/api", "-G", "/api/.*"],
        ["log", "main..feature", "--", "src"],
        ["log", "--output-indicator-new=+", "-p"],
        ["grep", "/api/v1"],
        ["grep", "-e", "/api/v1", "--", "src"],
        ["merge", "-X", "subtree=../lib", "topic"],
        ["diff", "--submodule=short"],
        ["bisect", "view", "--stat"],
        ["clone", "https://example.com/r.git"],
        ["clone", "/workspace/src/.git", "copy"],
        ["clone", "file:///workspace/src", "copy"],
        ["clone", "--depth", "1", "--branch", "main", "src", "copy"],
        ["-C", "proj", "worktree", "add", "-b", "x", "../wt"],
        ["-C", "proj", "format-patch", "-o", "../patches", "HEAD~1"],
        ["archive", "-o", "out.tar.gz", "HEAD"],
        ["--git-dir=.git/worktrees/wt", "status"],
        ["-C", "sub", "log", "--", "../other"],
    ],
)
def test_ordinary_arguments_pass(args: list[str]) -> None:
    """Messages, patterns, revision ranges and paths inside /workspace are accepted unchanged."""
    assert check_git_args(args).args == args


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["x"], r"^git: 'x' is refused: it is not a git command this tool runs .*allowed: add, annotate, apply"),
        (["st"], "'st' is refused"),
        (["submodule", "update", "--init"], "'submodule' is refused"),
        (["bundle", "create", "b", "--all"], "'bundle' is refused"),
        (["maintenance", "start"], "'maintenance' is refused"),
        (["for-each-repo", "--config=x", "gc"], "'for-each-repo' is refused"),
        (["interpret-trailers"], "'interpret-trailers' is refused"),
        (["--namespace=x", "log"], "'--namespace' is refused"),
        (["--bare", "log"], "'--bare' is refused"),
        (["-p", "log"], "'-p' is refused"),
        (["--paginate", "log"], "'--paginate' is refused"),
        (["--super-prefix=x/", "log"], "'--super-prefix' is refused"),
        (["--git-dir=/workspace/evil", "x"], "'--git-dir' is refused: '/workspace/evil' is not a .git directory"),
        (["--git-dir", "evil", "status"], "'--git-dir' is refused"),
        (["--work-tree=.git", "checkout", "HEAD", "--", "config"], r"'--work-tree' is refused: '\.git' lies in"),
        (["-C", "sub", "--work-tree", "x/.git/hooks", "status"], "'--work-tree' is refused"),
        (["log", "--output=/workspace/.git/config"], "'--output' is refused"),
        (["log", "--outp=x"], "'--output' is refused"),
        (["diff", "HEAD", "--output", "/tmp/x"], "'--output' is refused"),
        (["format-patch", "--output=x", "HEAD"], "'--output' is refused"),
        (["archive", "--output=x.tar", "HEAD"], "'--output' is refused"),
        (["init", "/tmp/x"], "'/tmp/x' is refused: '/tmp/x' is a path outside /workspace"),
        (["init", "../tmp/x"], "is a path outside /workspace"),
        (["-C", "a/b", "init", "../../../x"], "is a path outside /workspace"),
        (["clone", "https://example.com/r.git", "/tmp/x"], "'/tmp/x' is refused"),
        (["clone", "file:///etc/repo", "copy"], "'file:///etc/repo' is refused"),
        (["clone", "--reference=/tmp/objects", "src", "copy"], "'--reference' is refused"),
        (["clone", "--reference", "/tmp/objects", "src", "copy"], "'--reference' is refused"),
        (["log", "--grep", "/usr/bin"], r"'/usr/bin' is refused: .* goes in its option's --name=value form"),
        (["format-patch", "-o", "/tmp", "HEAD~1"], "'-o' is refused"),
        (["format-patch", "-o/tmp", "HEAD~1"], "'-o' is refused"),
        (["format-patch", "--output-dir", "/tmp", "HEAD~1"], "'--output-directory' is refused"),
        (["archive", "-o", "/x.tar", "HEAD"], "'-o' is refused"),
        (["worktree", "add", "/x"], "'/x' is refused"),
        (["diff", "--no-index", "/etc/passwd", "a"], "'/etc/passwd' is refused"),
        (["commit", "-F", "/etc/shadow"], "'-F' is refused"),
        (["blame", "--contents=/etc/passwd", "a"], "'--contents' is refused"),
        (["grep", "-f", "/etc/shadow", "x"], "'-f' is refused"),
        (["grep", "-e", "x", "/etc"], "'/etc' is refused"),
        (["remote", "add", "o", "/tmp/repo"], "'/tmp/repo' is refused"),
        (["config", "core.excludesFile", "/etc/x"], "'/etc/x' is refused"),
        (["clone", "--", "src", ".git/x"], r"'\.git/x' is refused: '\.git/x' lies in a \.git directory"),
        (["mv", "-f", "a", ".git/config"], r"lies in a \.git directory"),
        (["mv", "-f", "a", "sub/.git"], r"lies in a \.git directory"),
        (["-C", ".git", "mv", "../a", "config"], r"'config' is refused: 'config' lies in a \.git directory"),
        (["format-patch", "-o", ".git/hooks", "HEAD"], r"'-o' is refused: '\.git/hooks' lies in a \.git directory"),
        (["-C", ".git/hooks", "archive", "-o", "pre-commit", "HEAD"], r"lies in a \.git directory"),
        (["init", "x/.git"], r"lies in a \.git directory"),
        (["-C", ".git", "init"], r"lies in a \.git directory"),
        (["worktree", "add", ".git/wt"], r"lies in a \.git directory"),
        (["worktree", "move", "wt", "x/.git"], r"lies in a \.git directory"),
        (["apply", "--build-fake-ancestor=.git/index", "p.diff"], r"lies in a \.git directory"),
        (["apply", "--unsafe-paths", "p.diff"], "'--unsafe-paths' is refused"),
        (["archive", "--remote=/workspace/evil", "HEAD"], "'--remote' is refused"),
        (["init", "--bare", "x"], "'--bare' is refused"),
        (["init", "--separate-git-dir", "gitstore"], "'--separate-git-dir' is refused"),
        (["clone", "--separate-git-dir=x/.git", "src", "copy"], "'--separate-git-dir' is refused"),
        (["clone", "--recursive", "src", "copy"], "'--recursive' is refused"),
        (["checkout", "--recurse-submodules", "main"], "'--recurse-submodules' is refused"),
        (["fetch", "--recurse-sub=yes"], "'--recurse-submodules' is refused"),
        (["diff", "--submodule=diff"], "'--submodule' is refused"),
        (["log", "--submodule"], "'--submodule' is refused"),
        (["bisect", "view", "tig"], "'bisect view tig' is refused"),
        (["bisect", "visualize", "evilalias"], "'bisect visualize evilalias' is refused"),
        (["config", "merge.default", "evil"], "'config merge.default' is refused"),
        (["config", "http.https://a/.saveCookies", "true"], "is refused"),
        (["config", "safe.bareRepository", "all"], "'config safe.bareRepository' is refused"),
    ],
)
def test_arguments_that_leave_the_workspace_or_run_programs_are_refused(args: list[str], message: str) -> None:
    """Each refused argument raises a ToolError naming it and saying why, before anything runs."""
    with pytest.raises(ToolError, match=message) as caught:
        check_git_args(args)
    assert caught.value.details.get("refused")


def test_unknown_subcommands_are_refused_with_the_list_of_allowed_ones() -> None:
    """The refusal names the subcommand and lists every allowed one, in order."""
    with pytest.raises(ToolError) as caught:
        check_git_args(["frobnicate"])
    assert caught.value.message.endswith("allowed: " + ", ".join(sorted(ALLOWED_SUBCOMMANDS)))
    assert {"status", "log", "diff", "commit", "merge", "rebase", "clone", "worktree", "bisect"} <= ALLOWED_SUBCOMMANDS
    assert not {"submodule", "difftool", "bundle", "daemon", "filter-branch"} & ALLOWED_SUBCOMMANDS


def test_written_paths_are_collected_for_the_symlink_check() -> None:
    """Targets git writes to are handed on as absolute paths, resolved against -C, together with --work-tree."""
    assert check_git_args(["clone", "--depth", "1", "src", "copy"]).outputs == [("copy", "/workspace/copy")]
    assert check_git_args(["clone", "src"]).outputs == [("src", "/workspace/src")]
    assert check_git_args(["clone", "https://u:p@example.com/org/repo.git/"]).outputs == [("repo", "/workspace/repo")]
    assert check_git_args(["clone", "git@example.com:org/x.git"]).outputs == [("x", "/workspace/x")]
    assert check_git_args(["clone", "/workspace/a/.git"]).outputs == [("a", "/workspace/a")]
    assert check_git_args(["clone", "--bare", "src"]).outputs == [("src.git", "/workspace/src.git")]
    plan = check_git_args(["format-patch", "-o", "p", "HEAD"])
    assert plan.outputs == plan.output_dirs == [("-o", "/workspace/p")]
    assert check_git_args(["archive", "-o", "a.tar", "HEAD"]).output_dirs == []
    assert check_git_args(["-C", "proj", "init"]).outputs == [(".", "/workspace/proj")]
    assert check_git_args(["-C", "proj", "worktree", "add", "-b", "x", "../wt", "main"]).outputs == [
        ("../wt", "/workspace/wt")
    ]
    assert check_git_args(["-C", "p", "format-patch", "-o", "out", "HEAD"]).outputs == [("-o", "/workspace/p/out")]
    assert check_git_args(["mv", "a", "b"]).outputs == [("a", "/workspace/a"), ("b", "/workspace/b")]
    plan = check_git_args(["--work-tree=w", "status"])
    assert plan.outputs == [("--work-tree", "/workspace/w")]
    assert plan.subcommand == "status"
    assert plan.start == 1
    assert check_git_args(["status"]).outputs == []
