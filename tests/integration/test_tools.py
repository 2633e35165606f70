"""The agent tools against a real gVisor workspace: shell state, files, search, git and the confinement rules."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from corral.errors import InvalidRequestError, ToolError, WorkspaceFileNotFoundError
from corral.providers._docker_engine import DockerEngine
from corral.providers.base import ExecMode, ExecRequest, WorkspaceSpec
from corral.providers.gvisor import GVisorProvider
from corral.tools import Toolbox, ToolLimits
from corral.tools.shell import shell_state_dir
from tests.conftest import BASE_IMAGE

pytestmark = pytest.mark.integration


@pytest.fixture
async def workspace(docker_engine: DockerEngine) -> AsyncIterator[tuple[GVisorProvider, str]]:
    """A fresh isolated gVisor workspace, destroyed at teardown."""
    provider = GVisorProvider(DockerEngine(docker_engine.socket_path))
    workspace_id = f"t{uuid.uuid4().hex[:15]}"
    try:
        await provider.create(WorkspaceSpec(id=workspace_id, image=BASE_IMAGE, network="isolated"))
        yield provider, workspace_id
    finally:
        await provider.destroy(workspace_id)
        await provider.aclose()


@pytest.fixture
def tools(workspace: tuple[GVisorProvider, str]) -> Toolbox:
    """The tools of session ``s1`` on the workspace, with default limits."""
    provider, workspace_id = workspace
    return Toolbox(provider, workspace_id, session_id="s1")


async def sh(tools: Toolbox, command: str) -> str:
    """Run a setup command through the bash tool and insist that it succeeds."""
    result = await tools.bash({"command": command})
    assert result["exit_code"] == 0, result
    return str(result["stdout"])


def matches(result: dict[str, object]) -> list[dict[str, object]]:
    """The match list of a grep result."""
    found = result["matches"]
    assert isinstance(found, list)
    return found


async def make_repo(tools: Toolbox) -> None:
    """A git repository in /workspace with an identity and one commit, made directly with git in bash."""
    await sh(
        tools,
        "git init -q -b main && git config user.email agent@example.com && git config user.name Agent "
        "&& echo hello > README.md && git add README.md && git commit -qm initial",
    )


# --- bash -----------------------------------------------------------------------------------------------------------


async def test_bash_cd_export_and_unset_carry_over(workspace: tuple[GVisorProvider, str], tools: Toolbox) -> None:
    """cd, export and unset in one call are visible in the next, in one shell process; unexported variables and
    functions too while that shell lives, but only the exported ones and the directory after it was replaced."""
    first = await tools.bash({"command": "pwd; mkdir -p /workspace/sub && cd sub && export FOO='a b' && LOCAL=1"})
    assert first == {"exit_code": 0, "stdout": "/workspace\n", "stderr": "", "timed_out": False, "truncated": False}
    shell = (await tools.bash({"command": "f() { echo in-f; }; echo $$"}))["stdout"]
    second = await tools.bash({"command": 'pwd; echo "$FOO"; echo "${LOCAL-unset}"; f; echo $$'})
    assert second["stdout"] == f"/workspace/sub\na b\n1\nin-f\n{shell}"
    await _end_shells(*workspace)
    restarted = await tools.bash({"command": 'pwd; echo "$FOO"; echo "${LOCAL-unset}"; unset FOO; echo $$'})
    assert restarted["stdout"].split("\n")[:3] == ["/workspace/sub", "a b", "unset"]
    assert restarted["stdout"].split("\n")[3] != shell.strip()
    third = await tools.bash({"command": 'echo "${FOO-gone}"; cd -'})
    assert third["stdout"] == "gone\n/workspace\n"
    await tools.bash({"command": "export PATH=/nowhere"})
    assert (await tools.bash({"command": "ls"}))["exit_code"] == 127
    fixed = await tools.bash({"command": "export PATH=/usr/bin:/bin; ls -d ."})
    assert (fixed["exit_code"], fixed["stdout"]) == (0, ".\n")
    assert (await tools.bash({"command": 'echo "$PATH"'}))["stdout"] == "/usr/bin:/bin\n"


async def test_bash_exit_codes_are_the_commands_own_and_state_survives_exit(tools: Toolbox) -> None:
    """A failing command's exit code comes back unchanged, and `exit` still saves cwd and env."""
    assert (await tools.bash({"command": "false"}))["exit_code"] == 1
    result = await tools.bash({"command": "cd /tmp; export KEPT=yes; echo oops >&2; exit 3"})
    assert (result["exit_code"], result["stderr"]) == (3, "oops\n")
    assert (await tools.bash({"command": 'pwd; echo "$KEPT"'}))["stdout"] == "/tmp\nyes\n"


async def test_bash_set_e_failure_saves_state_and_a_vanished_cwd_is_reported(tools: Toolbox) -> None:
    """A `set -e` failure keeps cd and export; a working directory removed since is replaced by /workspace, said."""
    failed = await tools.bash({"command": "set -e; mkdir -p /workspace/gone; cd gone; export KEPT=yes; false; echo no"})
    assert (failed["exit_code"], failed["stdout"]) == (1, "")
    kept = await tools.bash({"command": 'pwd; echo "$KEPT"; rmdir /workspace/gone'})
    assert (kept["stdout"], kept["stderr"]) == ("/workspace/gone\nyes\n", "")
    moved = await tools.bash({"command": 'pwd; echo "$KEPT"'})
    assert moved["stdout"] == "/workspace\nyes\n"
    assert moved["stderr"] == "corral: the working directory /workspace/gone is gone; starting in /workspace\n"


async def _end_shells(provider: GVisorProvider, workspace_id: str) -> None:
    """Kill the workspace's persistent shells (as the idle close of their agent would end them): the next call
    starts a fresh shell, which reads the state saved on disk."""
    kill = ExecRequest("pkill -KILL -f '__corral_[d]ir'")  # the pattern does not match this command itself
    assert (await provider.exec(workspace_id, kill)).exit_code == 0


async def _newest_slot(provider: GVisorProvider, workspace_id: str) -> tuple[int, str]:
    """The generation and text of the newest saved shell state of session ``s1``."""
    state = shell_state_dir("s1")
    slots = []
    for slot in (0, 1):
        result = await provider.exec(workspace_id, ExecRequest("cat", (f"{state}/state.{slot}",), mode=ExecMode.ARGV))
        if result.exit_code == 0:
            text = result.stdout.decode()
            slots.append((int(text.split("\n", 1)[0].rsplit(" ", 1)[1]), text))
    return max(slots)


async def _put(provider: GVisorProvider, workspace_id: str, path: str, text: str) -> None:
    """Replace a file's content with ``text``, as the shell's ``>|`` does (truncate, then write)."""
    put = ExecRequest("/bin/bash", ("-c", 'printf %s "$1" >| "$2"', "bash", text, path), mode=ExecMode.ARGV)
    assert (await provider.exec(workspace_id, put)).exit_code == 0


def _as_generation(text: str, generation: int) -> str:
    """A saved state's text with its generation (named on its first three lines) set to ``generation``."""
    lines = text.split("\n")
    lines[:3] = [
        f"# corral shell state {generation}",
        f"if (( {generation} > __corral_gen )); then",
        f"__corral_gen={generation}",
    ]
    return "\n".join(lines)


async def test_bash_state_cut_short_mid_save_is_ignored(workspace: tuple[GVisorProvider, str], tools: Toolbox) -> None:
    """A newer state slot cut off anywhere before its end (a kill mid-save) runs nothing and the state before holds;
    the same slot whole is used."""
    provider, workspace_id = workspace
    await tools.bash({"command": "cd /tmp && export KEPT=before"})

    async def newer() -> tuple[str, str]:
        generation, text = await _newest_slot(provider, workspace_id)
        assert text.startswith(f"# corral shell state {generation}\nif ") and text.endswith("\nfi\n")
        torn = _as_generation(text, generation + 1).replace('KEPT="before"', 'KEPT="torn"')
        torn = torn.replace("__corral_cwd=/tmp\n", "__corral_cwd=/; echo RAN\n")
        assert 'KEPT="torn"' in torn and "echo RAN" in torn
        return f"{shell_state_dir('s1')}/state.{(generation + 1) % 2}", torn

    for where in ("# corral", " then", "KEPT", "echo RAN", "\nfi"):  # cut 2 characters into each
        slot, torn = await newer()
        cut = torn.index(where) + 2
        await _put(provider, workspace_id, slot, torn[:cut])
        await _end_shells(provider, workspace_id)
        result = await tools.bash({"command": 'pwd; echo "$KEPT"'})
        assert (result["stdout"], result["stderr"]) == ("/tmp\nbefore\n", ""), where
    slot, torn = await newer()
    await _put(provider, workspace_id, slot, torn)
    await _end_shells(provider, workspace_id)
    assert (await tools.bash({"command": 'pwd; echo "$KEPT"'}))["stdout"] == "RAN\n/\ntorn\n"


async def test_bash_reads_state_saved_in_the_earlier_format(
    workspace: tuple[GVisorProvider, str], tools: Toolbox
) -> None:
    """A session whose state was saved as files env and cwd (before the slots) carries on with it."""
    provider, workspace_id = workspace
    state = shell_state_dir("s1")
    await provider.write_file(workspace_id, f"{state}/env", b'declare -x PATH="/usr/bin:/bin"\ndeclare -x OLD="yes"\n')
    await provider.write_file(workspace_id, f"{state}/cwd", b"/tmp")
    result = await tools.bash({"command": 'pwd; echo "$OLD ${HOME-nohome}"'})
    assert (result["stdout"], result["stderr"]) == ("/tmp\nyes nohome\n", "")


async def test_bash_sessions_do_not_share_a_shell(workspace: tuple[GVisorProvider, str]) -> None:
    """Two sessions on the same workspace keep separate working directories and environments."""
    provider, workspace_id = workspace
    one = Toolbox(provider, workspace_id, session_id="one")
    two = Toolbox(provider, workspace_id, session_id="two")
    await one.bash({"command": "cd /tmp && export WHO=one"})
    assert (await two.bash({"command": 'pwd; echo "${WHO-nobody}"'}))["stdout"] == "/workspace\nnobody\n"


async def test_bash_runs_quotes_newlines_and_substitutions_exactly(tools: Toolbox) -> None:
    """A command holding quotes, newlines, $() and backslashes reaches bash exactly as given."""
    command = "printf '%s\\n' \"a  b\" 'c\"d' \"$(echo sub)\" '$HOME'\necho 'it'\"'\"'s' \\\\n"
    result = await tools.bash({"command": command})
    assert result["stdout"] == "a  b\nc\"d\nsub\n$HOME\nit's \\n\n"


async def test_bash_timeout_is_a_result_not_an_error(tools: Toolbox) -> None:
    """A command past its timeout is killed and reported with timed_out and exit code 137; the shell goes on."""
    result = await tools.bash({"command": "echo before; sleep 30", "timeout_s": 1})
    assert result["timed_out"] is True
    assert result["exit_code"] == 137
    assert "timed out after 1 s" in str(result["stderr"])
    assert (await tools.bash({"command": "echo after"}))["stdout"] == "after\n"


async def test_bash_output_is_capped_with_a_visible_marker(tools: Toolbox) -> None:
    """Output past 30,000 characters is cut, with a marker line counting what was dropped."""
    result = await tools.bash({"command": "head -c 100000 /dev/zero | tr '\\0' a; echo err >&2"})
    assert result["truncated"] is True
    stdout = str(result["stdout"])
    assert stdout == "a" * 30_000 + "\n[... output truncated: 70000 more bytes ...]"
    assert result["stderr"] == "err\n"


async def test_bash_rejects_bad_arguments(tools: Toolbox) -> None:
    """A missing command, a bad timeout or an unknown argument is an InvalidRequestError naming it."""
    with pytest.raises(InvalidRequestError, match="command"):
        await tools.bash({})
    with pytest.raises(InvalidRequestError, match="timeout_s"):
        await tools.bash({"command": "true", "timeout_s": -1})
    with pytest.raises(InvalidRequestError, match="cwd"):
        await tools.bash({"command": "true", "cwd": "/"})


# --- read, write, edit ----------------------------------------------------------------------------------------------


async def test_read_returns_line_ranges_with_one_based_offsets(tools: Toolbox) -> None:
    """offset is the first 1-based line returned, limit the number of lines; total_lines counts the whole file."""
    text = "".join(f"line{n}\n" for n in range(1, 10)) + "line10"
    await tools.write({"path": "ten.txt", "content": text})
    assert await tools.read({"path": "ten.txt"}) == {"content": text, "total_lines": 10, "truncated": False}
    assert await tools.read({"path": "ten.txt", "offset": 3, "limit": 2}) == {
        "content": "line3\nline4\n",
        "total_lines": 10,
        "truncated": True,
    }
    tail = await tools.read({"path": "/workspace/ten.txt", "offset": 9})
    assert tail == {"content": "line9\nline10", "total_lines": 10, "truncated": False}
    beyond = await tools.read({"path": "ten.txt", "offset": 50})
    assert beyond == {"content": "", "total_lines": 10, "truncated": False}


async def test_read_refuses_binary_missing_files_and_bad_ranges(tools: Toolbox) -> None:
    """A file with NUL bytes is refused as binary, a missing one is not found, offset 0 is invalid."""
    await sh(tools, "printf 'abc\\0def' > blob.bin")
    with pytest.raises(ToolError, match=r"blob\.bin is a binary file"):
        await tools.read({"path": "blob.bin"})
    with pytest.raises(WorkspaceFileNotFoundError):
        await tools.read({"path": "nope.txt"})
    with pytest.raises(InvalidRequestError, match="offset"):
        await tools.read({"path": "blob.bin", "offset": 0})
    with pytest.raises(InvalidRequestError, match="limit"):
        await tools.read({"path": "blob.bin", "limit": "ten"})


async def test_read_caps_the_text_returned(workspace: tuple[GVisorProvider, str]) -> None:
    """A window larger than the character cap is cut and marked truncated."""
    provider, workspace_id = workspace
    tools = Toolbox(provider, workspace_id, session_id="s1", limits=ToolLimits(read_max_chars=100))
    await tools.write({"path": "wide.txt", "content": "x" * 80 + "\n" + "y" * 80 + "\n"})
    result = await tools.read({"path": "wide.txt"})
    assert result == {"content": "x" * 80 + "\n" + "y" * 19, "total_lines": 2, "truncated": True}


async def test_write_creates_parents_and_counts_bytes(tools: Toolbox) -> None:
    """write makes missing directories and reports UTF-8 bytes; reading it back gives the same text."""
    result = await tools.write({"path": "deep/er/file.txt", "content": "héllo\n"})
    assert result == {"bytes_written": 7}
    assert (await tools.read({"path": "deep/er/file.txt"}))["content"] == "héllo\n"
    assert await tools.write({"path": "empty.txt", "content": ""}) == {"bytes_written": 0}
    with pytest.raises(InvalidRequestError, match="content"):
        await tools.write({"path": "x.txt"})


async def test_edit_replaces_a_unique_string_and_keeps_the_mode(tools: Toolbox) -> None:
    """A unique old_string is replaced once and an executable file stays executable."""
    await tools.write({"path": "run.sh", "content": "#!/bin/sh\necho old\n"})
    await sh(tools, "chmod 755 run.sh")
    assert await tools.edit({"path": "run.sh", "old_string": "old", "new_string": "new"}) == {"replacements": 1}
    assert (await tools.read({"path": "run.sh"}))["content"] == "#!/bin/sh\necho new\n"
    assert await sh(tools, "stat -c %a run.sh; ./run.sh") == "755\nnew\n"


async def test_edit_reports_absent_and_ambiguous_strings(tools: Toolbox) -> None:
    """An absent old_string and an ambiguous one are errors that say which; replace_all replaces every one."""
    await tools.write({"path": "a.txt", "content": "x = 1\nx = 1\nx = 1\n"})
    with pytest.raises(ToolError, match=r"^old_string not found in a\.txt$"):
        await tools.edit({"path": "a.txt", "old_string": "y = 2", "new_string": "y = 3"})
    with pytest.raises(ToolError, match=r"old_string occurs 3 times in a\.txt; make it unique or pass replace_all"):
        await tools.edit({"path": "a.txt", "old_string": "x = 1", "new_string": "x = 2"})
    result = await tools.edit({"path": "a.txt", "old_string": "x = 1", "new_string": "x = 2", "replace_all": True})
    assert result == {"replacements": 3}
    assert (await tools.read({"path": "a.txt"}))["content"] == "x = 2\nx = 2\nx = 2\n"


async def test_edit_rejects_no_op_and_empty_old_string(tools: Toolbox) -> None:
    """old_string equal to new_string, or empty, is an invalid request."""
    await tools.write({"path": "a.txt", "content": "abc\n"})
    with pytest.raises(InvalidRequestError, match="new_string: must differ"):
        await tools.edit({"path": "a.txt", "old_string": "abc", "new_string": "abc"})
    with pytest.raises(InvalidRequestError, match="old_string: must be non-empty"):
        await tools.edit({"path": "a.txt", "old_string": "", "new_string": "x"})
    with pytest.raises(InvalidRequestError, match="replace_all"):
        await tools.edit({"path": "a.txt", "old_string": "a", "new_string": "b", "replace_all": "yes"})


# --- grep and glob --------------------------------------------------------------------------------------------------


async def grep_tree(tools: Toolbox) -> None:
    """A small tree to search: two Python files, a text file, a hidden file and a .git directory."""
    await tools.write({"path": "src/app.py", "content": "import os\n\ndef Main():\n    return 'main'\n"})
    await tools.write({"path": "src/util.py", "content": "def helper():\n    pass  # main helper\n"})
    await tools.write({"path": "notes.txt", "content": "the main idea\n"})
    await tools.write({"path": ".github/ci.yml", "content": "run: main\n"})
    await sh(tools, "mkdir -p .git && echo 'main' > .git/HEAD")


async def test_grep_finds_matches_with_paths_relative_to_the_workspace(tools: Toolbox) -> None:
    """Matches carry the workspace-relative path, 1-based line number and the line; .git is never searched."""
    await grep_tree(tools)
    result = await tools.grep({"pattern": "main"})
    assert result == {
        "matches": [
            {"path": ".github/ci.yml", "line_number": 1, "line": "run: main"},
            {"path": "notes.txt", "line_number": 1, "line": "the main idea"},
            {"path": "src/app.py", "line_number": 4, "line": "    return 'main'"},
            {"path": "src/util.py", "line_number": 2, "line": "    pass  # main helper"},
        ],
        "truncated": False,
    }


async def test_grep_include_path_and_case_insensitive(tools: Toolbox) -> None:
    """include filters file names, path narrows the search, case_insensitive widens the match."""
    await grep_tree(tools)
    only_py = matches(await tools.grep({"pattern": "main", "include": "*.py"}))
    assert [m["path"] for m in only_py] == ["src/app.py", "src/util.py"]
    in_file = matches(await tools.grep({"pattern": "main", "path": "src/app.py", "case_insensitive": True}))
    assert [(m["line_number"], m["line"]) for m in in_file] == [(3, "def Main():"), (4, "    return 'main'")]
    sensitive = matches(await tools.grep({"pattern": "Main", "path": "/workspace/src"}))
    assert [m["path"] for m in sensitive] == ["src/app.py"]


async def test_grep_no_match_and_bad_regex(tools: Toolbox) -> None:
    """No match is an empty result; an invalid regex is an InvalidRequestError carrying rg's message."""
    await grep_tree(tools)
    assert await tools.grep({"pattern": "zebra"}) == {"matches": [], "truncated": False}
    with pytest.raises(InvalidRequestError, match=r"pattern: not a valid regular expression.*regex parse error"):
        await tools.grep({"pattern": "(unclosed"})
    with pytest.raises(InvalidRequestError, match="pattern: not a valid regular expression"):
        await tools.grep({"pattern": "two\nlines"})
    assert (await tools.grep({"pattern": "-v"}))["matches"] == []


async def test_grep_caps_matches_and_trims_long_lines(tools: Toolbox) -> None:
    """More than 500 matches are cut to 500 with truncated set; very long lines are trimmed."""
    await sh(tools, "for i in $(seq 1 700); do echo hit $i; done > many.txt; printf 'hit%0900d\\n' 0 > long.txt")
    result = await tools.grep({"pattern": "hit", "path": "many.txt"})
    assert result["truncated"] is True
    found = matches(result)
    assert len(found) == 500
    assert found[-1] == {"path": "many.txt", "line_number": 500, "line": "hit 500"}
    line = str(matches(await tools.grep({"pattern": "hit", "path": "long.txt"}))[0]["line"])
    assert line.startswith("hit000") and line.endswith(" [... line truncated ...]") and len(line) < 600


async def test_glob_lists_relative_paths_and_caps_them(workspace: tuple[GVisorProvider, str]) -> None:
    """glob returns sorted workspace-relative paths, honours path, and marks results past the cap."""
    provider, workspace_id = workspace
    tools = Toolbox(provider, workspace_id, session_id="s1")
    await grep_tree(tools)
    assert await tools.glob({"pattern": "**/*.py"}) == {"paths": ["src/app.py", "src/util.py"], "truncated": False}
    assert await tools.glob({"pattern": "*.py", "path": "src"}) == {
        "paths": ["src/app.py", "src/util.py"],
        "truncated": False,
    }
    assert (await tools.glob({"pattern": "*.rs"}))["paths"] == []
    capped = Toolbox(provider, workspace_id, session_id="s1", limits=ToolLimits(glob_max_paths=1))
    assert await capped.glob({"pattern": "**/*.py"}) == {"paths": ["src/app.py"], "truncated": True}


# --- confinement ----------------------------------------------------------------------------------------------------


async def test_paths_outside_the_workspace_are_refused(tools: Toolbox) -> None:
    """`..`, absolute paths elsewhere and symlinks leading out are refused by every file tool."""
    await sh(tools, "ln -s /etc etclink && mkdir -p inner && ln -s /etc inner/up")
    for path in ("../x", "/etc/passwd", "etclink/passwd", "src/../../etc/passwd"):
        with pytest.raises(InvalidRequestError, match="outside /workspace"):
            await tools.read({"path": path})
    with pytest.raises(InvalidRequestError, match="outside /workspace"):
        await tools.write({"path": "etclink/evil", "content": "x"})
    with pytest.raises(InvalidRequestError, match="outside /workspace"):
        await tools.edit({"path": "/etc/hostname", "old_string": "a", "new_string": "b"})
    with pytest.raises(InvalidRequestError, match="outside /workspace"):
        await tools.grep({"pattern": "root", "path": "etclink"})
    with pytest.raises(InvalidRequestError, match="outside /workspace"):
        await tools.glob({"pattern": "*", "path": "etclink"})
    with pytest.raises(InvalidRequestError, match=r"must not contain '\.\.'"):
        await tools.glob({"pattern": "../etc/*"})
    with pytest.raises(InvalidRequestError, match="must be relative"):
        await tools.glob({"pattern": "/etc/*"})
    found = await tools.glob({"pattern": "**/passwd"})
    assert found == {"paths": [], "truncated": False}
    assert await sh(tools, "test ! -e /etc/evil && echo clean") == "clean\n"


async def test_writes_inside_git_directories_are_refused(tools: Toolbox) -> None:
    """write and edit refuse .git internals, also through a symlink, while .gitignore stays writable."""
    await make_repo(tools)
    await sh(tools, "ln -s .git/hooks hk")
    for path in (".git/hooks/pre-commit", "sub/.git/config", "hk/pre-commit"):
        with pytest.raises(ToolError, match=r"inside a \.git directory is refused"):
            await tools.write({"path": path, "content": "#!/bin/sh\ntouch /workspace/PWNED\n"})
    with pytest.raises(ToolError, match=r"inside a \.git directory is refused"):
        await tools.edit({"path": ".git/config", "old_string": "[core]", "new_string": "[alias]"})
    assert await tools.write({"path": ".gitignore", "content": "*.log\n"}) == {"bytes_written": 6}
    assert await sh(tools, "ls .git/hooks | grep -c '^pre-commit$' || true") == "0\n"


# --- git ------------------------------------------------------------------------------------------------------------


async def test_git_status_log_and_commit_work(tools: Toolbox) -> None:
    """Ordinary git commands run in /workspace and report their output and exit code."""
    await make_repo(tools)
    await tools.write({"path": "new.txt", "content": "new\n"})
    status = await tools.git({"args": ["status", "--short"]})
    assert status == {"exit_code": 0, "stdout": "?? new.txt\n", "stderr": ""}
    assert (await tools.git({"args": ["add", "new.txt"]}))["exit_code"] == 0
    commit = await tools.git({"args": ["commit", "-q", "-m", "add new"]})
    assert commit["exit_code"] == 0, commit
    log = await tools.git({"args": ["log", "--format=%s"]})
    assert log["stdout"] == "add new\ninitial\n"
    missing = await tools.git({"args": ["show", "no-such-ref"]})
    assert missing["exit_code"] == 128 and "no-such-ref" in str(missing["stderr"])
    assert (await tools.git({"args": ["-C", "sub-missing", "status"]}))["exit_code"] == 128
    assert (await tools.git({"args": ["config", "user.name", "Someone"]}))["exit_code"] == 0


async def test_git_hooks_and_fsmonitor_planted_by_bash_do_not_run(tools: Toolbox) -> None:
    """Hooks and an fsmonitor command planted with bash run for a plain git commit but never through the tool."""
    await make_repo(tools)
    await sh(
        tools,
        "for h in pre-commit commit-msg post-commit; do printf '#!/bin/sh\\ntouch /workspace/HOOK_%s\\n' $h "
        "> .git/hooks/$h; chmod +x .git/hooks/$h; done && echo 1 > a.txt && git add a.txt && git commit -qm control "
        "&& ls /workspace | grep -c HOOK_",
    )
    await sh(tools, "rm -f HOOK_* && git config core.fsmonitor 'touch /workspace/FSMON; false'")
    await tools.write({"path": "b.txt", "content": "2\n"})
    assert (await tools.git({"args": ["add", "b.txt"]}))["exit_code"] == 0
    commit = await tools.git({"args": ["commit", "-m", "through the tool"]})
    assert commit["exit_code"] == 0, commit
    assert (await tools.git({"args": ["status", "--short"]}))["exit_code"] == 0
    assert await sh(tools, "ls /workspace | grep -cE '^(HOOK_|FSMON)' || true") == "0\n"


REFUSED: list[tuple[list[str], str]] = [
    (["-c", "core.pager=sh", "log"], "'-c' is refused"),
    (["--config-env=core.editor=EDITOR", "commit"], "'--config-env' is refused"),
    (["--exec-path=/tmp", "status"], "'--exec-path' is refused"),
    (["fetch", "--upload-pack=touch /tmp/x", "origin"], "'--upload-pack' is refused"),
    (["clone", "-u", "touch /tmp/x", "/workspace", "copy"], "'-u' is refused"),
    (["ls-remote", "--upl=sh", "origin"], "'--upload-pack' is refused"),
    (["push", "--receive-pack=sh", "origin"], "'--receive-pack' is refused"),
    (["archive", "--exec=sh", "HEAD"], "'--exec' is refused"),
    (["--git-dir=/etc", "status"], "'--git-dir' is refused"),
    (["--work-tree", "/", "status"], "'--work-tree' is refused"),
    (["-C", "..", "status"], "'-C' is refused"),
    (["clone", "ext::sh -c touch% /tmp/x", "dst"], "ext:: and fd:: transports"),
    (["fetch", "fd::3"], "ext:: and fd:: transports"),
    (["config", "core.sshCommand", "touch /tmp/x"], "'config core.sshCommand' is refused"),
    (["config", "alias.st", "!touch /tmp/x"], "'config alias.st' is refused"),
    (["config", "--add", "diff.x.textconv", "sh"], "'config diff.x.textconv' is refused"),
    (["config", "filter.lfs.clean", "sh"], "'config filter.lfs.clean' is refused"),
    (["config", "include.path", "../evil"], "'config include.path' is refused"),
    (["config", "--file", "/tmp/cfg", "a.b", "c"], "'--file' is refused"),
    (["difftool"], "'difftool' is refused"),
    (["mergetool"], "'mergetool' is refused"),
    (["filter-branch", "--tree-filter", "sh"], "'filter-branch' is refused"),
    (["submodule", "foreach", "touch /tmp/x"], "'submodule foreach' is refused"),
    (["bisect", "run", "sh"], "'bisect run' is refused"),
    (["rebase", "--exec", "sh", "HEAD~1"], "'--exec' is refused"),
    (["rebase", "-ix", "sh", "HEAD~1"], "'-x' is refused"),
    (["daemon"], "'daemon' is refused"),
    (["credential-store", "get"], "'credential-store' is refused"),
    (["grep", "-O", "sh", "x"], "'-O' is refused"),
    (["merge", "-s", "evil", "main"], "'-s evil' is refused"),
]


async def test_git_refuses_options_that_run_programs_or_leave_the_workspace(tools: Toolbox) -> None:
    """Every refused class raises a ToolError naming the option and the reason, and runs nothing."""
    await make_repo(tools)
    await sh(tools, "ln -s /etc etclink")
    for args, message in REFUSED:
        with pytest.raises(ToolError, match=message):
            await tools.git({"args": args})
    with pytest.raises(ToolError, match=r"'-C' is refused.*symlink"):
        await tools.git({"args": ["-C", "etclink", "status"]})
    assert await sh(tools, "test ! -e /tmp/x && git config --get alias.st || echo clean") == "clean\n"
