"""The unmodified E2B SDK's ``Sandbox.create()`` is served from E2B's warm pool on a real gVisor server, and the
sandbox it gets behaves as a fresh one (user, home, envs, metadata)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BASE_IMAGE
from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.test_e2b_sdk import run_user_script

pytestmark = pytest.mark.e2e

API = "/api/v1/agent/workspaces"


@pytest.fixture(name="pooled_server")
def pooled_server_fixture(tmp_path: Path) -> Iterator[Server]:
    """A gVisor server whose only warm pool is E2B's (one workspace); skips without Docker or the base image."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")
    server = start_server(tmp_path / "data", {"CORRAL_PROVIDERS": "gvisor", "CORRAL_E2B_WARM_POOL_SIZE": "1"})
    try:
        yield server
    finally:
        stop_server(server)


def _full_pool(server: Server) -> dict[str, Any]:
    """E2B's pool once it holds its target with nothing being created (polled, with a deadline)."""
    deadline = time.monotonic() + 120
    while True:
        [pool] = server.client.get(f"{API}/pool").json()["pools"]
        if pool["size"] >= pool["target"] and pool["creating"] == 0:
            return pool  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"E2B's warm pool never filled: {pool}"
        time.sleep(0.1)


def test_sdk_create_is_a_pool_hit_and_the_pool_refills(pooled_server: Server, tmp_path: Path) -> None:
    """Sandbox.create() (networked, base template) takes the pool's warm workspace; its command runs as ``user`` in
    /home/user with the sandbox's envs; the pool counts a hit and refills."""
    before = _full_pool(pooled_server)
    assert (before["network"], before["target"], before["hits"]) == ("default", 1, 0)
    report = run_user_script(
        pooled_server,
        tmp_path,
        """
        import json
        from e2b import Sandbox

        sandbox = Sandbox.create(metadata={"team": "corral"}, envs={"GREETING": "hi"})
        result = sandbox.commands.run('echo "$GREETING $(whoami) $(pwd)"')
        print(json.dumps({"id": sandbox.sandbox_id, "out": result.stdout, "info": sandbox.get_info().metadata}))
        sandbox.kill()
        """,
    )
    assert report["out"] == "hi user /home/user\n"
    assert report["info"] == {"team": "corral"}
    record = pooled_server.client.get(f"{API}/{report['id']}").json()
    assert record["from_warm_pool"] is True
    after = _full_pool(pooled_server)
    assert (after["hits"], after["misses"], after["size"]) == (1, 0, 1)
