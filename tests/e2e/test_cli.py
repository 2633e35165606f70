"""The ``corral`` command as a user runs it: real ``corral`` subprocesses against a real ``corral serve`` on gVisor.
The README's command-line example runs as printed, in a fresh shell, in test_readme.py."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import TOKEN, Server, free_port

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
CORRAL = [str(BIN / "corral")] if (BIN / "corral").exists() else [sys.executable, "-m", "corral.cli"]


def _env(server: Server, **extra: str) -> dict[str, str]:
    return {**os.environ, "CORRAL_URL": server.url, "CORRAL_API_TOKEN": TOKEN,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}  # fmt: skip


def corral(server: Server, *args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``corral ARGS`` as a subprocess with the server's URL and token in the environment; ``stdin`` is piped
    in (none: /dev/null, so the test's own stdin is never forwarded)."""
    return subprocess.run([*CORRAL, *args], env=_env(server, **env), capture_output=True, text=True, timeout=300,
                          check=False, input=stdin, stdin=subprocess.DEVNULL if stdin is None else None)  # fmt: skip


def ok(server: Server, *args: str) -> str:
    """Run ``corral ARGS``, require exit code 0, and return its stdout."""
    proc = corral(server, *args)
    assert proc.returncode == 0, f"corral {' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def assert_one_line_error(proc: subprocess.CompletedProcess[str], expected: str) -> None:
    """Exit code 1, nothing on stdout, and exactly one stderr line: the expected ``error: code: message``."""
    assert proc.returncode == 1, proc
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(expected), proc.stderr


def test_providers_table_and_json(server: Server) -> None:
    """``providers`` prints a table with each provider's status and ``--json`` the API's list."""
    table = ok(server, "providers")
    rows = {line.split()[0]: line.split()[1] for line in table.splitlines()[1:]}
    assert rows["gvisor"] == "healthy" and rows["firecracker"] == "unhealthy"
    assert {p["name"] for p in json.loads(ok(server, "providers", "--json"))} >= {"gvisor", "docker", "firecracker"}


def test_workspace_lifecycle(server: Server) -> None:
    """create prints the id; exec prints both streams and exits with the command's code (shell line, argv, JSON);
    list, stop (exec then fails in one line), resume and rm work on it."""
    created = corral(server, "workspaces", "create", "--provider", "gvisor", "--memory", "2G", "--meta", "team=qa")
    assert created.returncode == 0, created.stderr
    ws = created.stdout.strip()
    assert f"workspace {ws} ready on gvisor" in created.stderr
    try:
        assert ws in ok(server, "workspaces", "list", "-q").split()
        assert ws in ok(server, "workspaces", "list")
        run = corral(server, "workspaces", "exec", ws, "echo out; echo err >&2; exit 7")
        assert (run.returncode, run.stdout, run.stderr) == (7, "out\n", "err\n")
        argv = corral(server, "workspaces", "exec", "--argv", "-e", "X=1", ws, "--", "printf", "%s|", "$X", "a b")
        assert (argv.returncode, argv.stdout) == (0, "$X|a b|")
        as_json = json.loads(ok(server, "workspaces", "exec", "--json", "--cwd", "/tmp", ws, "pwd"))
        assert (as_json["exit_code"], as_json["stdout"]) == (0, "/tmp\n")
        shown = json.loads(ok(server, "workspaces", "show", ws, "--json"))
        assert (shown["resource_limits"]["memory"], shown["metadata"]) == ("2G", {"team": "qa"})

        assert ok(server, "workspaces", "stop", ws) == f"{ws} stopped\n"
        assert_one_line_error(corral(server, "workspaces", "exec", ws, "true"), "error: workspace_state_conflict: ")
        assert ok(server, "workspaces", "resume", ws) == f"{ws} ready\n"
        assert corral(server, "workspaces", "exec", ws, "true").returncode == 0
    finally:
        assert ok(server, "workspaces", "rm", ws) == f"{ws}\n"
    assert json.loads(ok(server, "workspaces", "show", ws, "--json"))["status"] == "destroyed"
    assert_one_line_error(corral(server, "workspaces", "exec", ws, "true"), "error: workspace_destroyed: ")


def test_errors_are_one_line_with_exit_code_1(server: Server) -> None:
    """An unknown workspace, an unknown provider, a wrong token and a server that is not there each give one
    ``error: code: message`` line and exit code 1, never a traceback."""
    assert_one_line_error(
        corral(server, "workspaces", "show", "x"), "error: workspace_not_found: workspace 'x' does not exist"
    )
    assert_one_line_error(
        corral(server, "workspaces", "create", "--provider", "nope"), "error: provider_not_found: unknown provider"
    )
    assert_one_line_error(corral(server, "workspaces", "list", CORRAL_API_TOKEN="wrong"), "error: unauthorized: ")
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert_one_line_error(
        corral(server, "providers", CORRAL_URL=nowhere),
        f"error: connection_error: cannot reach Corral at {nowhere}: connection refused",
    )


def test_agent_types_sessions_and_tools(server: Server) -> None:
    """An agent type made with flags and reconfigured; a session started with --wait; tools called with a bare
    value, --arg pairs and JSON; a refused tool is one error line; audit lists it; end ends it."""
    name = f"cli-{secrets.token_hex(4)}"
    type_id = ok(server, "agent-types", "create", name, "--tools", "bash,read,write", "--repo", "none").strip()
    shown = json.loads(ok(server, "agent-types", "show", type_id, "--json"))
    assert (shown["name"], shown["workspace"]["enabled"], shown["workspace"]["tools"]) == (
        name, True, ["bash", "read", "write"],
    )  # fmt: skip
    config = json.loads(ok(server, "agent-types", "set-config", type_id, "--tools", "bash,read,edit", "--setup",
                           "echo ready > setup.txt", "--json"))  # fmt: skip
    assert (config["tools"], config["setup_commands"], config["enabled"]) == (
        ["bash", "read", "edit"], ["echo ready > setup.txt"], True,
    )  # fmt: skip
    assert name in ok(server, "agent-types", "list")

    started = corral(server, "sessions", "start", type_id, "--wait")
    assert started.returncode == 0, started.stderr
    session = started.stdout.strip()
    assert f"session {session} active (workspace " in started.stderr
    try:
        bash = corral(server, "sessions", "tool", session, "bash", "cat setup.txt; cd /tmp; exit 5")
        assert (bash.returncode, bash.stdout) == (5, "ready\n")
        pwd = corral(server, "sessions", "tool", session, "bash", "-a", "command=pwd", "-a", "timeout_s:=10")
        assert (pwd.returncode, pwd.stdout) == (0, "/tmp\n"), "one shell per session: cd carried over"
        assert ok(server, "sessions", "tool", session, "read", "setup.txt") == "ready\n"
        edit = '{"path": "setup.txt", "old_string": "ready", "new_string": "steady"}'
        assert ok(server, "sessions", "tool", session, "edit", edit) == "1 replacement(s)\n"
        read = json.loads(ok(server, "sessions", "tool", session, "read", "--json", "-a", "path=setup.txt"))
        assert read == {"content": "steady\n", "total_lines": 1, "truncated": False}
        assert_one_line_error(
            corral(server, "sessions", "tool", session, "write", "-a", "path=x", "-a", "content=y"),
            "error: tool_not_allowed: Tool 'write' is not enabled for this agent type",
        )
        audit = json.loads(ok(server, "sessions", "audit", session, "--json"))
        assert [(e["tool"], e["status"]) for e in audit][-1] == ("write", "refused")
        assert json.loads(ok(server, "sessions", "show", session, "--json"))["status"] == "active"
    finally:
        assert ok(server, "sessions", "end", session) == f"{session} ended\n"
    assert_one_line_error(corral(server, "sessions", "tool", session, "bash", "ls"), "error: session_state_conflict: ")


@pytest.fixture
def snapshots_cleaned(server: Server) -> Iterator[None]:
    """Delete every snapshot a test leaves behind (the server fixture destroys only workspaces)."""
    yield
    for snapshot in server.client.get("/api/v1/agent/snapshots").json()["snapshots"]:
        server.client.delete(f"/api/v1/agent/snapshots/{snapshot['id']}")


# A background process that outlives the exec: the agent ends an exec's process group with it, so it leaves with
# setsid, and the exec waits until it has written its pid (else the group could be killed before setsid ran).
SLEEPER = (
    "setsid sh -c 'echo $$ > /tmp/sleeper.pid; exec sleep 3600' >/dev/null 2>&1 < /dev/null & "
    "while [ ! -s /tmp/sleeper.pid ]; do sleep 0.01; done"
)


def test_pause_snapshot_restore_fork_and_snapshots_commands(server: Server, snapshots_cleaned: None) -> None:
    """pause prints what was kept and resume brings the process back; snapshot prints the id that snapshots list
    shows (filtered by workspace and name); create --from-snapshot and fork print new workspaces with the source's
    files and process; snapshots rm deletes it, and an unknown id is one error line."""
    ws = ok(server, "workspaces", "create", "--provider", "gvisor").strip()
    made = [ws]
    name = f"cli-{secrets.token_hex(4)}"
    alive = "kill -0 $(cat /tmp/sleeper.pid) && cat /root/data.txt"
    try:
        ok(server, "workspaces", "exec", ws, f"{SLEEPER}; echo original > /root/data.txt")
        assert ok(server, "workspaces", "pause", ws) == f"{ws} paused (memory kept)\n"
        assert json.loads(ok(server, "workspaces", "show", ws, "--json"))["status"] == "paused"
        assert_one_line_error(corral(server, "workspaces", "exec", ws, "true"), "error: workspace_state_conflict: ")
        assert ok(server, "workspaces", "resume", ws) == f"{ws} ready\n"
        assert ok(server, "workspaces", "exec", ws, alive) == "original\n", "the process came back"

        taken = corral(server, "workspaces", "snapshot", ws, "--name", name)
        assert taken.returncode == 0, taken.stderr
        snap = taken.stdout.strip()
        assert f"snapshot {snap} '{name}' of workspace {ws} ready on gvisor: files, processes and memory" in (
            taken.stderr
        )
        rows = ok(server, "snapshots", "list", "--workspace", ws).splitlines()
        assert rows[0].split()[:6] == ["ID", "NAME", "WORKSPACE", "KIND", "STATUS", "SIZE"]
        assert [r.split()[:5] for r in rows[1:]] == [[snap, name, ws, "memory", "ready"]]
        assert ok(server, "snapshots", "list", "--name", name, "-q") == f"{snap}\n"
        assert json.loads(ok(server, "snapshots", "show", snap, "--json"))["workspace_id"] == ws

        restored = ok(server, "workspaces", "create", "--from-snapshot", snap).strip()
        made.append(restored)
        assert ok(server, "workspaces", "exec", restored, alive) == "original\n"
        forked = corral(server, "workspaces", "fork", ws, "--count", "2")
        assert forked.returncode == 0, forked.stderr
        forks = forked.stdout.split()
        made += forks
        assert len(set(forks) - {ws, restored}) == 2
        for fork in forks:
            assert ok(server, "workspaces", "exec", fork, alive) == "original\n"

        assert ok(server, "snapshots", "rm", snap) == f"{snap}\n"
        assert ok(server, "snapshots", "list", "--workspace", ws) == "no snapshots\n", "fork left no snapshot"
        assert_one_line_error(corral(server, "snapshots", "rm", snap), "error: snapshot_not_found: ")
        assert ok(server, "workspaces", "exec", restored, "cat /root/data.txt") == "original\n"
    finally:
        ok(server, "workspaces", "rm", *made)


def test_exec_streams_output_and_forwards_piped_stdin(server: Server) -> None:
    """``echo x | corral workspaces exec $WS cat`` prints x; streamed output keeps stdout and stderr apart and the
    exit code; the first line reaches a reader seconds before a slow command ends; ``--no-stdin`` sends none."""
    ws = ok(server, "workspaces", "create", "--provider", "gvisor").strip()
    try:
        piped = corral(server, "workspaces", "exec", ws, "cat", stdin="x\n")
        assert (piped.returncode, piped.stdout) == (0, "x\n"), piped.stderr
        argv = corral(server, "workspaces", "exec", "--argv", ws, "--", "wc", "-l", stdin="a\nb\n")
        assert (argv.returncode, argv.stdout.strip()) == (0, "2")
        both = corral(server, "workspaces", "exec", ws, "cat; echo err >&2; exit 4", stdin="in\n")
        assert (both.returncode, both.stdout, both.stderr) == (4, "in\n", "err\n")
        ignored = corral(server, "workspaces", "exec", "--no-stdin", ws, "cat; echo done", stdin="x\n")
        assert (ignored.returncode, ignored.stdout) == (0, "done\n")
        slow = [*CORRAL, "workspaces", "exec", ws, "echo first; sleep 3; echo last"]
        with subprocess.Popen(slow, env=_env(server), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE) as process:
            assert process.stdout is not None
            first = process.stdout.readline()
            assert first == b"first\n" and process.poll() is None  # the command still runs: the line came early
            assert (process.stdout.read(), process.wait(30)) == (b"last\n", 0)
    finally:
        ok(server, "workspaces", "rm", ws)
