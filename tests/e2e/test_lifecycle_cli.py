"""Lifecycle calls added for people, through HTTP and the ``corral`` command against a real server: listing
sessions, deleting agent types (refused while sessions of them are live), and seeing warm-pool workspaces."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.test_cli import corral, ok

pytestmark = pytest.mark.e2e

SESSIONS = "/api/v1/agent/sessions"
TYPES = "/api/v1/agent-types"


def test_sessions_list_and_agent_type_rm(server: Server) -> None:
    """Sessions list newest first (filtered by status, each as GET shows it); an agent type with live sessions is
    refused with 409 naming them, by HTTP and by ``agent-types rm NAME``; once they end it is deleted with them."""
    agent_type = server.client.post(TYPES, json={"name": "lifecycle-rm"}).json()
    first = server.client.post(SESSIONS, json={"agent_type_id": agent_type["id"]}).json()
    second = server.client.post(SESSIONS, json={"agent_type_id": agent_type["id"]}).json()
    assert first["status"] == second["status"] == "active"  # no workspace: active at once

    listed = server.client.get(SESSIONS).json()["sessions"]
    ours = [s for s in listed if s["agent_type_id"] == agent_type["id"]]
    assert [s["id"] for s in ours] == [second["id"], first["id"]]
    assert ours[0] == server.client.get(f"{SESSIONS}/{second['id']}").json()
    assert {s["status"] for s in server.client.get(SESSIONS, params={"status": "ended"}).json()["sessions"]} <= {
        "ended"
    }
    bad = server.client.get(SESSIONS, params={"status": "sleeping"})
    assert bad.status_code == 400 and "sleeping" in bad.json()["error"]["message"]

    table = ok(server, "sessions", "list")
    row = next(line for line in table.splitlines() if line.startswith(second["id"]))
    assert "lifecycle-rm" in row and "active" in row
    assert second["id"] in ok(server, "sessions", "list", "-q", "--status", "active").split()

    refused = server.client.delete(f"{TYPES}/{agent_type['id']}")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "agent_type_in_use"
    assert set(error["details"]["sessions"]) == {first["id"], second["id"]} and first["id"] in error["message"]
    rm = corral(server, "agent-types", "rm", "lifecycle-rm")
    assert rm.returncode == 1 and "agent_type_in_use" in rm.stderr and second["id"] in rm.stderr, rm.stderr

    for session in (first, second):
        server.client.delete(f"{SESSIONS}/{session['id']}")
    assert ok(server, "agent-types", "rm", "lifecycle-rm") == f"{agent_type['id']}\n"
    assert server.client.get(f"{TYPES}/{agent_type['id']}").status_code == 404
    assert server.client.get(f"{SESSIONS}/{first['id']}").status_code == 404  # went with its type
    missing = corral(server, "agent-types", "rm", "lifecycle-rm")
    assert missing.returncode == 1 and "agent_type_not_found" in missing.stderr


def test_warm_pool_workspaces_are_listed_with_all(tmp_path: Path) -> None:
    """Warm workspaces are hidden from the default list and shown, marked warm, with ``include_warm=true`` and
    ``corral workspaces list --all``; none is left behind after the server stops."""
    server = start_server(tmp_path / "data", {"CORRAL_WARM_POOL_SIZE": "1", "CORRAL_PROVIDERS": "gvisor"})
    warm_ids: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not warm_ids:
            assert time.monotonic() < deadline, "the warm pool never filled"
            listed = server.client.get("/api/v1/agent/workspaces", params={"include_warm": "true"}).json()
            warm_ids = [w["id"] for w in listed["workspaces"] if w["warm"] and w["status"] == "ready"]
            if not warm_ids:
                time.sleep(0.2)
        [warm] = [w for w in listed["workspaces"] if w["id"] in warm_ids]
        assert warm["pool"] and warm["provider"] == "gvisor"
        assert server.client.get("/api/v1/agent/workspaces").json()["workspaces"] == []

        assert ok(server, "workspaces", "list") == "no workspaces\n"
        table = ok(server, "workspaces", "list", "--all")
        header, *rows = table.splitlines()
        assert header.split()[-1] == "WARM"
        assert any(r.startswith(warm["id"]) and r.split()[-1] == "warm" for r in rows), table
        assert warm["id"] in [w["id"] for w in json.loads(ok(server, "workspaces", "list", "--all", "--json"))]
    finally:
        stop_server(server)
    for workspace_id in warm_ids:
        leftover = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=corral.workspace.id={workspace_id}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert leftover.stdout.strip() == "", f"warm workspace {workspace_id} left a container"
