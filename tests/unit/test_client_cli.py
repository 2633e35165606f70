"""The ``corral`` command's client side without a server: tool-argument parsing, config flags, one-line errors, exit
codes, and the image build's progress display."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

import corral.client
from corral.cli import app
from corral.cli.agent_types import _apply_config_flags
from corral.cli.images import BuildDisplay
from corral.cli.sessions import parse_tool_arguments

pytestmark = pytest.mark.unit

runner = CliRunner()


def test_bare_value_fills_the_tools_main_argument() -> None:
    """``bash 'ls'`` is the command, ``read a.txt`` the path, and ``git 'log -3'`` is split like a shell would."""
    assert parse_tool_arguments("bash", "ls -la | wc -l", []) == {"command": "ls -la | wc -l"}
    assert parse_tool_arguments("read", "a b.txt", []) == {"path": "a b.txt"}
    assert parse_tool_arguments("git", "log --format='%h %s' -3", []) == {"args": ["log", "--format=%h %s", "-3"]}


def test_json_object_file_and_pairs_combine() -> None:
    """A JSON object (inline or @file) is the base; ``key=text`` adds strings and ``key:=json`` typed values."""
    assert parse_tool_arguments("edit", '{"path": "a", "old_string": "x"}', ["new_string=y", "replace_all:=true"]) == {
        "path": "a", "old_string": "x", "new_string": "y", "replace_all": True,
    }  # fmt: skip
    assert parse_tool_arguments("bash", None, ["command=echo a=b", "timeout_s:=30"]) == {
        "command": "echo a=b", "timeout_s": 30,
    }  # fmt: skip
    assert parse_tool_arguments("git", None, ['args:=["status", "--short"]']) == {"args": ["status", "--short"]}


def test_arguments_from_a_file(tmp_path: Path) -> None:
    """``@file`` reads the JSON object from a file."""
    path = tmp_path / "args.json"
    path.write_text('{"pattern": "**/*.py"}')
    assert parse_tool_arguments("glob", f"@{path}", []) == {"pattern": "**/*.py"}


@pytest.mark.parametrize(
    ("tool", "value", "pairs", "problem"),
    [
        ("bash", None, ["command"], "expected key=value or key:=json"),
        ("bash", None, ["timeout_s:=soon"], "not valid JSON"),
        ("read", "{not json", [], "not valid JSON"),
        ("read", "@/nonexistent/args.json", [], "cannot read"),
        ("bsh", "ls", [], "unknown tool 'bsh'; the tools are bash, read, write, edit, grep, glob, git"),
        ("frobnicate", None, ["command=x"], "unknown tool 'frobnicate'"),
    ],
)
def test_bad_tool_arguments_are_usage_errors(tool: str, value: str | None, pairs: list[str], problem: str) -> None:
    """Malformed pairs, invalid JSON and an unknown tool name (however its arguments are given) are BadParameter."""
    with pytest.raises(typer.BadParameter, match=problem):
        parse_tool_arguments(tool, value, pairs)


def test_config_flags_enable_and_merge() -> None:
    """Any workspace flag enables the workspace; --repo spells the source; other fields of the base are kept."""
    base = {"enabled": False, "network": "default", "tools": ["read"]}
    merged = _apply_config_flags(base, enabled=None, tools="bash, read", repo="task", branch="main", setup=["make"],
                                 provider=None)  # fmt: skip
    assert merged == {
        "enabled": False, "network": "default", "tools": ["bash", "read"],
        "repo_source": {"type": "task_context", "url": None, "branch": "main"}, "setup_commands": ["make"],
    }, "an explicit enabled in the base is kept"  # fmt: skip
    fresh = _apply_config_flags({}, enabled=None, tools=None, repo="https://git.example/r.git", branch=None, setup=[],
                                provider="gvisor")  # fmt: skip
    assert fresh == {"enabled": True, "provider": "gvisor",
                     "repo_source": {"type": "fixed", "url": "https://git.example/r.git"}}  # fmt: skip
    assert _apply_config_flags({}, enabled=None, tools=None, repo=None, branch=None, setup=[], provider=None) == {}


def _serve(monkeypatch: pytest.MonkeyPatch, handler: Callable[[httpx.Request], httpx.Response]) -> None:
    """Make the CLI's client talk to ``handler`` instead of the network."""
    real = corral.client.Corral

    def fake(base_url: str | None = None, token: str | None = None, **kwargs: Any) -> corral.client.Corral:
        return real(base_url, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(corral.client, "Corral", fake)


def test_server_error_is_one_line_and_exit_code_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server error prints ``error: code: message`` on one stderr line, nothing on stdout, and exits 1."""
    body = {"error": {"code": "workspace_not_found", "message": "workspace 'x' does not exist", "details": {}}}
    _serve(monkeypatch, lambda _: httpx.Response(404, json=body))
    result = runner.invoke(app, ["workspaces", "show", "x"])
    assert result.exit_code == 1
    assert result.stderr == "error: workspace_not_found: workspace 'x' does not exist\n"
    assert result.stdout == ""


def test_connection_refused_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreachable server is one ``error: connection_error: ...`` line naming the URL."""

    def refuse(_: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("All connection attempts failed") from ConnectionRefusedError(111, "refused")

    _serve(monkeypatch, refuse)
    result = runner.invoke(app, ["--url", "http://127.0.0.1:9", "providers"])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: connection_error: cannot reach Corral at http://127.0.0.1:9:")


def test_exec_prints_both_streams_and_exits_with_the_commands_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """exec streams the command's stdout and stderr to its own and exits with the command's exit code; the words
    after the workspace id are the command, ``--`` dropped; piped stdin is sent as the command's input."""
    workspace = {"id": "w1", "status": "ready"}
    sent: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/exec"):
            sent.append(json.loads(request.content))
            lines = [{"stream": "stdout", "data": "out\n"}, {"stream": "stderr", "data": "err\n"},
                     {"exit_code": 3, "timed_out": False, "duration_ms": 1.0}]  # fmt: skip
            return httpx.Response(200, content="".join(json.dumps(line) + "\n" for line in lines).encode())
        return httpx.Response(200, json=workspace)

    _serve(monkeypatch, handler)
    result = runner.invoke(app, ["workspaces", "exec", "--argv", "w1", "--", "ls", "-la"], input="in\n")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert sent == [{"command": "ls", "args": ["-la"], "mode": "argv", "stdin": "in\n", "stream": True}]


def test_image_build_off_a_terminal_prints_every_line_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a terminal (make, CI) every progress line goes to stderr unchanged, and the up-to-date and failure
    messages are the ones scripts already know."""
    lines = ["compiling the xattr shim for gVisor", "  gcc ok", "built corral/workspace:base"]

    def build(tag: str, *, if_missing: bool, progress: Callable[[str], None]) -> bool:
        for line in lines:
            progress(line)
        return not if_missing

    monkeypatch.setattr("corral.images.base.build_base_image", build)
    result = runner.invoke(app, ["image", "build"])
    assert (result.exit_code, result.stderr) == (0, "".join(f"{line}\n" for line in lines))
    result = runner.invoke(app, ["image", "build", "--if-missing", "--tag", "x:y"])
    assert result.stderr.endswith("corral: x:y is up to date\n")

    def broken(tag: str, *, if_missing: bool, progress: Callable[[str], None]) -> bool:
        raise RuntimeError("mmdebstrap failed: no network")

    monkeypatch.setattr("corral.images.base.build_base_image", broken)
    result = runner.invoke(app, ["image", "build"])
    assert (result.exit_code, result.stderr) == (1, "corral: image build failed: mmdebstrap failed: no network\n")


def test_image_build_on_a_terminal_shows_a_spinner_and_ticks_finished_steps() -> None:
    """On a terminal each finished step gets a check mark; tool output only feeds the spinner (unless verbose)."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    with BuildDisplay(console) as display:
        display.line("compiling the xattr shim for gVisor")
        display.line("  secret tool chatter")
        display.line("importing 200 MiB root filesystem")
    text = out.getvalue()
    assert "✓ compiling the xattr shim for gVisor" in text
    assert "✓ importing 200 MiB root filesystem" in text
    assert "secret tool chatter" not in text.split("✓ compiling")[1].split("\n")[0]


SNAPSHOT = {"id": "s1", "name": "after-setup", "workspace_id": "w1", "provider": "gvisor", "kind": "memory",
            "status": "ready", "size_bytes": 3 * 1024**2 // 2, "created_at": "2025-01-02T03:04:05Z"}  # fmt: skip


def test_snapshot_prints_its_id_and_reports_what_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """``workspaces snapshot`` posts the name and prints only the id on stdout (for ``SNAP=$(...)``); stderr says
    what it holds and how big it is; --json prints the API's snapshot."""
    sent: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/snapshots"):
            sent.append(json.loads(request.content))
            return httpx.Response(201, json=SNAPSHOT)
        return httpx.Response(200, json={"id": "w1", "status": "ready"})

    _serve(monkeypatch, handler)
    result = runner.invoke(app, ["workspaces", "snapshot", "w1", "--name", "after-setup"])
    assert (result.exit_code, result.stdout) == (0, "s1\n")
    assert result.stderr == (
        "snapshot s1 'after-setup' of workspace w1 ready on gvisor: files, processes and memory, 1.5M\n"
    )
    assert json.loads(runner.invoke(app, ["workspaces", "snapshot", "w1", "--json"]).stdout)["kind"] == "memory"
    assert sent == [{"name": "after-setup"}, {}]


def test_fork_prints_one_id_per_fork_and_checks_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """``workspaces fork --count 3`` posts the count and prints each fork's id; a count outside 1-16 is a usage
    error (exit 2) that sends nothing."""
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if request.url.path.endswith("/fork"):
            count = json.loads(request.content)["count"]
            forks = [{"id": f"f{i}", "status": "ready", "provider": "gvisor"} for i in range(count)]
            return httpx.Response(201, json={"workspaces": forks})
        return httpx.Response(200, json={"id": "w1", "status": "ready"})

    _serve(monkeypatch, handler)
    result = runner.invoke(app, ["workspaces", "fork", "w1", "--count", "3"])
    assert (result.exit_code, result.stdout) == (0, "f0\nf1\nf2\n")
    assert "workspace f2 ready on gvisor" in result.stderr
    assert json.loads(requests[-1].content) == {"count": 3}
    sent = len(requests)
    assert runner.invoke(app, ["workspaces", "fork", "w1", "--count", "17"]).exit_code == 2
    assert len(requests) == sent


def test_snapshots_list_filters_and_prints_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """``snapshots list --workspace --name`` sends both filters; the table has a row per snapshot with its size
    readable and a failed one's error; -q prints the ids and --json the API's list."""
    failed = {**SNAPSHOT, "id": "s0", "name": None, "kind": "filesystem", "status": "error", "size_bytes": 0,
              "error": "checkpoint failed"}  # fmt: skip
    queries: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        queries.append(dict(request.url.params))
        return httpx.Response(200, json={"snapshots": [SNAPSHOT, failed]})

    _serve(monkeypatch, handler)
    table = runner.invoke(app, ["snapshots", "list", "--workspace", "w1", "--name", "after-setup"])
    assert table.exit_code == 0, table.output
    assert queries == [{"workspace_id": "w1", "name": "after-setup"}]
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "WORKSPACE", "KIND", "STATUS", "SIZE", "PROVIDER", "CREATED"]
    assert rows[0].split()[:7] == ["s1", "after-setup", "w1", "memory", "ready", "1.5M", "gvisor"]
    assert rows[1].split()[:5] == ["s0", "-", "w1", "filesystem", "error:"] and "checkpoint failed" in rows[1]
    assert runner.invoke(app, ["snapshots", "list", "-q"]).stdout == "s1\ns0\n"
    assert [s["id"] for s in json.loads(runner.invoke(app, ["snapshots", "list", "--json"]).stdout)] == ["s1", "s0"]
    assert queries[-1] == {}, "no filter given, none sent"


@pytest.mark.parametrize("option", ["--cwd", "--cwd=/tmp", "-e", "--timeout"])
def test_exec_option_after_the_workspace_id_is_named(option: str) -> None:
    """``exec $WS --cwd /tmp pwd`` says the option is misplaced and where it goes, instead of running '--cwd' (which
    /bin/sh answered with "Illegal option --"); nothing is sent to a server."""
    words = ["--url", "http://127.0.0.1:9", "workspaces", "exec", "w1", option, "/tmp", "pwd"]
    result = runner.invoke(app, words, env={"COLUMNS": "400"})  # the message on one line of the error box
    assert result.exit_code == 2, result.output
    name = option.split("=", maxsplit=1)[0]
    assert f"{name} comes after the workspace id" in result.output
    assert f"corral workspaces exec {name} ... w1 COMMAND" in result.output


def test_pool_table_shows_a_grown_target_and_the_max(monkeypatch: pytest.MonkeyPatch) -> None:
    """``corral pool`` shows each pool's size, its target (and what a burst grew it from) and how far it may grow."""
    common = {"image": "corral/workspace:base", "resource_limits": {}, "network": "isolated", "snapshot_id": None,
              "creating": 0, "miss_reasons": {}, "last_error": None}  # fmt: skip
    grown = {**common, "key": "k1", "provider": "gvisor", "target": 6, "base_size": 1, "max_size": 10, "size": 6,
             "hits": 1, "misses": 5}  # fmt: skip
    steady = {**common, "key": "k2", "provider": "docker", "target": 2, "base_size": 2, "max_size": 8, "size": 1,
              "hits": 0, "misses": 0}  # fmt: skip
    _serve(monkeypatch, lambda _: httpx.Response(200, json={"pools": [grown, steady], "unpooled_misses": {}}))
    result = runner.invoke(app, ["pool"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["PROVIDER", "IMAGE", "SIZE", "TARGET", "MAX", "HITS", "MISSES", "LAST", "ERROR"]
    assert rows[0].split() == ["gvisor", "corral/workspace:base", "6", "6", "(grown", "from", "1)", "10", "1", "5"]
    assert rows[1].split() == ["docker", "corral/workspace:base", "1", "2", "8", "0", "0"]
