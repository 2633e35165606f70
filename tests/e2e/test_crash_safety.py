"""A server killed with SIGKILL in the middle of creating workspaces leaves nothing untracked after it restarts."""

from __future__ import annotations

import concurrent.futures
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from corral.settings import Settings
from tests.e2e.conftest import TOKEN, Server, start_server, stop_server

pytestmark = pytest.mark.e2e

API = "/api/v1/agent/workspaces"


def _containers(owner: str) -> dict[str, bool]:
    """This owner's workspace containers: id -> running."""
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label=corral.owner={owner}",
            "--format",
            '{{.Label "corral.workspace.id"}} {{.State}}',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {wid: state == "running" for wid, state in (line.split() for line in out.splitlines())}


def _volumes(owner: str) -> set[str]:
    """This owner's workspace volumes, by workspace id."""
    out = subprocess.run(
        [
            "docker",
            "volume",
            "ls",
            "--filter",
            f"label=corral.owner={owner}",
            "--format",
            '{{.Label "corral.workspace.id"}}',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def _records(data_dir: Path) -> dict[str, str]:
    with sqlite3.connect(data_dir / "corral.db") as db:
        return dict(db.execute("select id, status from workspaces").fetchall())


def _wait_for_pool_to_settle(server: Server) -> None:
    """Poll until the restarted server's warm pool is full and creates nothing more (its own refill is live)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pools = server.client.get(f"{API}/pool").json()["pools"]
        if all(p["size"] == p["target"] and p["creating"] == 0 for p in pools):
            return
        time.sleep(0.1)
    raise AssertionError(f"warm pool did not settle: {pools}")


def _create(url: str) -> int:
    try:
        return httpx.post(f"{url}{API}", json={}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60).status_code
    except httpx.TransportError:
        return 0  # the server died mid-request, as intended


def test_sigkill_during_creates_leaves_no_untracked_workspace(tmp_path: Path) -> None:
    """SIGKILL while 10 creates run; after restart every labelled object has a record and every record matches."""
    if subprocess.run(["docker", "version"], capture_output=True, check=False).returncode != 0:
        pytest.skip("Docker engine not reachable; run `make bootstrap`")
    data_dir = tmp_path / "data"
    owner = Settings(data_dir=data_dir).owner_id()
    env = {"CORRAL_WARM_POOL_SIZE": "2", "CORRAL_WARM_POOL_DRAIN_ON_SHUTDOWN": "true"}
    first = start_server(data_dir, env)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(_create, first.url) for _ in range(10)]
        # Kill once the runtime holds some of the new workspaces, so creates are caught at every stage.
        deadline = time.monotonic() + 60
        while len(_volumes(owner)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(10)
        concurrent.futures.wait(futures)
    first.client.close()
    assert _volumes(owner), "the kill came before any workspace existed; the test proves nothing"

    second: Server = start_server(data_dir, env)
    try:
        _wait_for_pool_to_settle(second)
        records = _records(data_dir)
        containers = _containers(owner)
        volumes = _volumes(owner)
        for workspace_id in {*containers, *volumes}:
            assert workspace_id in records, f"{workspace_id} exists in Docker without a record"
        for workspace_id, status in records.items():
            running = containers.get(workspace_id, False)
            if status == "ready":
                assert running, f"{workspace_id} is ready but its container is not running"
            elif status == "stopped":
                assert workspace_id in volumes and not running
            else:
                assert workspace_id not in containers and workspace_id not in volumes, (
                    f"{workspace_id} is {status} but still has runtime objects"
                )
        listed = second.client.get(API).json()["workspaces"]
        for ws in listed:
            assert ws["status"] == records[ws["id"]]
    finally:
        stop_server(second)
    # A clean shutdown drains the pool and the test destroyed the rest: nothing of this owner is left.
    assert _containers(owner) == {}
    assert _volumes(owner) == set()
