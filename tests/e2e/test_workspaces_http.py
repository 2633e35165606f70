"""Issue [1/7]'s acceptance, over real HTTP against a real server on gVisor."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.conftest import Server, docker_inspect

pytestmark = pytest.mark.e2e

API = "/api/v1/agent/workspaces"


def _create(server: Server, **body: object) -> dict[str, object]:
    resp = server.client.post(API, json=body)
    assert resp.status_code == 201, resp.text
    data: dict[str, object] = resp.json()
    return data


def _exec(server: Server, workspace_id: object, command: str, **extra: object) -> dict[str, object]:
    resp = server.client.post(f"{API}/{workspace_id}/exec", json={"command": command, **extra})
    assert resp.status_code == 200, resp.text
    data: dict[str, object] = resp.json()
    return data


def test_request_without_token_is_401(server: Server) -> None:
    """Every API route refuses a request without the bearer token."""
    resp = httpx.get(f"{server.url}{API}")
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "unauthorized"


def test_gvisor_workspace_lifecycle_over_http(server: Server) -> None:
    """A gVisor workspace runs under runsc with its volume, 2 CPUs and 4 GiB; files survive stop/resume; delete
    removes container and volume."""
    ws = _create(server, provider="gvisor")
    wid = ws["id"]
    assert ws["provider"] == "gvisor" and ws["status"] == "ready"

    container = docker_inspect("container", f"corral-{wid}")
    assert container is not None
    host = container["HostConfig"]
    assert isinstance(host, dict)
    assert host["Runtime"] == "runsc"
    assert host["NanoCpus"] == 2 * 10**9
    assert host["Memory"] == 4 * 1024**3
    mounts = container["Mounts"]
    assert isinstance(mounts, list)
    volumes = [(m["Name"], m["Destination"]) for m in mounts if m["Type"] == "volume"]
    assert volumes == [(f"agent-workspace-{wid}", "/workspace")]
    # The only other mount: the agent's runtime, read-only.
    assert [(m["Destination"], m["RW"]) for m in mounts if m["Type"] != "volume"] == [("/.corral", False)]

    put = server.client.put(f"{API}/{wid}/files", params={"path": "notes/before-stop.txt"}, content=b"still here")
    assert put.status_code == 200, put.text
    assert server.client.post(f"{API}/{wid}/stop").json()["status"] == "stopped"
    stopped = docker_inspect("container", f"corral-{wid}")
    assert stopped is not None and not stopped["State"]["Running"], "stop keeps the container (its disk), stopped"  # type: ignore[index]
    assert server.client.post(f"{API}/{wid}/resume").json()["status"] == "ready"
    assert server.client.get(f"{API}/{wid}/files", params={"path": "notes/before-stop.txt"}).content == b"still here"
    assert _exec(server, wid, "cat /workspace/notes/before-stop.txt")["stdout"] == "still here"

    assert server.client.delete(f"{API}/{wid}").json()["status"] == "destroyed"
    assert docker_inspect("container", f"corral-{wid}") is None
    assert docker_inspect("volume", f"agent-workspace-{wid}") is None


def test_exit_codes_and_timeouts(server: Server) -> None:
    """`exit 3` returns 3; `sleep 60` with a 1 s timeout comes back long before 60 s and leaves no process."""
    wid = _create(server)["id"]
    assert _exec(server, wid, "exit 3")["exit_code"] == 3
    started = time.monotonic()
    result = _exec(server, wid, "sleep 60", timeout_s=1)
    elapsed = time.monotonic() - started
    assert result["timed_out"] is True
    assert elapsed < 30, f"the timed-out command took {elapsed:.1f} s to come back"
    processes = _exec(server, wid, "ps -eo args")["stdout"]
    assert isinstance(processes, str)
    assert "sleep 60" not in processes, processes
    server.client.delete(f"{API}/{wid}")


def test_symlinks_cannot_lead_the_file_api_out_of_the_workspace(server: Server) -> None:
    """A symlink inside /workspace that points outside cannot be read or written through the file API."""
    wid = _create(server)["id"]
    assert _exec(server, wid, "ln -s /etc /workspace/etc-link && ln -s /etc/hostname /workspace/host")["exit_code"] == 0
    for path in ("etc-link/passwd", "host"):
        resp = server.client.get(f"{API}/{wid}/files", params={"path": path})
        assert resp.status_code == 400, resp.text
        assert "outside /workspace" in resp.json()["error"]["message"]
    resp = server.client.put(f"{API}/{wid}/files", params={"path": "etc-link/evil"}, content=b"x")
    assert resp.status_code == 400
    server.client.delete(f"{API}/{wid}")


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "needle"),
    [
        ("post", API, {"json": {"provider": "nope"}}, 400, "unknown provider 'nope'"),
        ("post", API, {"json": {"resource_limits": {"memory": "lots"}}}, 400, "resource_limits.memory"),
        ("get", f"{API}/no-such-workspace", {}, 404, "no-such-workspace"),
        ("post", f"{API}/no-such-workspace/exec", {"json": {"command": "true"}}, 404, "does not exist"),
        ("post", API, {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400, "JSON"),
    ],
)
def test_bad_input_gets_a_named_4xx_and_the_server_keeps_serving(
    server: Server, method: str, path: str, kwargs: dict[str, object], status: int, needle: str
) -> None:
    """Bad input is answered with a JSON error naming the problem; the next request still works."""
    resp = getattr(server.client, method)(path, **kwargs)
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["error"]["message"]
    assert server.client.get(API).status_code == 200
    assert server.process.poll() is None


@pytest.mark.parametrize(("path", "needle"), [("", "non-empty"), ("a\x00b", "NUL byte")])
def test_empty_and_nul_paths_are_refused(server: Server, path: str, needle: str) -> None:
    """File paths that are empty or hold a NUL byte get a 400 naming the problem."""
    wid = _create(server)["id"]
    resp = server.client.get(f"{API}/{wid}/files", params={"path": path})
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]
    server.client.delete(f"{API}/{wid}")


def test_auto_picks_gvisor_and_firecracker_says_why_not(server: Server) -> None:
    """On a host without usable KVM, the providers endpoint shows firecracker unhealthy with the reason, and auto
    selection picks gVisor."""
    providers = {p["name"]: p for p in server.client.get(f"{API}/providers").json()["providers"]}
    assert set(providers) == {"firecracker", "gvisor", "docker"}
    firecracker = providers["firecracker"]
    if firecracker["status"] == "healthy":
        pytest.skip("this host can run Firecracker")
    assert firecracker["error"].startswith("KVM not available: ")
    assert firecracker["last_check"] is not None
    assert providers["gvisor"]["status"] == "healthy"
    assert providers["gvisor"]["capabilities"]["isolation"] == "gvisor"
    assert "memory_bytes" in providers["gvisor"]["available_resources"]
    ws = _create(server)
    assert ws["provider"] == "gvisor"
    assert ws["provider_attempts"] == []  # firecracker was skipped, never tried: one warning line says so
    assert [w for w in ws["warnings"] if "firecracker" in w] == [  # type: ignore[union-attr]
        "skipped firecracker (unhealthy); reasons at GET /api/v1/agent/workspaces/providers"
    ]
    server.client.delete(f"{API}/{ws['id']}")
