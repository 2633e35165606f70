"""A real ``corral serve`` process on a free loopback port, for tests that go through HTTP like a user."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import BASE_IMAGE

TOKEN = "e2e-test-token"


@dataclass
class Server:
    """A running server and a client already carrying the token."""

    url: str
    client: httpx.Client
    process: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path

    def log(self) -> str:
        """What the server printed so far."""
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def docker_inspect(kind: str, name: str) -> dict[str, object] | None:
    """``docker {container|volume} inspect`` as JSON, or None when the object does not exist."""
    proc = subprocess.run(["docker", kind, "inspect", name], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    data: list[dict[str, object]] = json.loads(proc.stdout)
    return data[0]


def start_server(data_dir: Path, env: dict[str, str] | None = None) -> Server:
    """Start ``corral serve`` and wait (polling, with a deadline) until /healthz answers."""
    port = free_port()
    log_path = data_dir / "server.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "CORRAL_DATA_DIR": str(data_dir),
        "CORRAL_API_TOKEN": TOKEN,
        "CORRAL_PROVIDERS": "firecracker,gvisor,docker",
        "CORRAL_WARM_POOL_SIZE": "0",
        "CORRAL_E2B_WARM_POOL_SIZE": "0",
        **(env or {}),
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "corral.cli", "serve", "--port", str(port)],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"corral serve exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    else:
        process.kill()
        raise RuntimeError(f"corral serve did not answer within 60 s:\n{log_path.read_text()}")
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    return Server(url, client, process, data_dir, log_path)


def stop_server(server: Server, *, destroy_workspaces: bool = True) -> None:
    """Destroy what the server created (so nothing leaks), then stop it."""
    try:
        if destroy_workspaces and server.process.poll() is None:
            for ws in server.client.get("/api/v1/agent/workspaces").json()["workspaces"]:
                server.client.delete(f"/api/v1/agent/workspaces/{ws['id']}")
            for snapshot in server.client.get("/api/v1/agent/snapshots").json().get("snapshots", []):
                server.client.delete(f"/api/v1/agent/snapshots/{snapshot['id']}")
    finally:
        server.client.close()
        server.process.terminate()
        try:
            server.process.wait(15)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module, on gVisor and Docker; skips (a failure under CI) without dockerd."""
    if subprocess.run(["docker", "version"], capture_output=True, check=False).returncode != 0:
        pytest.skip("Docker engine not reachable; run `make bootstrap`")
    srv = start_server(tmp_path_factory.mktemp("corral-e2e"))
    yield srv
    stop_server(srv)


@contextmanager
def serving_e2b(
    tmp_path_factory: pytest.TempPathFactory, name: str, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """A server on gVisor whose E2B-compatible API answers; skips (a failure under CI) without the base image."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")
    server = start_server(tmp_path_factory.mktemp(name), {"CORRAL_PROVIDERS": "gvisor", **(env or {})})
    try:
        answer = server.client.get("/e2b/v2/sandboxes", headers={"X-API-KEY": TOKEN})
        if answer.status_code != 200:
            pytest.fail(f"the E2B API is not served (GET /e2b/v2/sandboxes -> {answer.status_code})")
        yield server
    finally:
        stop_server(server)


# --- a browser and a workspace, shared by the e2e tests that need them ----------------------------------------------

ARTIFACTS = Path(os.environ.get("CORRAL_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
"""Screenshots and other files a person looks at after a run (gitignored)."""
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these, Chromium keeps connecting to Google's services, which this closed network refuses.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def chromium() -> Iterator[Any]:
    """Debian's headless Chromium through Playwright, with a fresh profile; skips (a failure under CI) without it."""
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"{CHROMIUM} not installed; run `make bootstrap`")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed; run `make bootstrap`")
    with sync_api.sync_playwright() as playwright:
        # Playwright's launch makes a fresh temporary profile (--user-data-dir) and removes it afterwards.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def gvisor_workspace(server: Server) -> Iterator[str]:
    """A gVisor workspace on ``server``, destroyed at the end."""
    created = server.client.post("/api/v1/agent/workspaces", json={"provider": "gvisor"})
    assert created.status_code == 201, created.text
    workspace_id = str(created.json()["id"])
    try:
        yield workspace_id
    finally:
        server.client.delete(f"/api/v1/agent/workspaces/{workspace_id}")
