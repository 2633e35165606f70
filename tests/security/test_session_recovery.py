"""Sessions never stay ``provisioning`` after a restart, and failures another provider would not fix are not retried.

A real ``corral serve`` on gVisor is killed (SIGKILL) or stopped (SIGTERM) while a session checks a repository out
(with a credential in its URL) and runs a long setup command. Restarted on the same data directory, the server
reclaims the first workspace and provisions the session again, so it ends ``active`` with working tools.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.settings import Settings
from tests.conftest import BASE_IMAGE
from tests.e2e.conftest import Server, docker_inspect, start_server, stop_server
from tests.gitserver import GitServer

pytestmark = pytest.mark.e2e

TYPES = "/api/v1/agent-types"
SESSIONS = "/api/v1/agent/sessions"
ENV = {"CORRAL_PROVIDERS": "gvisor"}
SETUP_S = 15  # long enough that the server is certainly stopped while the setup command runs


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory whose runtime objects are all removed afterwards, whatever happened to the servers."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")
    data = tmp_path / "data"
    yield data
    label = f"label=corral.owner={Settings(data_dir=data).owner_id()}"
    containers = _docker("ps", "-aq", "--filter", label).split()
    if containers:
        subprocess.run(["docker", "rm", "-f", *containers], capture_output=True, check=False)
    volumes = _docker("volume", "ls", "-q", "--filter", label).split()
    if volumes:
        subprocess.run(["docker", "volume", "rm", "-f", *volumes], capture_output=True, check=False)


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout


def _runtime_objects(workspace_id: str) -> list[str]:
    """Containers and volumes labelled with this workspace id."""
    label = f"label=corral.workspace.id={workspace_id}"
    return _docker("ps", "-aq", "--filter", label).split() + _docker("volume", "ls", "-q", "--filter", label).split()


def _ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _poll_session(server: Server, session_id: str, done: Any, what: str, deadline_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        session: dict[str, Any] = _ok(server.client.get(f"{SESSIONS}/{session_id}"))
        if done(session):
            return session
        time.sleep(0.1)
    raise AssertionError(f"session {session_id}: {what} did not happen within {deadline_s} s")


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_session_interrupted_while_provisioning_is_resumed_at_restart(
    data_dir: Path, git_server: GitServer, stop: signal.Signals
) -> None:
    """Stopped mid-setup (killed or terminated), the restarted server destroys the first workspace and provisions
    the session again from its snapshot and its (sealed) credential: it becomes active and its tools work."""
    first = start_server(data_dir, ENV)
    try:
        agent_type = _ok(first.client.post(TYPES, json={"name": "slow", "workspace": {
            "enabled": True, "provider": "gvisor", "repo_source": {"type": "task_context"}, "tools": ["bash", "read"],
            "setup_commands": [f"sleep {SETUP_S}", "echo set up > setup.txt"], "setup_timeout_s": 120,
        }}), 201)  # fmt: skip
        body = {"agent_type_id": agent_type["id"], "task": {"context": {"repository_url": git_server.url("app")}}}
        session_id = _ok(first.client.post(SESSIONS, json=body), 201)["id"]
        session = _poll_session(first, session_id, lambda s: s["workspace_id"], "getting a workspace")
        old_workspace = session["workspace_id"]
        assert session["status"] == "provisioning"
        first.process.send_signal(stop)
        first.process.wait(60)
    finally:
        first.client.close()
        if first.process.poll() is None:
            first.process.kill()
            first.process.wait()
    with sqlite3.connect(data_dir / "corral.db") as db:
        [(status,)] = db.execute("select status from sessions where id = ?", (session_id,)).fetchall()
    assert status == "provisioning", "the server stopped before provisioning was over"
    if stop is signal.SIGKILL:
        assert docker_inspect("container", f"corral-{old_workspace}") is not None, "a killed server leaves it running"

    second = start_server(data_dir, ENV)
    try:
        session = _poll_session(second, session_id, lambda s: s["status"] != "provisioning", "leaving provisioning")
        assert (session["status"], session["degraded"]) == ("active", False), session
        assert session["workspace_id"] not in (None, old_workspace)
        tool = second.client.post(f"{SESSIONS}/{session_id}/tools/bash", json={"command": "cat README.md setup.txt"})
        assert _ok(tool)["stdout"] == "app on main\nset up\n"
        assert _runtime_objects(old_workspace) == [], "the first attempt's container or volume is still there"
        assert f"session {session_id} was still provisioning when the server stopped" in second.log()
        _ok(second.client.delete(f"{SESSIONS}/{session_id}"))
    finally:
        stop_server(second)


def test_a_bad_repository_url_degrades_without_a_second_attempt(data_dir: Path) -> None:
    """A checkout that fails (nothing listens at the URL) is not retried on another provider: one attempt, one
    workspace, and the session is degraded with the reason."""
    server = start_server(data_dir, ENV)
    try:
        agent_type = _ok(server.client.post(TYPES, json={"name": "bad", "workspace": {
            "enabled": True, "repo_source": {"type": "task_context"},
        }}), 201)  # fmt: skip
        body = {"agent_type_id": agent_type["id"], "task": {"context": {"repository_url": "http://127.0.0.1:9/x.git"}}}
        session_id = _ok(server.client.post(SESSIONS, json=body), 201)["id"]
        session = _poll_session(server, session_id, lambda s: s["status"] != "provisioning", "leaving provisioning")
        assert (session["status"], session["degraded"], session["workspace_id"]) == ("active", True, None)
        assert "cannot reach http://127.0.0.1:9/x.git" in session["degraded_reason"]
        assert session["degraded_reason"].count("attempt") == 1 and "not retried" in session["degraded_reason"]
        with sqlite3.connect(data_dir / "corral.db") as db:
            metadata = [json.loads(m) for (m,) in db.execute("select metadata from workspaces").fetchall()]
        made = [m for m in metadata if m.get("session_id") == session_id]
        assert len(made) == 1, f"{len(made)} workspaces were made for the session"
        _ok(server.client.delete(f"{SESSIONS}/{session_id}"))
    finally:
        stop_server(server)
