"""Seed 001 over HTTP against gVisor: agent types, auto-provisioned sessions, task context, setup commands.

The repositories are real git repositories made here and served over smart HTTP on loopback behind Basic auth, so
every clone URL carries credentials, as a hosted forge's would.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Server, docker_inspect
from tests.gitserver import GitServer, make_repository, serve_git

pytestmark = pytest.mark.e2e

TYPES = "/api/v1/agent-types"
SESSIONS = "/api/v1/agent/sessions"
WORKSPACES = "/api/v1/agent/workspaces"


@pytest.fixture(scope="module")
def git(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServer]:
    root = tmp_path_factory.mktemp("git")
    make_repository(
        root,
        "app",
        {
            "main": {"README.md": "app on main\n"},
            "feature/auth": {"auth.py": "TOKEN_CHECK = True\n"},
            "develop": {"develop.txt": "develop branch\n"},
        },
    )
    make_repository(root, "infra", {"main": {"terraform/main.tf": "# infra\n"}})
    with serve_git(root, secret=f"s3cr3t-{secrets.token_hex(8)}") as server:
        yield server


def _agent_type(server: Server, workspace: dict[str, Any] | None = None) -> str:
    body: dict[str, Any] = {"name": f"type-{secrets.token_hex(4)}"}
    if workspace is not None:
        body["workspace"] = workspace
    resp = server.client.post(TYPES, json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _start(server: Server, agent_type_id: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent_type_id": agent_type_id}
    if context is not None:
        body["task"] = {"context": context}
    resp = server.client.post(SESSIONS, json=body)
    assert resp.status_code == 201, resp.text
    session: dict[str, Any] = resp.json()
    return session


def _wait(server: Server, session_id: str) -> dict[str, Any]:
    """Poll until the session leaves ``provisioning`` (deadline 120 s)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        session: dict[str, Any] = server.client.get(f"{SESSIONS}/{session_id}").json()
        if session["status"] != "provisioning":
            return session
        time.sleep(0.1)
    raise AssertionError(f"session {session_id} still provisioning after 120 s")


def _sh(server: Server, workspace_id: str, command: str) -> dict[str, Any]:
    resp = server.client.post(f"{WORKSPACES}/{workspace_id}/exec", json={"command": command})
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


def _end(server: Server, session_id: str) -> None:
    assert server.client.delete(f"{SESSIONS}/{session_id}").json()["status"] == "ended"


def test_new_agent_type_is_disabled_and_config_lists_every_field(server: Server) -> None:
    """A type created without configuration has enabled = false, and GET shows every field of the config."""
    type_id = _agent_type(server)
    config = server.client.get(f"{TYPES}/{type_id}/workspace-config").json()
    assert config["enabled"] is False
    assert set(config) >= {
        "enabled", "repo_source", "tools", "resource_limits", "checkout_on_start", "base_image", "setup_commands",
    }  # fmt: skip


def test_invalid_config_is_rejected_naming_every_problem(server: Server) -> None:
    """PUT with an invalid tool, malformed limits, an unknown source type and more gets one 400 naming each."""
    type_id = _agent_type(server)
    resp = server.client.put(
        f"{TYPES}/{type_id}/workspace-config",
        json={"enabled": True, "tools": ["bash", "ssh"], "resource_limits": {"memory": "lots", "cpu": "0"},
              "repo_source": {"type": "svn"}, "setup_timeout_s": -1},
    )  # fmt: skip
    assert resp.status_code == 400
    message = resp.json()["error"]["message"]
    assert "invalid tool name(s) ['ssh']" in message
    assert "valid tools: bash, read, write, edit, grep, glob, git" in message
    assert "resource_limits.memory" in message and "resource_limits.cpu" in message
    assert "repo_source.type: 'svn'" in message
    assert "setup_timeout_s" in message
    fixed = server.client.put(f"{TYPES}/{type_id}/workspace-config", json={"repo_source": {"type": "fixed"}})
    assert fixed.status_code == 400
    assert "fixed repository source needs a url" in fixed.json()["error"]["message"]
    assert server.client.get(f"{TYPES}/{type_id}/workspace-config").json()["enabled"] is False, "nothing was saved"


def test_disabled_type_gets_no_workspace(server: Server) -> None:
    """Sessions of a type with enabled = false are active at once, with no workspace."""
    session = _start(server, _agent_type(server, {"enabled": False}))
    assert session["status"] == "active"
    assert session["workspace_id"] is None
    _end(server, session["id"])


def test_pr_task_context_checks_out_the_branch_and_keeps_credentials_out(server: Server, git: GitServer) -> None:
    """A PR task clones feature/auth, puts PR number and base branch in the workspace metadata, and the
    repository's credentials appear nowhere inside the running workspace."""
    tools = ["bash", "read", "write", "edit", "grep", "git"]
    type_id = _agent_type(
        server,
        {"enabled": True, "repo_source": {"type": "task_context"}, "tools": tools,
         "resource_limits": {"cpu": "2", "memory": "4G"}},
    )  # fmt: skip
    context = {
        "repository_url": git.url("app"),
        "branch": "feature/auth",
        "pull_request_number": 42,
        "base_branch": "main",
    }
    session = _start(server, type_id, context)
    assert session["status"] == "provisioning"
    assert git.secret not in str(session)
    session = _wait(server, session["id"])
    assert session["status"] == "active" and not session["degraded"], session
    wid = session["workspace_id"]

    workspace = server.client.get(f"{WORKSPACES}/{wid}").json()
    task = workspace["metadata"]["task"]
    assert (task["pull_request_number"], task["base_branch"], task["branch"]) == (42, "main", "feature/auth")
    assert task["repository_url"] == git.url("app", credentials=False)
    assert workspace["resource_limits"] == {"cpu": "2", "memory": "4G", "disk": "10G"}

    head = _sh(server, wid, "git -C /workspace rev-parse --abbrev-ref HEAD && cat /workspace/auth.py")
    assert head["stdout"] == "feature/auth\nTOKEN_CHECK = True\n"
    assert _sh(server, wid, "git -C /workspace config remote.origin.url")["stdout"].strip() == git.url(
        "app", credentials=False
    )
    # The pattern matches the secret but is not the secret, so the search cannot find its own command line.
    pattern = "s3cr3t-[0-9a-f]{16}"
    assert git.secret.startswith("s3cr3t-") and pattern not in git.secret
    hunt = _sh(
        server,
        wid,
        f"grep -rIlE --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e '{pattern}' / ; "
        f"cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -cE -e '{pattern}' ; "
        f"env | grep -cE -e '{pattern}'",
    )
    # grep finds no file, and the two counts (processes and environment) are zero.
    assert hunt["stdout"].split() == ["0", "0"], hunt
    assert server.client.get(f"{SESSIONS}/{session['id']}").status_code == 200
    _end(server, session["id"])
    assert docker_inspect("container", f"corral-{wid}") is None
    assert docker_inspect("volume", f"agent-workspace-{wid}") is None


def test_task_branch_overrides_the_type_default(server: Server, git: GitServer) -> None:
    """The type's branch is only a fallback: a task naming develop gets develop."""
    type_id = _agent_type(server, {"enabled": True, "repo_source": {"type": "task_context", "branch": "main"}})
    with_branch = _wait(server, _start(server, type_id, {"repository_url": git.url("app"), "branch": "develop"})["id"])
    without = _wait(server, _start(server, type_id, {"repository_url": git.url("app")})["id"])
    assert _sh(server, with_branch["workspace_id"], "cat develop.txt")["stdout"] == "develop branch\n"
    assert _sh(server, without["workspace_id"], "git rev-parse --abbrev-ref HEAD")["stdout"] == "main\n"
    _end(server, with_branch["id"])
    _end(server, without["id"])


def test_fixed_repository_ignores_the_task_and_none_means_empty(server: Server, git: GitServer) -> None:
    """A fixed source clones its own repository whatever the task says; none and a task without a repository
    leave /workspace empty."""
    fixed = _agent_type(server, {"enabled": True, "repo_source": {"type": "fixed", "url": git.url("infra")}})
    none = _agent_type(server, {"enabled": True, "repo_source": {"type": "none"}})
    from_task = _agent_type(server, {"enabled": True, "repo_source": {"type": "task_context"}})
    sessions = [
        _wait(server, _start(server, fixed, {"repository_url": git.url("app"), "branch": "develop"})["id"]),
        _wait(server, _start(server, none, {"repository_url": git.url("app")})["id"]),
        _wait(server, _start(server, from_task, {"branch": "develop"})["id"]),
    ]
    assert _sh(server, sessions[0]["workspace_id"], "ls terraform; ls develop.txt")["stdout"] == "main.tf\n"
    for session in sessions[1:]:
        assert _sh(server, session["workspace_id"], "ls -A /workspace | wc -l")["stdout"] == "0\n"
    for session in sessions:
        _end(server, session["id"])


def test_setup_commands_run_in_order_and_a_failure_stops_the_rest(server: Server) -> None:
    """Setup runs in /workspace in order; a failing command skips the rest and leaves a warning with its exit code
    and output tail; the session is still active."""
    type_id = _agent_type(
        server,
        {
            "enabled": True,
            "setup_commands": ["pwd > where.txt", "echo building; echo broken >&2; exit 3", "touch never"],
        },
    )
    session = _wait(server, _start(server, type_id)["id"])
    assert session["status"] == "active" and not session["degraded"]
    [warning] = session["warnings"]
    assert "'echo building; echo broken >&2; exit 3' failed with exit code 3" in warning
    assert "1 later command(s) skipped" in warning and "broken" in warning
    assert _sh(server, session["workspace_id"], "cat where.txt; ls never")["stdout"] == "/workspace\n"
    workspace = server.client.get(f"{WORKSPACES}/{session['workspace_id']}").json()
    # Beside it, at most the one-line summary of providers skipped without being tried (Firecracker without KVM).
    assert warning in workspace["warnings"]
    assert all(w == warning or w.startswith("skipped ") for w in workspace["warnings"]), workspace["warnings"]
    _end(server, session["id"])


def test_setup_command_past_its_timeout_is_killed_with_a_warning(server: Server) -> None:
    """A setup command running past the type's setup_timeout_s is killed and recorded as a warning."""
    type_id = _agent_type(server, {"enabled": True, "setup_timeout_s": 1, "setup_commands": ["sleep 45"]})
    started = time.monotonic()
    session = _wait(server, _start(server, type_id)["id"])
    assert time.monotonic() - started < 40, "the setup command was not cut short"
    assert session["status"] == "active"
    assert "timed out after 1 s and was killed" in session["warnings"][0]
    assert "sleep 45" not in _sh(server, session["workspace_id"], "ps -eo args")["stdout"]
    _end(server, session["id"])


def test_no_setup_commands_means_ready_after_checkout(server: Server, git: GitServer) -> None:
    """Without setup commands the session is active as soon as the checkout is done, with no warning."""
    type_id = _agent_type(server, {"enabled": True, "repo_source": {"type": "fixed", "url": git.url("infra")}})
    session = _wait(server, _start(server, type_id)["id"])
    assert (session["status"], session["warnings"], session["degraded"]) == ("active", [], False)
    _end(server, session["id"])


@pytest.mark.parametrize(
    ("context", "reason"),
    [
        ({"branch": "no-such-branch"}, "branch 'no-such-branch' does not exist"),
        ({"wrong_secret": True}, "authentication to"),
        ({"repository_url": "http://127.0.0.1:9/missing.git"}, "cannot reach"),
    ],
)
def test_clone_failures_degrade_the_session_with_the_reason(
    server: Server, git: GitServer, context: dict[str, Any], reason: str
) -> None:
    """A missing branch, wrong credentials or an unreachable host: not retried (another provider would not fix it);
    the session is active, degraded, and says why; no workspace is left behind."""
    type_id = _agent_type(server, {"enabled": True, "repo_source": {"type": "task_context"}})
    url = git.url("app")
    if context.pop("wrong_secret", False):
        url = url.replace(git.secret, "wrong")
    session = _wait(server, _start(server, type_id, {"repository_url": url, **context})["id"])
    assert session["status"] == "active"
    assert session["degraded"] is True
    assert reason in session["degraded_reason"]
    assert session["degraded_reason"].count("attempt") == 1
    assert session["workspace_id"] is None
    assert git.secret not in session["degraded_reason"]
    _end(server, session["id"])


def test_config_changes_apply_to_later_sessions_only(server: Server, git: GitServer) -> None:
    """A running session keeps the configuration it started with; the next session gets the new one."""
    type_id = _agent_type(server, {"enabled": True, "repo_source": {"type": "fixed", "url": git.url("infra")}})
    first = _wait(server, _start(server, type_id)["id"])
    resp = server.client.put(
        f"{TYPES}/{type_id}/workspace-config",
        json={"enabled": True, "repo_source": {"type": "none"}, "tools": ["read"]},
    )
    assert resp.status_code == 200 and resp.json()["tools"] == ["read"]
    second = _wait(server, _start(server, type_id)["id"])
    assert _sh(server, first["workspace_id"], "ls")["stdout"] == "terraform\n"
    assert _sh(server, second["workspace_id"], "ls -A | wc -l")["stdout"] == "0\n"
    _end(server, first["id"])
    _end(server, second["id"])


def test_bad_session_input_is_a_named_4xx(server: Server) -> None:
    """Unknown agent types, malformed task contexts and unknown sessions get JSON errors naming the problem."""
    resp = server.client.post(SESSIONS, json={"agent_type_id": "nope"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "agent_type_not_found"
    type_id = _agent_type(server, {"enabled": True})
    bad = server.client.post(
        SESSIONS,
        json={
            "agent_type_id": type_id,
            "task": {"context": {"repository_url": "ext::sh -c id", "pull_request_number": "x"}},
        },
    )
    assert bad.status_code == 400
    assert (
        "repository_url" in bad.json()["error"]["message"] and "pull_request_number" in bad.json()["error"]["message"]
    )
    assert server.client.get(f"{SESSIONS}/nope").status_code == 404


def _tool(server: Server, session_id: str, tool: str, **arguments: Any) -> Any:
    return server.client.post(f"{SESSIONS}/{session_id}/tools/{tool}", json=arguments)


def test_tools_work_on_the_checkout_and_land_in_the_audit_log(server: Server, git: GitServer) -> None:
    """The agent's tools act on the checked-out repository: one shell per session, file tools, grep, glob, git;
    every call, refused ones included, is in the audit log."""
    type_id = _agent_type(
        server,
        {
            "enabled": True,
            "repo_source": {"type": "task_context"},
            "tools": ["bash", "read", "edit", "grep", "glob", "git"],
        },
    )
    session = _wait(server, _start(server, type_id, {"repository_url": git.url("app"), "branch": "feature/auth"})["id"])
    sid = session["id"]
    assert _tool(server, sid, "bash", command="mkdir -p pkg && cd pkg && export STAGE=two").json()["exit_code"] == 0
    state = _tool(server, sid, "bash", command="pwd; echo $STAGE").json()
    assert state["stdout"] == "/workspace/pkg\ntwo\n"
    read = _tool(server, sid, "read", path="auth.py").json()
    assert (read["content"], read["total_lines"]) == ("TOKEN_CHECK = True\n", 1)
    assert _tool(server, sid, "edit", path="auth.py", old_string="True", new_string="False").json() == {
        "replacements": 1
    }
    grep = _tool(server, sid, "grep", pattern="TOKEN_CHECK").json()
    assert grep["matches"] == [{"path": "auth.py", "line_number": 1, "line": "TOKEN_CHECK = False"}]
    assert _tool(server, sid, "glob", pattern="*.py").json()["paths"] == ["auth.py"]
    diff = _tool(server, sid, "git", args=["diff", "--stat"]).json()
    assert diff["exit_code"] == 0 and "auth.py" in diff["stdout"]
    commit = _tool(server, sid, "git", args=["commit", "-am", "flip the check"]).json()
    assert commit["exit_code"] == 0, commit
    refused = _tool(server, sid, "write", path="new.txt", content="x")
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == "Tool 'write' is not enabled for this agent type"
    escape = _tool(server, sid, "read", path="../etc/passwd")
    assert escape.status_code == 400 and "outside /workspace" in escape.json()["error"]["message"]
    hook = _tool(server, sid, "git", args=["-c", "core.hooksPath=/tmp", "status"])
    assert hook.status_code == 400

    entries = server.client.get(f"{SESSIONS}/{sid}/audit").json()["entries"]
    assert [e["tool"] for e in entries] == [
        "bash",
        "bash",
        "read",
        "edit",
        "grep",
        "glob",
        "git",
        "git",
        "write",
        "read",
        "git",
    ]
    assert [e["status"] for e in entries][-3:] == ["refused", "error", "error"]
    assert entries[0]["arguments_summary"].startswith("mkdir -p pkg")
    _end(server, sid)


def test_tool_policy_errors(server: Server, git: GitServer) -> None:
    """A tool outside the type's list is 403 with the seed's message; unknown tools 404; a type without a workspace
    answers 404; a degraded session says why."""
    limited = _wait(server, _start(server, _agent_type(server, {"enabled": True, "tools": ["read", "grep"]}))["id"])
    resp = _tool(server, limited["id"], "bash", command="id")
    assert resp.status_code == 403
    assert resp.json()["error"]["message"] == "Tool 'bash' is not enabled for this agent type"
    unknown = _tool(server, limited["id"], "ssh")
    assert unknown.status_code == 404 and "valid tools" in unknown.json()["error"]["message"]

    disabled = _start(server, _agent_type(server))
    assert _tool(server, disabled["id"], "read", path="x").status_code == 404

    broken_type = _agent_type(server, {"enabled": True, "repo_source": {"type": "task_context"}})
    broken = _wait(server, _start(server, broken_type, {"repository_url": git.url("app"), "branch": "gone"})["id"])
    degraded = _tool(server, broken["id"], "read", path="README.md")
    assert degraded.status_code == 409
    assert "branch 'gone' does not exist" in degraded.json()["error"]["message"]
    for session in (limited, disabled, broken):
        _end(server, session["id"])
