"""The E2B-compatible API over the fake provider, in process: control plane, envd files and RPCs, timeouts, commands."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b.sandbox.signature import get_signature
from fastapi import FastAPI
from starlette.routing import NoMatchFound

from corral.api.app import create_app
from corral.api.e2b import E2BState, mount_e2b
from corral.api.e2b._connect import ConnectError
from corral.api.e2b._processes import ProcessRegistry, stream_events
from corral.api.e2b._state import SandboxExtras
from corral.providers.base import WorkspaceSpec
from corral.providers.fake import FakeProvider
from corral.settings import Settings

pytestmark = pytest.mark.unit

TOKEN = "unit-test-token"
_PREFIX = struct.Struct(">BI")


def _mounted(app: FastAPI) -> FastAPI:
    try:
        app.url_path_for("e2b_list_v2")
    except NoMatchFound:
        mount_e2b(app)  # until create_app mounts it itself
    return app


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    """The app over a fake ``gvisor`` provider, with its lifespan running."""
    settings = Settings(data_dir=tmp_path, api_token=TOKEN, providers="gvisor", warm_pool_size=0)
    application = _mounted(create_app(settings, providers={"gvisor": FakeProvider("gvisor")}))
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client carrying the API key, as the SDK sends it."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://corral", headers={"X-API-KEY": TOKEN}) as http:
        yield http


async def _create(client: httpx.AsyncClient, **body: object) -> dict[str, Any]:
    answer = await client.post("/e2b/v2/sandboxes", json={"templateID": "base", **body})
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


def _envd(sandbox: dict[str, Any], **extra: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox["sandboxID"], "X-Access-Token": sandbox["envdAccessToken"], **extra}


def _frames(body: bytes) -> list[tuple[int, dict[str, Any]]]:
    frames = []
    while body:
        flags, length = _PREFIX.unpack_from(body)
        frames.append((flags, json.loads(body[_PREFIX.size : _PREFIX.size + length])))
        body = body[_PREFIX.size + length :]
    return frames


async def _run(client: httpx.AsyncClient, sandbox: dict[str, Any], script: str) -> list[tuple[int, dict[str, Any]]]:
    message = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", script]}}).encode()
    answer = await client.post(
        "/e2b/envd/process.Process/Start",
        headers=_envd(sandbox, **{"Content-Type": "application/connect+json"}),
        content=_PREFIX.pack(0, len(message)) + message,
    )
    assert answer.headers["content-type"] == "application/connect+json"
    return _frames(answer.content)


async def _rpc(client: httpx.AsyncClient, sandbox: dict[str, Any], method: str, **message: object) -> httpx.Response:
    return await client.post(f"/e2b/envd/{method}", headers=_envd(sandbox), json=message)


async def test_create_get_and_list_with_filters(client: httpx.AsyncClient) -> None:
    """Create answers the Sandbox shape with an access token; get and list show state, metadata and limits, and the
    list filters by metadata and state and paginates with x-next-token."""
    first = await _create(client, metadata={"team": "a"}, envVars={"X": "1"}, allow_internet_access=False)
    second = await _create(client, metadata={"team": "b"})
    assert set(first) >= {"sandboxID", "templateID", "clientID", "envdVersion", "envdAccessToken"}
    detail = (await client.get(f"/e2b/sandboxes/{first['sandboxID']}")).json()
    assert (detail["state"], detail["metadata"], detail["templateID"]) == ("running", {"team": "a"}, "base")
    assert (detail["cpuCount"], detail["memoryMB"], detail["allowInternetAccess"]) == (2, 4096, False)
    assert detail["envdAccessToken"] == first["envdAccessToken"]
    only_a = (await client.get("/e2b/v2/sandboxes", params={"metadata": "team=a"})).json()
    assert [s["sandboxID"] for s in only_a] == [first["sandboxID"]]
    page = await client.get("/e2b/v2/sandboxes", params={"limit": 1})
    assert len(page.json()) == 1
    assert page.headers["x-next-token"] == "1"
    rest = await client.get("/e2b/v2/sandboxes", params={"limit": 1, "nextToken": "1"})
    assert [s["sandboxID"] for s in rest.json()] == [second["sandboxID"]]
    assert "x-next-token" not in rest.headers
    await client.post(f"/e2b/sandboxes/{second['sandboxID']}/pause")
    paused = (await client.get("/e2b/v2/sandboxes", params={"state": "paused"})).json()
    assert [s["sandboxID"] for s in paused] == [second["sandboxID"]]
    running = (await client.get("/e2b/sandboxes")).json()
    assert [s["sandboxID"] for s in running] == [first["sandboxID"]]


async def test_pause_connect_resume_and_kill(client: httpx.AsyncClient) -> None:
    """Pause is 204 then 409; connect resumes (201) and then only answers (200); resume of a running sandbox is 409;
    kill is 204 then 404."""
    sandbox = await _create(client)
    sid = sandbox["sandboxID"]
    assert (await client.post(f"/e2b/sandboxes/{sid}/pause")).status_code == 204
    again = await client.post(f"/e2b/sandboxes/{sid}/pause")
    assert (again.status_code, again.json()["code"]) == (409, 409)
    assert (await client.post(f"/e2b/v2/sandboxes/{sid}/connect", json={"timeout": 60})).status_code == 201
    assert (await client.post(f"/e2b/v2/sandboxes/{sid}/connect", json={})).status_code == 200
    assert (await client.post(f"/e2b/sandboxes/{sid}/resume", json={})).status_code == 409
    assert (await client.delete(f"/e2b/sandboxes/{sid}")).status_code == 204
    gone = await client.delete(f"/e2b/sandboxes/{sid}")
    assert (gone.status_code, gone.json()["code"]) == (404, 404)


async def test_errors_have_e2b_shape(client: httpx.AsyncClient) -> None:
    """A missing API key, a bad body and unsupported options answer {"code": status, "message"}."""
    refused = await client.get("/e2b/v2/sandboxes", headers={"X-API-KEY": "wrong"})
    assert (refused.status_code, refused.json()["code"]) == (401, 401)
    for body in ({}, {"templateID": "base", "mcp": {"x": {}}}, {"templateID": "base", "metadata": {"k": 1}}):
        answer = await client.post("/e2b/v2/sandboxes", json=body)
        assert (answer.status_code, answer.json()["code"]) == (400, 400), body
        assert answer.json()["message"]


async def test_timeouts_kill_or_pause(app: FastAPI, client: httpx.AsyncClient) -> None:
    """The sweeper kills a sandbox past its timeout, or pauses it when created with autoPause."""
    killed = await _create(client)
    paused = await _create(client, autoPause=True)
    state: E2BState = app.state.e2b
    for sandbox in (killed, paused):
        record = await state.service.get(sandbox["sandboxID"])
        await state.save(record, replace(SandboxExtras.of(record), end_at=time.time() - 1))
    assert sorted(await state.sweep()) == sorted([killed["sandboxID"], paused["sandboxID"]])
    assert (await state.service.get(killed["sandboxID"])).status == "destroyed"
    assert (await state.service.get(paused["sandboxID"])).status == "stopped"


async def test_set_timeout_moves_the_deadline(app: FastAPI, client: httpx.AsyncClient) -> None:
    """set_timeout sets endAt that many seconds from now."""
    sandbox = await _create(client, timeout=3600)
    assert (await client.post(f"/e2b/sandboxes/{sandbox['sandboxID']}/timeout", json={"timeout": 5})).status_code == 204
    record = await app.state.e2b.service.get(sandbox["sandboxID"])
    end_at = SandboxExtras.of(record).end_at
    assert end_at is not None
    assert 0 < end_at - time.time() <= 5


async def test_start_streams_and_uses_sandbox_envs(client: httpx.AsyncClient) -> None:
    """Start answers enveloped events ending with the exit code; sandbox envs reach commands and request envs win."""
    sandbox = await _create(client, envVars={"FROM_SANDBOX": "s", "BOTH": "sandbox"})
    frames = await _run(client, sandbox, 'echo "$FROM_SANDBOX $BOTH"; exit 2')
    assert "start" in frames[0][1]["event"]
    assert base64.b64decode(frames[1][1]["event"]["data"]["stdout"]) == b"s sandbox\n"
    assert frames[-2][1]["event"]["end"]["exitCode"] == 2
    assert frames[-1] == (2, {})


async def test_files_roundtrip(client: httpx.AsyncClient) -> None:
    """Uploads (octet-stream, gzip and multipart with several files) and downloads of the same bytes."""
    sandbox = await _create(client)
    headers = _envd(sandbox)
    raw = await client.post("/e2b/envd/files", params={"path": "raw.bin"}, headers=headers, content=bytes(range(256)))
    assert raw.json() == [{"name": "raw.bin", "type": "file", "path": "/workspace/raw.bin"}]
    zipped = await client.post(
        "/e2b/envd/files",
        params={"path": "/workspace/z.txt"},
        headers={**headers, "Content-Encoding": "gzip"},
        content=gzip.compress(b"zipped"),
    )
    assert zipped.status_code == 200
    multi = await client.post(
        "/e2b/envd/files",
        headers=headers,
        files=[("file", ('/workspace/m/a "q".txt', b"A\r\n--not-a-boundary")), ("file", ("m/b.txt", b"B"))],
    )
    assert [f["path"] for f in multi.json()] == ['/workspace/m/a "q".txt', "/workspace/m/b.txt"]
    for path, content in [
        ("/workspace/raw.bin", bytes(range(256))),
        ("/workspace/z.txt", b"zipped"),
        ('/workspace/m/a "q".txt', b"A\r\n--not-a-boundary"),
        ("m/b.txt", b"B"),
    ]:
        answer = await client.get("/e2b/envd/files", params={"path": path}, headers=headers)
        assert (answer.status_code, answer.content) == (200, content), path
    missing = await client.get("/e2b/envd/files", params={"path": "nope"}, headers=headers)
    assert (missing.status_code, missing.json()["code"]) == (404, 404)


async def test_filesystem_rpcs(client: httpx.AsyncClient) -> None:
    """Stat, ListDir with depth, MakeDir (already_exists the second time), Move and Remove (missing is fine)."""
    sandbox = await _create(client)
    await client.post("/e2b/envd/files", params={"path": "d/e/f.txt"}, headers=_envd(sandbox), content=b"12345")
    stat = (await _rpc(client, sandbox, "filesystem.Filesystem/Stat", path="d/e/f.txt")).json()["entry"]
    assert (stat["name"], stat["type"], stat["size"], stat["permissions"]) == (
        "f.txt",
        "FILE_TYPE_FILE",
        "5",
        "-rw-r--r--",
    )
    assert stat["modifiedTime"].endswith("Z")
    shallow = (await _rpc(client, sandbox, "filesystem.Filesystem/ListDir", path="d", depth=1)).json()
    deep = (await _rpc(client, sandbox, "filesystem.Filesystem/ListDir", path="d", depth=2)).json()
    assert [e["path"] for e in shallow["entries"]] == ["/workspace/d/e"]
    assert [e["path"] for e in deep["entries"]] == ["/workspace/d/e", "/workspace/d/e/f.txt"]
    moved = await _rpc(client, sandbox, "filesystem.Filesystem/Move", source="d/e/f.txt", destination="x/g.txt")
    assert moved.json()["entry"]["path"] == "/workspace/x/g.txt"
    assert (await _rpc(client, sandbox, "filesystem.Filesystem/Remove", path="d")).json() == {}
    assert (await _rpc(client, sandbox, "filesystem.Filesystem/Remove", path="d")).status_code == 200
    gone = await _rpc(client, sandbox, "filesystem.Filesystem/Stat", path="d")
    assert (gone.status_code, gone.json()["code"]) == (404, "not_found")


async def test_paused_sandbox_answers_502_not_found(client: httpx.AsyncClient) -> None:
    """envd calls on a paused sandbox answer 502 "was not found", which the SDK reads as not running."""
    sandbox = await _create(client)
    await client.post(f"/e2b/sandboxes/{sandbox['sandboxID']}/pause")
    health = await client.get("/e2b/envd/health", headers=_envd(sandbox))
    stat = await _rpc(client, sandbox, "filesystem.Filesystem/Stat", path="/workspace")
    for answer in (health, stat):
        assert answer.status_code == 502
        assert "was not found" in answer.json()["message"]


async def test_sigkill_ends_a_running_command() -> None:
    """SIGKILL closes the command's stream and listeners get envd's killed end event; List forgets the command."""
    provider = FakeProvider()
    await provider.create(WorkspaceSpec(id="w1", image="fake"))
    registry = ProcessRegistry()
    process, subscriber = registry.start(
        "w1",
        provider,
        cmd="/bin/sh",
        args=["-c", "echo started; sleep 30"],
        envs={},
        base_env={},
        cwd=None,
        workdir="/workspace",
        tag="job",
        stdin=False,
        deadline_s=None,
    )
    events = stream_events(process, subscriber, keepalive_s=None, deadline_s=None)
    assert await anext(events) == {"start": {"pid": process.pid}}
    assert await anext(events) == {"data": {"stdout": base64.b64encode(b"started\n").decode()}}
    assert registry.find("w1", {"tag": "job"}) is process
    await registry.signal(process, provider, 9)
    assert await anext(events) == {"end": {"exitCode": -1, "exited": False, "status": "signal: killed"}}
    assert registry.running("w1") == []
    with pytest.raises(ConnectError) as caught:
        registry.find("w1", {"pid": process.pid})
    assert caught.value.code == "not_found"


async def test_signed_file_urls(client: httpx.AsyncClient) -> None:
    """A file URL signed with the sandbox's access token (as the SDK's download_url signs it) works without headers
    at /files, and an expired or forged signature is refused."""
    sandbox = await _create(client)
    await client.post("/e2b/envd/files", params={"path": "/workspace/s.txt"}, headers=_envd(sandbox), content=b"s")
    signed = get_signature("/workspace/s.txt", "read", None, sandbox["envdAccessToken"], 60)
    path = "/workspace/s.txt"
    params = {"path": path, "signature": signed["signature"], "signature_expiration": signed["expiration"]}
    anonymous = {"X-API-KEY": ""}
    answer = await client.get("/files", params=params, headers=anonymous)
    assert (answer.status_code, answer.content) == (200, b"s")
    expired = get_signature("/workspace/s.txt", "read", None, sandbox["envdAccessToken"], -10)
    late = {**params, "signature": expired["signature"], "signature_expiration": expired["expiration"]}
    assert (await client.get("/files", params=late, headers=anonymous)).status_code == 401
    forged = {**params, "signature": "v1_forged"}
    assert (await client.get("/files", params=forged, headers=anonymous)).status_code == 401
