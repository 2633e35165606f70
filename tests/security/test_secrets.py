"""Repository credentials never leak: not in API answers, the audit log, the server's log or the database file, and
the database and data directory are private. Yet the repository still clones with the credential.

A real ``corral serve`` on gVisor checks out real repositories from a smart-HTTP git server on loopback. The secrets
are random, so finding one anywhere means it leaked; the search covers the raw bytes of the SQLite file and its WAL.
"""

from __future__ import annotations

import base64
import secrets
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BASE_IMAGE
from tests.e2e.conftest import Server, start_server, stop_server
from tests.gitserver import USER, GitServer

pytestmark = pytest.mark.e2e

TYPES = "/api/v1/agent-types"
SESSIONS = "/api/v1/agent/sessions"
WORKSPACES = "/api/v1/agent/workspaces"


def _secret(label: str) -> str:
    return f"{label}-{secrets.token_hex(8)}"


QUERY_TOKEN = _secret("querytoken")  # an ?access_token=, refused up front
UNREACHABLE_USER = _secret("unreachableuser")  # user:password@ of a host that does not answer ...
WRONG_PASSWORD = _secret("wrongpassword")  # a fixed repo_source credential the git server rejects
BASH_PASSWORD = _secret("bashpassword")  # typed by the agent in commands
BASH_TOKEN = _secret("bashtoken")
GIT_TOOL_PASSWORD = _secret("gittoolpassword")


def _require_base_image() -> None:
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of its own (its log and database are searched), on gVisor, with a generated secret key."""
    _require_base_image()
    srv = start_server(tmp_path_factory.mktemp("corral-secrets") / "data", {"CORRAL_PROVIDERS": "gvisor"})
    yield srv
    stop_server(srv)


def _ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _wait(server: Server, session_id: str) -> dict[str, Any]:
    """Poll until the session leaves ``provisioning`` (deadline 120 s)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        session: dict[str, Any] = _ok(server.client.get(f"{SESSIONS}/{session_id}"))
        if session["status"] != "provisioning":
            return session
        time.sleep(0.1)
    raise AssertionError(f"session {session_id} still provisioning after 120 s")


def _session(server: Server, agent_type_id: str, repository_url: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent_type_id": agent_type_id}
    if repository_url is not None:
        body["task"] = {"context": {"repository_url": repository_url}}
    return _wait(server, _ok(server.client.post(SESSIONS, json=body), 201)["id"])


def _bash(server: Server, session_id: str, command: str) -> dict[str, Any]:
    result: dict[str, Any] = _ok(server.client.post(f"{SESSIONS}/{session_id}/tools/bash", json={"command": command}))
    return result


def _assert_nowhere(server: Server, secrets_: list[str], answers: list[str]) -> None:
    """None of ``secrets_`` is in the answers, the server's log, or the bytes of the SQLite file and its WAL."""
    database = b"".join(p.read_bytes() for p in server.data_dir.glob("corral.db*"))
    assert (server.data_dir / "corral.db-wal").exists(), "the WAL is part of what is searched"
    log = server.log()
    for secret in secrets_:
        for text in answers:
            assert secret not in text, f"{secret} in an API answer: {text[:500]}"
        assert secret not in log, f"{secret} in the server log"
        assert secret.encode() not in database, f"{secret} in the SQLite file"


def _git_secrets(git: GitServer) -> list[str]:
    """The git server's secret, and the Basic header value it travels in."""
    return [git.secret, base64.b64encode(f"{USER}:{git.secret}".encode()).decode()]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _agent_type(server: Server, name: str, workspace: dict[str, Any]) -> dict[str, Any]:
    body = {"name": f"{name}-{secrets.token_hex(3)}", "workspace": {"enabled": True, "provider": "gvisor", **workspace}}
    created: dict[str, Any] = _ok(server.client.post(TYPES, json=body), 201)
    return created


def test_task_credentials_never_surface_and_the_clone_still_works(server: Server, git_server: GitServer) -> None:
    """A task URL's ?access_token= is refused up front with the token masked (git cannot clone such URLs, and would
    show them in the host's process list); user:password@ appears in no session or workspace answer, no
    degraded_reason, no log line and no database byte; the URL with user:password@ still clones, and origin is the
    clean URL."""
    git = git_server
    from_task = _agent_type(server, "from-task", {"repo_source": {"type": "task_context"}, "tools": ["bash"]})["id"]
    query_url = git.url("app", credentials=False) + f"?access_token={QUERY_TOKEN}"
    refused = server.client.post(
        SESSIONS, json={"agent_type_id": from_task, "task": {"context": {"repository_url": query_url}}}
    )
    unreachable = _session(server, from_task, f"http://u:{UNREACHABLE_USER}@127.0.0.1:9/x.git")
    cloned = _session(server, from_task, git.url("app"))
    workspace = server.client.get(f"{WORKSPACES}/{cloned['workspace_id']}")
    answers = [refused.text, str(unreachable), str(cloned), workspace.text, server.client.get(WORKSPACES).text]
    try:
        _assert_nowhere(server, [QUERY_TOKEN, UNREACHABLE_USER, *_git_secrets(git)], answers)

        assert refused.status_code == 400, refused.text
        assert "access_token=***" in refused.json()["error"]["message"]
        assert "user part" in refused.json()["error"]["message"]
        assert unreachable["degraded"] and "cannot reach http://127.0.0.1:9/x.git" in unreachable["degraded_reason"]
        assert (cloned["status"], cloned["degraded"]) == ("active", False), cloned
        assert cloned["task"]["context"]["repository_url"] == f"http://***@127.0.0.1:{git.port}/app.git"
        assert workspace.json()["metadata"]["task"]["repository_url"] == git.url("app", credentials=False)
        assert _bash(server, cloned["id"], "cat README.md")["stdout"] == "app on main\n"
        origin = _bash(server, cloned["id"], "git config remote.origin.url")["stdout"].strip()
        assert origin == git.url("app", credentials=False)
    finally:
        for session in (unreachable, cloned):
            server.client.delete(f"{SESSIONS}/{session['id']}")


def test_fixed_repo_source_credential_is_write_only(server: Server, git_server: GitServer) -> None:
    """Every agent-type route shows a fixed URL's credential as ***; sending the *** form back keeps the stored
    credential (the repository clones), pointing it at another host is refused, and a new credential replaces it."""
    git = git_server
    fixed_url = git.url("infra")
    masked = f"http://***@127.0.0.1:{git.port}/infra.git"
    fixed = _agent_type(server, "fixed", {"repo_source": {"type": "fixed", "url": fixed_url}, "tools": ["bash"]})
    path = f"{TYPES}/{fixed['id']}/workspace-config"
    config = _ok(server.client.get(path))
    kept = server.client.put(path, json={**config, "tools": ["bash", "read"]})
    answers = [str(fixed), str(config), kept.text, server.client.get(TYPES).text]
    answers.append(server.client.get(f"{TYPES}/{fixed['id']}").text)
    _assert_nowhere(server, _git_secrets(git), answers)
    assert fixed["workspace"]["repo_source"]["url"] == masked
    assert config["repo_source"] == {"type": "fixed", "url": masked, "branch": None}
    assert _ok(kept)["repo_source"]["url"] == masked

    with_kept = _session(server, fixed["id"])
    try:
        assert (with_kept["status"], with_kept["degraded"]) == ("active", False), with_kept
        assert _bash(server, with_kept["id"], "cat main.tf")["stdout"] == "# infra\n"
    finally:
        server.client.delete(f"{SESSIONS}/{with_kept['id']}")
    moved = server.client.put(path, json={**config, "repo_source": {"type": "fixed", "url": masked[:-9] + "x.git"}})
    elsewhere = {**config, "repo_source": {"type": "fixed", "url": "http://***@127.0.0.2:1/infra.git"}}
    assert server.client.put(path, json=elsewhere).status_code == 400
    assert moved.status_code == 400 and "masks its credential" in moved.json()["error"]["message"]
    replaced = server.client.put(
        path, json={**config, "repo_source": {"type": "fixed", "url": fixed_url.replace(git.secret, WRONG_PASSWORD)}}
    )
    assert _ok(replaced)["repo_source"]["url"] == masked
    with_wrong = _session(server, fixed["id"])
    server.client.delete(f"{SESSIONS}/{with_wrong['id']}")
    assert with_wrong["degraded"] and "authentication to" in with_wrong["degraded_reason"], with_wrong
    _assert_nowhere(server, [WRONG_PASSWORD, *_git_secrets(git)], [replaced.text, str(with_wrong)])


def test_credentials_typed_by_the_agent_are_masked_in_the_audit_log(server: Server) -> None:
    """A bash command cloning https://user:password@... or fetching ?access_token=..., and a git tool call adding
    such a remote, are audited with the credentials masked."""
    agent_type = _agent_type(server, "typist", {"tools": ["bash", "git"]})
    session = _session(server, agent_type["id"])
    try:
        command = f"git clone https://agent:{BASH_PASSWORD}@git.invalid/x.git; wget 'https://h.invalid/?access_token={BASH_TOKEN}'"
        assert _bash(server, session["id"], command)["exit_code"] != 0  # isolated: no network; only the text matters
        remote = ["remote", "add", "up", f"https://agent:{GIT_TOOL_PASSWORD}@git.invalid/x.git"]
        _ok(server.client.post(f"{SESSIONS}/{session['id']}/tools/git", json={"args": remote}))
        audit = server.client.get(f"{SESSIONS}/{session['id']}/audit")
        _assert_nowhere(server, [BASH_PASSWORD, BASH_TOKEN, GIT_TOOL_PASSWORD], [audit.text])
        summaries = [e["arguments_summary"] for e in audit.json()["entries"]]
        assert summaries[0].startswith(
            "git clone https://***@git.invalid/x.git; wget 'https://h.invalid/?access_token=***'"
        )
        assert summaries[1] == "git remote add up https://***@git.invalid/x.git"
    finally:
        server.client.delete(f"{SESSIONS}/{session['id']}")


def test_database_and_data_directory_are_private(server: Server) -> None:
    """The data directory is 0700; the database, its WAL and shared-memory files and the secret key are 0600."""
    assert _mode(server.data_dir) == 0o700
    for name in ("corral.db", "corral.db-wal", "corral.db-shm", "secret-key"):
        assert _mode(server.data_dir / name) == 0o600, name


def test_an_existing_install_gets_its_modes_fixed(tmp_path: Path) -> None:
    """A data directory and database left world-readable by an older version are made private at start."""
    _require_base_image()
    data = tmp_path / "data"
    first = start_server(data, {"CORRAL_PROVIDERS": "gvisor"})
    stop_server(first)
    data.chmod(0o755)
    for path in data.iterdir():
        path.chmod(0o644)
    second = start_server(data, {"CORRAL_PROVIDERS": "gvisor"})
    try:
        assert _mode(data) == 0o700
        for name in ("corral.db", "corral.db-wal", "corral.db-shm", "secret-key"):
            assert _mode(data / name) == 0o600, name
    finally:
        stop_server(second)
