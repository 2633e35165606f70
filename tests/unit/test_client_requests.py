"""What the SDK sends for each call (methods, paths, bodies, query strings, headers) and how it reads the answers,
checked against an in-memory transport; plus where the URL and token come from."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.client import AsyncCorral, Corral, FileInfo

pytestmark = pytest.mark.unit

WORKSPACE = {
    "id": "w1", "status": "ready", "provider": "gvisor", "requested_provider": "auto",
    "container_type": "agent_workspace", "resource_limits": {"cpu": "2", "memory": "4G", "disk": "10G"},
    "network": "isolated", "base_image": "corral/workspace:base", "metadata": {}, "warnings": [],
    "from_warm_pool": False, "provider_attempts": [{"provider": "firecracker", "error": "no KVM"}], "error": None,
    "created_at": "2025-01-02T03:04:05Z",
}  # fmt: skip


class Recorder:
    """An httpx handler that records requests and answers from a route table."""

    def __init__(self, routes: dict[tuple[str, str], Callable[[httpx.Request], httpx.Response]]) -> None:
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.routes[(request.method, request.url.path)](request)

    def body(self, index: int = -1) -> Any:
        return json.loads(self.requests[index].content)


def _json(data: Any, status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    return lambda _: httpx.Response(status, json=data)


EXEC_RESULT = {"exit_code": 3, "stdout": "hi\n", "stderr": "", "duration_ms": 4.2, "timed_out": False,
               "truncated": False}  # fmt: skip
WS = "/api/v1/agent/workspaces/w1"


def _client(recorder: Recorder) -> AsyncCorral:
    return AsyncCorral("http://corral.test/", "tok", transport=httpx.MockTransport(recorder))


async def test_exec_sends_a_shell_line_or_an_argv_list() -> None:
    """A string runs as a shell line with args appended; a list runs as argv; the timeout and env go along."""
    recorder = Recorder({("GET", WS): _json(WORKSPACE), ("POST", f"{WS}/exec"): _json(EXEC_RESULT)})
    async with _client(recorder) as client:
        ws = await client.workspaces.get("w1")
        result = await ws.exec("echo", args=["a b"], env={"X": "1"}, timeout_s=5)
        assert recorder.body() == {"command": "echo", "args": ["a b"], "env": {"X": "1"}, "timeout_s": 5}
        await ws.exec(["ls", "-la", "/workspace"])
        assert recorder.body() == {"command": "ls", "args": ["-la", "/workspace"], "mode": "argv"}
        await ws.exec("true")
        assert recorder.body() == {"command": "true"}, "server defaults are not repeated"
    assert (result.exit_code, result.stdout, result.ok) == (3, "hi\n", False)
    assert recorder.requests[0].headers["Authorization"] == "Bearer tok"
    assert str(recorder.requests[0].url) == "http://corral.test/api/v1/agent/workspaces/w1"


async def test_workspace_description_is_parsed() -> None:
    """The workspace JSON becomes a WorkspaceInfo: provider attempts, limits and creation time included."""
    recorder = Recorder({("POST", "/api/v1/agent/workspaces"): _json(WORKSPACE, 201)})
    async with _client(recorder) as client:
        ws = await client.workspaces.create(provider="gvisor", resource_limits={"cpu": "2"}, metadata={"k": "v"})
    assert recorder.body() == {"provider": "gvisor", "resource_limits": {"cpu": "2"}, "metadata": {"k": "v"}}
    assert (ws.id, ws.status, ws.info.provider, ws.info.created_at and ws.info.created_at.year) == (
        "w1", "ready", "gvisor", 2025,
    )  # fmt: skip
    assert ws.info.provider_attempts[0].error == "no KVM"
    assert ws.info.raw["base_image"] == "corral/workspace:base"


async def test_files_travel_as_raw_bytes_with_the_path_in_the_query() -> None:
    """write PUTs the raw bytes (text as UTF-8) with path and octal mode; read returns bytes; chmod spells an int
    in octal; delete, move, list, stat and glob hit their routes."""
    entry = {"path": "/workspace/a", "name": "a", "type": "file", "size": 3, "mode": "0755", "mtime": 1.5}
    recorder = Recorder({
        ("GET", WS): _json(WORKSPACE),
        ("PUT", f"{WS}/files"): _json({"path": "/workspace/a", "bytes_written": 3}),
        ("GET", f"{WS}/files"): lambda _: httpx.Response(200, content=b"\x00\x01\x02"),
        ("POST", f"{WS}/files/chmod"): lambda _: httpx.Response(204),
        ("POST", f"{WS}/files/move"): lambda _: httpx.Response(204),
        ("DELETE", f"{WS}/files"): lambda _: httpx.Response(204),
        ("GET", f"{WS}/files/list"): _json({"path": "/workspace", "entries": [entry]}),
        ("GET", f"{WS}/files/stat"): _json(entry),
        ("GET", f"{WS}/files/glob"): _json({"paths": ["/workspace/a"]}),
    })  # fmt: skip
    async with _client(recorder) as client:
        files = (await client.workspaces.get("w1")).files
        assert await files.write("dir/ü", "abc", mode=0o600) == 3
        put = recorder.requests[-1]
        assert put.content == b"abc" and put.url.params["path"] == "dir/ü" and put.url.params["mode"] == "0600"
        assert await files.read("a") == b"\x00\x01\x02"
        await files.chmod("a", 0o755)
        assert recorder.body() == {"path": "a", "mode": "0755"}
        await files.move("a", "b")
        assert recorder.body() == {"src": "a", "dst": "b"}
        await files.delete("d", recursive=True)
        assert dict(recorder.requests[-1].url.params) == {"path": "d", "recursive": "true"}
        assert await files.list() == [FileInfo("/workspace/a", "a", "file", 3, 0o755, 1.5)]
        assert "path" not in recorder.requests[-1].url.params, "the server's default directory applies"
        assert (await files.stat("a")).mode == 0o755
        assert await files.glob("**/*", path="src") == ["/workspace/a"]
        assert dict(recorder.requests[-1].url.params) == {"pattern": "**/*", "path": "src"}


async def test_tools_send_the_api_arguments_and_parse_the_results() -> None:
    """Each tool method posts the HTTP API's JSON arguments (omitting unset options) and returns a typed result."""
    results = {
        "bash": {"exit_code": 0, "stdout": "x", "stderr": "", "timed_out": False, "truncated": False},
        "read": {"content": "a\n", "total_lines": 9, "truncated": True},
        "write": {"bytes_written": 2},
        "edit": {"replacements": 2},
        "grep": {"matches": [{"path": "a.py", "line_number": 3, "line": "TODO"}], "truncated": False},
        "glob": {"paths": ["a.py"], "truncated": False},
        "git": {"exit_code": 0, "stdout": "abc first\n", "stderr": ""},
    }
    base = "/api/v1/agent/sessions/s1"
    routes = {("POST", f"{base}/tools/{name}"): _json(result) for name, result in results.items()}
    routes[("GET", base)] = _json({"id": "s1", "agent_type_id": "t", "status": "active", "workspace_id": "w1"})
    recorder = Recorder(routes)
    async with _client(recorder) as client:
        tools = (await client.sessions.get("s1")).tools
        assert (await tools.bash("ls", timeout_s=30)).stdout == "x"
        assert recorder.body() == {"command": "ls", "timeout_s": 30}
        assert (await tools.read("a", offset=2)).total_lines == 9
        assert recorder.body() == {"path": "a", "offset": 2}
        assert await tools.write("a", "hi") == 2
        assert await tools.edit("a", "x", "y", replace_all=True) == 2
        assert recorder.body() == {"path": "a", "old_string": "x", "new_string": "y", "replace_all": True}
        grep = await tools.grep("TODO", include="*.py")
        assert recorder.body() == {"pattern": "TODO", "include": "*.py"}
        assert (grep.matches[0].path, grep.matches[0].line_number) == ("a.py", 3)
        assert (await tools.glob("*.py")).paths == ("a.py",)
        assert (await tools.git("log", "--oneline", "-1")).stdout == "abc first\n"
        assert recorder.body() == {"args": ["log", "--oneline", "-1"]}
        assert await tools.call("write", {"path": "b", "content": ""}) == {"bytes_written": 2}


async def test_start_with_wait_polls_until_the_session_is_active() -> None:
    """``start(wait=True)`` polls GET until the status leaves provisioning, then returns the active session."""
    states = iter(["provisioning", "provisioning", "active"])

    def session(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": "s1", "agent_type_id": "t", "status": next(states),
                                         "warnings": ["setup failed"]})  # fmt: skip

    recorder = Recorder({("POST", "/api/v1/agent/sessions"): session, ("GET", "/api/v1/agent/sessions/s1"): session})
    async with _client(recorder) as client:
        started = await client.sessions.start("t", task_context={"branch": "main"}, wait=True)
    assert started.status == "active" and started.info.warnings == ("setup failed",)
    assert recorder.body(0) == {"agent_type_id": "t", "task": {"context": {"branch": "main"}}}
    assert [r.method for r in recorder.requests] == ["POST", "GET", "GET"]


async def test_wait_gives_up_at_its_deadline() -> None:
    """A session that stays provisioning makes ``wait`` raise TimeoutError naming it."""
    recorder = Recorder({("GET", "/api/v1/agent/sessions/s1"): _json({"id": "s1", "status": "provisioning"})})
    async with _client(recorder) as client:
        session = await client.sessions.get("s1")
        with pytest.raises(TimeoutError, match="session s1 is still provisioning"):
            await session.wait(timeout_s=0.05, poll_interval_s=0.01)


async def test_context_managers_destroy_and_end() -> None:
    """Leaving ``async with workspace`` destroys it and leaving ``async with session`` ends it."""
    ended = {"id": "s1", "status": "ended"}
    recorder = Recorder({
        ("POST", "/api/v1/agent/workspaces"): _json(WORKSPACE, 201),
        ("DELETE", WS): _json({**WORKSPACE, "status": "destroyed"}),
        ("GET", "/api/v1/agent/sessions/s1"): _json({"id": "s1", "status": "active"}),
        ("DELETE", "/api/v1/agent/sessions/s1"): _json(ended),
    })  # fmt: skip
    async with _client(recorder) as client:
        async with await client.workspaces.create() as ws:
            pass
        async with await client.sessions.get("s1") as session:
            pass
    assert ws.status == "destroyed" and session.status == "ended"
    assert [(r.method, r.url.path) for r in recorder.requests][-3:] == [
        ("DELETE", WS), ("GET", "/api/v1/agent/sessions/s1"), ("DELETE", "/api/v1/agent/sessions/s1"),
    ]  # fmt: skip


def test_sync_client_sends_the_same_requests() -> None:
    """The sync twin builds the very same requests as the async client."""
    recorder = Recorder({("GET", WS): _json(WORKSPACE), ("POST", f"{WS}/exec"): _json(EXEC_RESULT)})
    with Corral("http://corral.test", "tok", transport=httpx.MockTransport(recorder)) as client:
        assert client.workspaces.get("w1").exec(["ls", "-la"]).exit_code == 3
    assert recorder.body() == {"command": "ls", "args": ["-la"], "mode": "argv"}


def test_ids_are_quoted_into_the_path() -> None:
    """An id with a slash cannot reach another route: it is percent-encoded."""
    recorder = Recorder({("GET", "/api/v1/agent/workspaces/../pool"): _json(WORKSPACE)})  # the decoded path
    with Corral("http://corral.test", "tok", transport=httpx.MockTransport(recorder)) as client:
        client.workspaces.get("../pool")
    assert recorder.requests[0].url.raw_path == b"/api/v1/agent/workspaces/..%2Fpool"


def test_url_and_token_come_from_arguments_the_environment_or_the_token_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Arguments win over CORRAL_URL / CORRAL_API_TOKEN, which win over the defaults: 127.0.0.1:8000 and the
    api-token file a local ``corral serve`` writes into CORRAL_DATA_DIR."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"workspaces": []})

    def call(**kwargs: Any) -> httpx.Request:
        with Corral(transport=httpx.MockTransport(handler), **kwargs) as client:
            client.workspaces.list()
        return seen[-1]

    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_API_TOKEN", raising=False)
    monkeypatch.setenv("CORRAL_DATA_DIR", str(tmp_path))
    first = call()
    assert str(first.url).startswith("http://127.0.0.1:8000/") and "Authorization" not in first.headers
    (tmp_path / "api-token").write_text("from-file\n")
    assert call().headers["Authorization"] == "Bearer from-file"
    monkeypatch.setenv("CORRAL_URL", "http://env.test:9/")
    monkeypatch.setenv("CORRAL_API_TOKEN", "from-env")
    request = call()
    assert (request.url.host, request.headers["Authorization"]) == ("env.test", "Bearer from-env")
    request = call(base_url="http://arg.test", token="from-arg")
    assert (request.url.host, request.headers["Authorization"]) == ("arg.test", "Bearer from-arg")


SNAPSHOT = {
    "id": "s1", "name": "after-setup", "workspace_id": "w1", "provider": "gvisor", "kind": "memory",
    "status": "ready", "size_bytes": 1_048_576, "base_image": "corral/workspace:base",
    "container_type": "agent_workspace", "network": "isolated", "resource_limits": {"cpu": "2"}, "metadata": {},
    "error": None, "created_at": "2025-01-02T03:04:05Z",
}  # fmt: skip
SNAPSHOTS = "/api/v1/agent/snapshots"


async def test_pause_snapshot_and_fork_send_their_routes_and_parse_the_answers() -> None:
    """pause returns what was kept and refreshes the workspace from the same answer; snapshot posts only the
    name given and returns a Snapshot; fork posts the count and wraps each new workspace."""
    forks = [{**WORKSPACE, "id": "f1"}, {**WORKSPACE, "id": "f2"}]
    recorder = Recorder({
        ("GET", WS): _json(WORKSPACE),
        ("POST", f"{WS}/pause"): _json({**WORKSPACE, "status": "paused", "pause": "memory"}),
        ("POST", f"{WS}/snapshots"): _json(SNAPSHOT, 201),
        ("POST", f"{WS}/fork"): _json({"workspaces": forks}, 201),
    })  # fmt: skip
    async with _client(recorder) as client:
        ws = await client.workspaces.get("w1")
        assert await ws.pause() == "memory"
        assert ws.status == "paused", "the pause answer refreshed the workspace without another GET"
        assert recorder.requests[-1].content == b"", "pause takes no body"
        snapshot = await ws.snapshot("after-setup")
        assert recorder.body() == {"name": "after-setup"}
        await ws.snapshot()
        assert recorder.body() == {}, "no name: the server's default applies"
        copies = await ws.fork(2)
        assert recorder.body() == {"count": 2}
    assert (snapshot.id, snapshot.kind, snapshot.size_bytes, snapshot.workspace_id) == ("s1", "memory", 1 << 20, "w1")
    assert snapshot.created_at is not None and snapshot.created_at.year == 2025
    assert [(c.id, c.status, type(c).__name__) for c in copies] == [
        ("f1", "ready", "AsyncWorkspace"), ("f2", "ready", "AsyncWorkspace"),
    ]  # fmt: skip
    assert [r.method for r in recorder.requests] == ["GET", "POST", "POST", "POST", "POST"]


async def test_snapshots_resource_and_create_from_snapshot() -> None:
    """snapshots.list sends only the filters given, get and delete hit the snapshot's route (id quoted), and
    workspaces.create(from_snapshot=...) sends the id with nothing the snapshot fixes."""
    recorder = Recorder({
        ("GET", SNAPSHOTS): _json({"snapshots": [SNAPSHOT, {**SNAPSHOT, "id": "s0", "name": None}]}),
        ("GET", f"{SNAPSHOTS}/s1"): _json(SNAPSHOT),
        ("DELETE", f"{SNAPSHOTS}/a/b"): lambda _: httpx.Response(204),
        ("POST", "/api/v1/agent/workspaces"): _json({**WORKSPACE, "id": "w2"}, 201),
    })  # fmt: skip
    async with _client(recorder) as client:
        assert [s.id for s in await client.snapshots.list()] == ["s1", "s0"]
        assert dict(recorder.requests[-1].url.params) == {}
        await client.snapshots.list(workspace_id="w1", name="after-setup")
        assert dict(recorder.requests[-1].url.params) == {"workspace_id": "w1", "name": "after-setup"}
        assert (await client.snapshots.get("s1")).name == "after-setup"
        await client.snapshots.delete("a/b")
        assert recorder.requests[-1].url.raw_path == b"/api/v1/agent/snapshots/a%2Fb"
        restored = await client.workspaces.create(from_snapshot="s1", metadata={"k": "v"})
        assert recorder.body() == {"from_snapshot": "s1", "metadata": {"k": "v"}}
    assert restored.id == "w2"


def test_sync_twin_sends_the_same_stateful_requests() -> None:
    """The sync client's pause, snapshot, fork and snapshots calls build the same requests as the async ones."""
    recorder = Recorder({
        ("GET", WS): _json(WORKSPACE),
        ("POST", f"{WS}/pause"): _json({**WORKSPACE, "status": "stopped", "pause": "filesystem"}),
        ("POST", f"{WS}/snapshots"): _json(SNAPSHOT, 201),
        ("POST", f"{WS}/fork"): _json({"workspaces": [{**WORKSPACE, "id": "f1"}]}, 201),
        ("GET", SNAPSHOTS): _json({"snapshots": [SNAPSHOT]}),
        ("DELETE", f"{SNAPSHOTS}/s1"): lambda _: httpx.Response(204),
    })  # fmt: skip
    with Corral("http://corral.test", "tok", transport=httpx.MockTransport(recorder)) as client:
        ws = client.workspaces.get("w1")
        assert (ws.pause(), ws.status) == ("filesystem", "stopped")
        assert ws.snapshot(name="n").id == "s1" and recorder.body() == {"name": "n"}
        assert [f.id for f in ws.fork(1)] == ["f1"] and recorder.body() == {"count": 1}
        assert [s.id for s in client.snapshots.list(name="n")] == ["s1"]
        assert dict(recorder.requests[-1].url.params) == {"name": "n"}
        client.snapshots.delete("s1")
    assert [(r.method, r.url.path) for r in recorder.requests][-1] == ("DELETE", f"{SNAPSHOTS}/s1")
