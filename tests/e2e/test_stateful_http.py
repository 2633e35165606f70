"""Issue 13's "done when", over HTTP on gVisor: pause with memory, full-disk stop, forks, snapshots that outlive a
server restart, and agent types that set up once and start many.

A "counter" is a background process (started with setsid, so the exec's end does not take it along) writing its pid
and an increasing number to /tmp; memory was kept when the same pid is still counting on after a resume or restore.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from corral.settings import Settings
from tests.e2e.conftest import Server, docker_inspect, start_server, stop_server
from tests.gitserver import GitServer, make_repository, serve_git

pytestmark = pytest.mark.e2e

WORKSPACES = "/api/v1/agent/workspaces"
SNAPSHOTS = "/api/v1/agent/snapshots"
COUNTER = (
    "setsid sh -c 'echo $$ > /tmp/counter.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; "
    "sleep 0.05; done' >/dev/null 2>&1 < /dev/null & while [ ! -s /tmp/counter.pid ]; do sleep 0.01; done"
)


def _create(server: Server, **body: Any) -> dict[str, Any]:
    resp = server.client.post(WORKSPACES, json={"provider": "gvisor", **body})
    assert resp.status_code == 201, resp.text
    workspace: dict[str, Any] = resp.json()
    return workspace


def _sh(server: Server, workspace_id: str, command: str) -> str:
    resp = server.client.post(f"{WORKSPACES}/{workspace_id}/exec", json={"command": command})
    assert resp.status_code == 200, resp.text
    assert resp.json()["exit_code"] == 0, resp.json()
    return str(resp.json()["stdout"]).strip()


def _counter(server: Server, workspace_id: str) -> tuple[int, int]:
    for _ in range(20):
        out = _sh(server, workspace_id, "cat /tmp/counter.pid /tmp/counter").split()
        if len(out) == 2:
            return int(out[0]), int(out[1])
    raise AssertionError("no counter")


def _counting_on(server: Server, workspace_id: str, pid: int, past: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now_pid, count = _counter(server, workspace_id)
        assert now_pid == pid, "a different process: memory was not kept"
        if count > past:
            return
        time.sleep(0.05)
    raise AssertionError(f"counter {pid} stopped at {past}")


def _post(server: Server, path: str, body: dict[str, Any] | None = None, status: int = 200) -> Any:
    resp = server.client.post(path, json=body or {})
    assert resp.status_code == status, resp.text
    return resp.json()


def test_a_counter_keeps_counting_across_ten_pause_cycles(server: Server) -> None:
    """Pause answers "memory" and status paused; after each of ten resumes the same process counts on."""
    ws = _create(server)
    _sh(server, ws["id"], COUNTER)
    pid, _ = _counter(server, ws["id"])
    for _ in range(10):
        _, before = _counter(server, ws["id"])
        paused = _post(server, f"{WORKSPACES}/{ws['id']}/pause")
        assert (paused["status"], paused["pause"]) == ("paused", "memory")
        refused = server.client.post(f"{WORKSPACES}/{ws['id']}/exec", json={"command": "true"})
        assert refused.status_code == 409 and "paused" in refused.text
        assert _post(server, f"{WORKSPACES}/{ws['id']}/resume")["status"] == "ready"
        _counting_on(server, ws["id"], pid, before)


def test_a_file_in_root_and_an_installed_package_survive_stop_and_resume(server: Server) -> None:
    """Stop/resume keeps the whole disk: /root, a dpkg-installed package, /etc; capabilities say persistence full."""
    ws = _create(server)
    _sh(
        server,
        ws["id"],
        "mkdir -p /tmp/p/DEBIAN /tmp/p/usr/bin && printf '#!/bin/sh\\necho demo-ok\\n' > /tmp/p/usr/bin/demo && "
        "chmod 755 /tmp/p/usr/bin/demo && printf 'Package: demo\\nVersion: 1\\nArchitecture: all\\nMaintainer: t "
        "<t@e.invalid>\\nDescription: d\\n' > /tmp/p/DEBIAN/control && dpkg-deb --build /tmp/p /tmp/demo.deb "
        ">/dev/null && dpkg -i /tmp/demo.deb >/dev/null && echo kept > /root/note",
    )
    assert _post(server, f"{WORKSPACES}/{ws['id']}/stop")["status"] == "stopped"
    _post(server, f"{WORKSPACES}/{ws['id']}/resume")
    assert _sh(server, ws["id"], "cat /root/note; demo; dpkg-query -W -f='${Status}' demo").splitlines() == [
        "kept",
        "demo-ok",
        "install ok installed",
    ]
    providers = server.client.get(f"{WORKSPACES}/providers").json()["providers"]
    gvisor = next(p for p in providers if p["name"] == "gvisor")["capabilities"]
    assert (gvisor["persistence"], gvisor["pause"], gvisor["snapshots"]) == ("full", "memory", "memory")


def test_three_forks_see_the_source_and_not_each_other(server: Server) -> None:
    """Each fork has the source's file and counter; writes in one are invisible to the others and the source."""
    ws = _create(server)
    _sh(server, ws["id"], f"{COUNTER}; echo base > /workspace/shared")
    pid, _ = _counter(server, ws["id"])
    forks = _post(server, f"{WORKSPACES}/{ws['id']}/fork", {"count": 3}, status=201)["workspaces"]
    ids = [f["id"] for f in forks]
    assert len(set(ids)) == 3 and ws["id"] not in ids
    for index, fork_id in enumerate(ids):
        _sh(server, fork_id, f"echo {index} > /workspace/mine")
    for index, fork_id in enumerate(ids):
        assert _sh(server, fork_id, "cat /workspace/shared /workspace/mine") == f"base\n{index}"
        fork_pid, count = _counter(server, fork_id)
        assert fork_pid == pid
        _counting_on(server, fork_id, pid, count)
    assert _sh(server, ws["id"], "test -e /workspace/mine || echo absent") == "absent"
    hostnames = {_sh(server, w, "hostname") for w in [ws["id"], *ids]}
    assert len(hostnames) == 4
    assert server.client.get(SNAPSHOTS, params={"workspace_id": ws["id"]}).json()["snapshots"] == []
    bad = server.client.post(f"{WORKSPACES}/{ws['id']}/fork", json={"count": 17})
    assert bad.status_code == 400 and "count" in bad.text


def test_a_snapshot_restores_into_a_new_workspace_after_a_server_restart(tmp_path: Path) -> None:
    """A snapshot (record and files) survives a restart; the restored workspace has the file and the process."""
    first = start_server(tmp_path / "corral")
    try:
        ws = _create(first)
        _sh(first, ws["id"], f"{COUNTER}; echo kept > /root/in-root")
        pid, _ = _counter(first, ws["id"])
        snapshot = _post(first, f"{WORKSPACES}/{ws['id']}/snapshots", {"name": "before-restart"}, status=201)
        assert (snapshot["status"], snapshot["kind"], snapshot["name"]) == ("ready", "memory", "before-restart")
        assert snapshot["size_bytes"] > 0
    finally:
        stop_server(first, destroy_workspaces=False)
    second = start_server(tmp_path / "corral")
    try:
        listed = second.client.get(SNAPSHOTS, params={"name": "before-restart"}).json()["snapshots"]
        assert [s["id"] for s in listed] == [snapshot["id"]]
        restored = _post(second, WORKSPACES, {"from_snapshot": snapshot["id"]}, status=201)
        assert restored["id"] != ws["id"] and restored["metadata"]["from_snapshot"] == snapshot["id"]
        assert _sh(second, restored["id"], "cat /root/in-root") == "kept"
        restored_pid, count = _counter(second, restored["id"])
        assert restored_pid == pid
        _counting_on(second, restored["id"], pid, count)
        mixed = second.client.post(WORKSPACES, json={"from_snapshot": snapshot["id"], "network": "default"})
        assert mixed.status_code == 400 and "network" in mixed.text
        assert second.client.delete(f"{SNAPSHOTS}/{snapshot['id']}").status_code == 204
        assert second.client.get(f"{SNAPSHOTS}/{snapshot['id']}").status_code == 404
        assert docker_inspect("volume", f"corral-snapshot-{snapshot['id']}") is None
        gone = second.client.post(WORKSPACES, json={"from_snapshot": snapshot["id"]})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "snapshot_not_found"
    finally:
        stop_server(second)


@pytest.fixture(scope="module")
def git(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServer]:
    root = tmp_path_factory.mktemp("git")
    make_repository(root, "app", {"main": {"README.md": "app\n"}})
    with serve_git(root, secret=f"s3cr3t-{secrets.token_hex(8)}") as served:
        yield served


def _session(server: Server, type_id: str, repo_url: str) -> dict[str, Any]:
    body = {"agent_type_id": type_id, "task": {"context": {"repository_url": repo_url, "branch": "main"}}}
    session: dict[str, Any] = _post(server, "/api/v1/agent/sessions", body, status=201)
    deadline = time.monotonic() + 180
    while session["status"] == "provisioning" and time.monotonic() < deadline:
        time.sleep(0.1)
        session = server.client.get(f"/api/v1/agent/sessions/{session['id']}").json()
    assert session["status"] == "active" and not session["degraded"], session
    return session


def test_the_second_session_of_a_snapshot_after_setup_type_skips_setup(server: Server, git: GitServer) -> None:
    """The first session runs checkout and setup and snapshots; the second restores it: its setup log shows no run,
    and its workspace has the checkout, the setup's result and its running process."""
    setup = (
        "echo ran-$(date +%s%N) >> /workspace/setup.log && echo built > /root/built && "
        "setsid sh -c 'echo $$ > /tmp/daemon.pid; while :; do sleep 1; done' >/dev/null 2>&1 </dev/null & "
        "while [ ! -s /tmp/daemon.pid ]; do sleep 0.01; done"
    )
    workspace = {
        "enabled": True,
        "provider": "gvisor",
        "repo_source": {"type": "task_context"},
        "setup_commands": [setup],
        "snapshot_after_setup": True,
    }
    type_id = _post(server, "/api/v1/agent-types", {"name": f"t-{secrets.token_hex(4)}", "workspace": workspace}, 201)[
        "id"
    ]
    url = git.url("app")
    first = _session(server, type_id, url)
    first_ws = server.client.get(f"{WORKSPACES}/{first['workspace_id']}").json()
    assert first_ws["metadata"]["setup"]["source"] == "ran"
    daemon = _sh(server, first["workspace_id"], "cat /tmp/daemon.pid")
    second = _session(server, type_id, url)
    second_ws = server.client.get(f"{WORKSPACES}/{second['workspace_id']}").json()
    # Restored now, or ahead of time by the snapshot's warm pool (then "warm_pool": true): whichever was first.
    assert {k: second_ws["metadata"]["setup"][k] for k in ("source", "snapshot_id")} == {
        "source": "snapshot",
        "snapshot_id": first_ws["metadata"]["setup"]["snapshot_id"],
    }
    log = _sh(server, second["workspace_id"], "cat /workspace/setup.log")
    assert len(log.splitlines()) == 1, "setup ran again"
    assert _sh(server, second["workspace_id"], "cat /workspace/README.md /root/built") == "app\nbuilt"
    assert _sh(server, second["workspace_id"], f"cat /tmp/daemon.pid; kill -0 {daemon} && echo alive") == (
        f"{daemon}\nalive"
    )
    # A new commit is a new key: the next session sets up again.
    work = git.root / "app-work"
    (work / "NEW.md").write_text("new\n")
    for args in (["add", "NEW.md"], ["commit", "-q", "-m", "new"], ["push", "-q", str(git.root / "app.git"), "main"]):
        subprocess.run(["git", *args], cwd=work, check=True, capture_output=True)
    third = _session(server, type_id, url)
    third_ws = server.client.get(f"{WORKSPACES}/{third['workspace_id']}").json()
    assert third_ws["metadata"]["setup"]["source"] == "ran"
    assert _sh(server, third["workspace_id"], "cat /workspace/NEW.md") == "new"
    for session in (first, second, third):
        assert server.client.delete(f"/api/v1/agent/sessions/{session['id']}").status_code == 200


def _owned(server: Server, kind: str = "container") -> set[str]:
    """Of this server's installation (its owner label): the workspace ids of its containers (running or not), or
    the names of its volumes."""
    owner = Settings(data_dir=server.data_dir).owner_id()
    listing = ["ps", "-a"] if kind == "container" else ["volume", "ls"]
    shown = '{{.Label "corral.workspace.id"}}' if kind == "container" else "{{.Name}}"
    command = ["docker", *listing, "--filter", f"label=corral.owner={owner}", "--format", shown]
    return set(subprocess.run(command, capture_output=True, text=True, check=True).stdout.split())


def _setup_pool(server: Server, snapshot_id: str) -> dict[str, Any] | None:
    pools = server.client.get(f"{WORKSPACES}/pool").json()["pools"]
    return next((p for p in pools if p["snapshot_id"] == snapshot_id), None)


def _wait_for_setup_pool(server: Server, snapshot_id: str, size: int) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pool = _setup_pool(server, snapshot_id)
        if pool is not None and pool["size"] == size and pool["creating"] == 0:
            return pool
        time.sleep(0.1)
    raise AssertionError(
        f"the pool of setup snapshot {snapshot_id} never held {size}: {_setup_pool(server, snapshot_id)}"
    )


def test_a_later_session_is_served_from_a_pool_restored_from_the_setup_snapshot(tmp_path: Path, git: GitServer) -> None:
    """Once the first session made its setup snapshot, a warm pool restores it ahead of time; the next session gets
    a workspace created before it was asked for, with the checkout, the setup's files and process and no new setup
    run. Deleting the snapshot destroys the pool's workspaces, and after shutdown no container is left."""
    server = start_server(tmp_path / "corral", {"CORRAL_PROVIDERS": "gvisor", "CORRAL_SETUP_POOL_SIZE": "1"})
    try:
        setup = (
            "echo ran >> /workspace/setup.log && echo built > /root/built && "
            "setsid sh -c 'echo $$ > /tmp/daemon.pid; while :; do sleep 1; done' >/dev/null 2>&1 </dev/null & "
            "while [ ! -s /tmp/daemon.pid ]; do sleep 0.01; done"
        )
        workspace = {
            "enabled": True,
            "provider": "gvisor",
            "repo_source": {"type": "task_context"},
            "setup_commands": [setup],
            "snapshot_after_setup": True,
        }
        agent_type = _post(server, "/api/v1/agent-types", {"name": "pooled", "workspace": workspace}, 201)
        url = git.url("app")
        first = _session(server, agent_type["id"], url)
        first_ws = server.client.get(f"{WORKSPACES}/{first['workspace_id']}").json()
        assert first_ws["metadata"]["setup"]["source"] == "ran"
        snapshot_id = first_ws["metadata"]["setup"]["snapshot_id"]
        daemon = _sh(server, first["workspace_id"], "cat /tmp/daemon.pid")
        pool = _wait_for_setup_pool(server, snapshot_id, 1)
        assert (pool["provider"], pool["target"]) == ("gvisor", 1)

        second = _session(server, agent_type["id"], url)
        second_ws = server.client.get(f"{WORKSPACES}/{second['workspace_id']}").json()
        assert second_ws["from_warm_pool"] is True
        assert second_ws["metadata"]["setup"] == {"source": "snapshot", "snapshot_id": snapshot_id, "warm_pool": True}
        made, asked = (datetime.fromisoformat(x["created_at"]) for x in (second_ws, second))
        assert made < asked, "the workspace was not made ahead of the session"
        assert _sh(server, second["workspace_id"], "cat /workspace/setup.log") == "ran", "setup ran again"
        assert _sh(server, second["workspace_id"], "cat /workspace/README.md /root/built") == "app\nbuilt"
        assert _sh(server, second["workspace_id"], f"kill -0 {daemon} && echo alive") == "alive"

        _wait_for_setup_pool(server, snapshot_id, 1)  # the hand-out refilled it
        live = {first["workspace_id"], second["workspace_id"]}
        [member] = _owned(server) - live
        assert server.client.delete(f"{SNAPSHOTS}/{snapshot_id}").status_code == 204
        assert _setup_pool(server, snapshot_id) is None
        assert _owned(server) == live
        assert server.client.get(f"{WORKSPACES}/{member}").json()["status"] == "destroyed"
        for session in (first, second):
            assert server.client.delete(f"/api/v1/agent/sessions/{session['id']}").status_code == 200
        # A new setup snapshot and its pool again, for the shutdown to drain.
        third = _session(server, agent_type["id"], url)
        third_ws = server.client.get(f"{WORKSPACES}/{third['workspace_id']}").json()
        assert third_ws["metadata"]["setup"]["source"] == "ran"
        _wait_for_setup_pool(server, third_ws["metadata"]["setup"]["snapshot_id"], 1)
        assert len(_owned(server) - {third["workspace_id"]}) == 1
    finally:
        stop_server(server)
    assert _owned(server) == set(), "a warm workspace outlived the server"
    assert _owned(server, "volume") == set()
