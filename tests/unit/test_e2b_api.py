"""The E2B-compatible API over the fake provider, in process: control plane, envd files and RPCs, timeouts, commands."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import re
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
    settings = Settings(data_dir=tmp_path, api_token=TOKEN, providers="gvisor", warm_pool_size=0, e2b_warm_pool_size=0)
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


_OCTETS = {"Content-Type": "application/octet-stream"}


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
    list (newest first) filters by metadata and state and paginates with x-next-token."""
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
    assert [s["sandboxID"] for s in page.json()] == [second["sandboxID"]]
    token = page.headers["x-next-token"]
    rest = await client.get("/e2b/v2/sandboxes", params={"limit": 1, "nextToken": token})
    assert [s["sandboxID"] for s in rest.json()] == [first["sandboxID"]]
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
    """A sandbox's timer kills it at its timeout, or pauses it when created with autoPause."""
    killed = await _create(client)
    paused = await _create(client, autoPause=True)
    state: E2BState = app.state.e2b
    for sandbox in (killed, paused):
        record = await state.service.get(sandbox["sandboxID"])
        await state.save(record, replace(SandboxExtras.of(record), end_at=time.time() - 1))
    deadline = time.monotonic() + 10
    statuses: tuple[str, str] = ("", "")
    while time.monotonic() < deadline:
        statuses = (
            (await state.service.get(killed["sandboxID"])).status,
            (await state.service.get(paused["sandboxID"])).status,
        )
        if statuses == ("destroyed", "stopped"):
            break
        await asyncio.sleep(0.01)
    assert statuses == ("destroyed", "stopped")


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
    raw = await client.post(
        "/e2b/envd/files", params={"path": "raw.bin"}, headers={**headers, **_OCTETS}, content=bytes(range(256))
    )
    assert raw.json() == [{"name": "raw.bin", "type": "file", "path": "/home/user/raw.bin"}]
    zipped = await client.post(
        "/e2b/envd/files",
        params={"path": "/home/user/z.txt"},
        headers={**headers, **_OCTETS, "Content-Encoding": "gzip"},
        content=gzip.compress(b"zipped"),
    )
    assert zipped.status_code == 200
    multi = await client.post(
        "/e2b/envd/files",
        headers=headers,
        files=[("file", ('/home/user/m/a "q".txt', b"A\r\n--not-a-boundary")), ("file", ("m/b.txt", b"B"))],
    )
    assert [f["path"] for f in multi.json()] == ['/home/user/m/a "q".txt', "/home/user/m/b.txt"]
    for path, content in [
        ("/home/user/raw.bin", bytes(range(256))),
        ("/home/user/z.txt", b"zipped"),
        ('/home/user/m/a "q".txt', b"A\r\n--not-a-boundary"),
        ("m/b.txt", b"B"),
    ]:
        answer = await client.get("/e2b/envd/files", params={"path": path}, headers=headers)
        assert (answer.status_code, answer.content) == (200, content), path
    missing = await client.get("/e2b/envd/files", params={"path": "nope"}, headers=headers)
    assert (missing.status_code, missing.json()["code"]) == (404, 404)


async def test_filesystem_rpcs(client: httpx.AsyncClient) -> None:
    """Stat, ListDir with depth, MakeDir (already_exists the second time), Move and Remove (missing is fine)."""
    sandbox = await _create(client)
    await client.post(
        "/e2b/envd/files", params={"path": "d/e/f.txt"}, headers=_envd(sandbox, **_OCTETS), content=b"12345"
    )
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
    assert [e["path"] for e in shallow["entries"]] == ["/home/user/d/e"]
    assert [e["path"] for e in deep["entries"]] == ["/home/user/d/e", "/home/user/d/e/f.txt"]
    moved = await _rpc(client, sandbox, "filesystem.Filesystem/Move", source="d/e/f.txt", destination="x/g.txt")
    assert moved.json()["entry"]["path"] == "/home/user/x/g.txt"
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
    await client.post(
        "/e2b/envd/files", params={"path": "/workspace/s.txt"}, headers=_envd(sandbox, **_OCTETS), content=b"s"
    )
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


async def _shell(client: httpx.AsyncClient, sandbox: dict[str, Any], script: str) -> None:
    frames = await _run(client, sandbox, script)
    assert frames[-2][1]["event"]["end"]["exitCode"] == 0, frames


async def _upload(
    client: httpx.AsyncClient, sandbox: dict[str, Any], path: str, data: bytes, **headers: str
) -> httpx.Response:
    return await client.post(
        "/e2b/envd/files", params={"path": path}, headers=_envd(sandbox, **_OCTETS, **headers), content=data
    )


async def _entry(client: httpx.AsyncClient, sandbox: dict[str, Any], path: str) -> dict[str, Any]:
    answer = await _rpc(client, sandbox, "filesystem.Filesystem/Stat", path=path)
    assert answer.status_code == 200, answer.text
    entry: dict[str, Any] = answer.json()["entry"]
    return entry


async def test_entries_are_reported_as_envd_reports_them(app: FastAPI, client: httpx.AsyncClient) -> None:
    """Stat and ListDir give Go's permission string and the permission bits, leave default values out, and report a
    symlink with its target's type and bits and the resolved symlinkTarget (a dangling one: no type, its own path)."""
    sandbox = await _create(client)
    runtime = app.state.e2b.service.runtime
    await _upload(client, sandbox, "/home/user/d/empty.txt", b"")
    await _upload(client, sandbox, "/home/user/d/tool", b"#!/bin/sh\n")
    await runtime.chmod(sandbox["sandboxID"], "/home/user/d/tool", 0o4755)
    await _shell(client, sandbox, "cd /home/user/d && ln -s tool link && ln -s /home/user/d dirlink && ln -s gone dead")
    empty = await _entry(client, sandbox, "/home/user/d/empty.txt")
    assert "size" not in empty, "a zero size is left out, as protobuf JSON does"
    assert (empty["type"], empty["mode"], empty["permissions"]) == ("FILE_TYPE_FILE", 0o644, "-rw-r--r--")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3}|\.\d{6})?Z", empty["modifiedTime"])
    tool = await _entry(client, sandbox, "d/tool")
    assert (tool["mode"], tool["permissions"], tool["size"]) == (0o755, "urwxr-xr-x", "10")
    link = await _entry(client, sandbox, "/home/user/d/link")
    assert (link["type"], link["mode"], link["permissions"]) == ("FILE_TYPE_FILE", 0o755, "Lrwxrwxrwx")
    assert (link["symlinkTarget"], link["path"], link["name"]) == ("/home/user/d/tool", "/home/user/d/link", "link")
    assert "isSymlink" not in link, "isSymlink would make the SDK say SYMLINK where E2B says the target's type"
    dirlink = await _entry(client, sandbox, "/home/user/d/dirlink")
    assert (dirlink["type"], dirlink["symlinkTarget"]) == ("FILE_TYPE_DIRECTORY", "/home/user/d")
    dead = await _entry(client, sandbox, "/home/user/d/dead")
    assert ("type" in dead, "mode" in dead, dead["symlinkTarget"]) == (False, False, "/home/user/d/dead")
    listed = (await _rpc(client, sandbox, "filesystem.Filesystem/ListDir", path="/home/user/d/dirlink")).json()
    assert [(e["path"], e.get("type")) for e in listed["entries"]] == [
        ("/home/user/d/dead", None),
        ("/home/user/d/dirlink", "FILE_TYPE_DIRECTORY"),
        ("/home/user/d/empty.txt", "FILE_TYPE_FILE"),
        ("/home/user/d/link", "FILE_TYPE_FILE"),
        ("/home/user/d/tool", "FILE_TYPE_FILE"),
    ], "the symlinked directory is listed at its resolved path, and the symlink inside is not walked into"
    deep = (await _rpc(client, sandbox, "filesystem.Filesystem/ListDir", path="/home/user", depth=3)).json()
    assert "/home/user/d/dirlink/tool" not in [e["path"] for e in deep["entries"]]
    made = await _rpc(client, sandbox, "filesystem.Filesystem/MakeDir", path="/home/user/d")
    assert (made.status_code, made.json()["message"]) == (409, "directory already exists: /home/user/d")


async def test_file_metadata(app: FastAPI, client: httpx.AsyncClient) -> None:
    """X-Metadata-* headers set a file's metadata (keys lowercased): the upload answer, Stat, ListDir and a symlink
    show it, Move carries it (a file or a whole directory), an upload without it and Remove clear it, and invalid
    metadata is refused before anything is written."""
    sandbox = await _create(client)
    written = await _upload(client, sandbox, "/workspace/m/a.txt", b"a", **{"X-Metadata-Author": "mish"})
    assert written.json() == [
        {"name": "a.txt", "type": "file", "path": "/workspace/m/a.txt", "metadata": {"author": "mish"}}
    ]
    assert (await _entry(client, sandbox, "/workspace/m/a.txt"))["metadata"] == {"author": "mish"}
    await _shell(client, sandbox, "ln -s /workspace/m/a.txt /workspace/m/link")
    assert (await _entry(client, sandbox, "/workspace/m/link"))["metadata"] == {"author": "mish"}
    multi = await client.post(
        "/e2b/envd/files",
        headers=_envd(sandbox, **{"X-Metadata-Tag": "both"}),
        files=[("file", ("/workspace/m/b.txt", b"b")), ("file", ("/workspace/m/c.txt", b"c"))],
    )
    assert [f["metadata"] for f in multi.json()] == [{"tag": "both"}, {"tag": "both"}]
    listed = (await _rpc(client, sandbox, "filesystem.Filesystem/ListDir", path="/workspace/m")).json()["entries"]
    assert {e["name"]: e.get("metadata") for e in listed} == {
        "a.txt": {"author": "mish"},
        "b.txt": {"tag": "both"},
        "c.txt": {"tag": "both"},
        "link": {"author": "mish"},
    }
    moved = await _rpc(
        client, sandbox, "filesystem.Filesystem/Move", source="/workspace/m/a.txt", destination="/workspace/m/c.txt"
    )
    assert moved.json()["entry"]["metadata"] == {"author": "mish"}, "the moved file's metadata replaces the old file's"
    await _shell(client, sandbox, "touch /workspace/m/a.txt")
    assert "metadata" not in await _entry(client, sandbox, "/workspace/m/a.txt"), "the metadata left with the file"
    await _rpc(client, sandbox, "filesystem.Filesystem/Move", source="/workspace/m", destination="/workspace/n")
    assert (await _entry(client, sandbox, "/workspace/n/b.txt"))["metadata"] == {"tag": "both"}
    plain = await _upload(client, sandbox, "/workspace/n/b.txt", b"again")
    assert "metadata" not in plain.json()[0]
    assert "metadata" not in await _entry(client, sandbox, "/workspace/n/b.txt"), "an upload replaces the whole set"
    await _rpc(client, sandbox, "filesystem.Filesystem/Remove", path="/workspace/n")
    # Written as a command would write it, not through envd: only what Remove left behind could give it metadata.
    await app.state.e2b.service.runtime.write_file(sandbox["sandboxID"], "/workspace/n/c.txt", b"by a command")
    assert "metadata" not in await _entry(client, sandbox, "/workspace/n/c.txt"), "Remove dropped the metadata"
    await _shell(client, sandbox, "ln -s /workspace/n/c.txt /workspace/via")
    await _upload(client, sandbox, "/workspace/via", b"through the link", **{"X-Metadata-Via": "link"})
    assert (await _entry(client, sandbox, "/workspace/n/c.txt"))["metadata"] == {"via": "link"}, "the target has it"
    await _upload(client, sandbox, "/workspace/via", b"plain")
    assert "metadata" not in await _entry(client, sandbox, "/workspace/n/c.txt"), "and loses it through the link"
    for bad in ({"X-Metadata-Key": "tab\there"}, {"X-Metadata-" + "k" * 247: "v"}, {"X-Metadata-Big": "v" * 5000}):
        refused = await _upload(client, sandbox, "/workspace/refused.txt", b"x", **bad)
        assert (refused.status_code, refused.json()["code"]) == (400, 400), bad
        assert refused.json()["message"].startswith("invalid metadata: ")
    missing = await _rpc(client, sandbox, "filesystem.Filesystem/Stat", path="/workspace/refused.txt")
    assert missing.status_code == 404, "a refused upload writes nothing"


async def test_gzip_both_ways(client: httpx.AsyncClient) -> None:
    """Downloads come gzipped when Accept-Encoding prefers gzip (with Vary and the type Go gives the extension),
    plain otherwise, and 400 when nothing acceptable is left; gzipped uploads are inflated for octet-stream and
    multipart bodies, and an unknown Content-Encoding is refused."""
    sandbox = await _create(client)
    content = b'{"numbers": [' + b", ".join(str(i).encode() for i in range(2000)) + b"]}"
    zipped = await _upload(
        client, sandbox, "/home/user/data.json", gzip.compress(content), **{"Content-Encoding": "GZIP"}
    )
    assert zipped.status_code == 200, zipped.text
    multipart = httpx.Request("POST", "http://x", files=[("file", ("/home/user/part.txt", b"inside a part"))])
    inflated = await client.post(
        "/e2b/envd/files",
        headers=_envd(sandbox, **{"Content-Type": multipart.headers["content-type"], "Content-Encoding": "gzip"}),
        content=gzip.compress(multipart.read()),
    )
    assert [f["path"] for f in inflated.json()] == ["/home/user/part.txt"]
    for accept, encoding in [("gzip", "gzip"), ("identity, gzip", None), ("br;q=1, gzip;q=0.5", "gzip"), ("", None)]:
        answer = await client.get(
            "/e2b/envd/files",
            params={"path": "/home/user/data.json"},
            headers=_envd(sandbox, **{"Accept-Encoding": accept}),
        )
        assert (answer.status_code, answer.headers.get("content-encoding"), answer.content) == (200, encoding, content)
        assert (answer.headers["vary"], answer.headers["content-type"]) == ("Accept-Encoding", "application/json")
    request = client.build_request(
        "GET", "/e2b/envd/files", params={"path": "part.txt"}, headers=_envd(sandbox, **{"Accept-Encoding": "gzip"})
    )
    raw = await client.send(request, stream=True)
    try:
        on_the_wire = b"".join([chunk async for chunk in raw.aiter_raw()])
    finally:
        await raw.aclose()
    assert gzip.decompress(on_the_wire) == b"inside a part"
    refused = await client.get(
        "/e2b/envd/files",
        params={"path": "part.txt"},
        headers=_envd(sandbox, **{"Accept-Encoding": "br, identity;q=0"}),
    )
    assert (refused.status_code, refused.json()["code"]) == (400, 400)
    unknown = await _upload(client, sandbox, "/home/user/x.bin", b"x", **{"Content-Encoding": "br"})
    assert (unknown.status_code, unknown.json()["code"]) == (400, 400)
    assert "unsupported Content-Encoding: br" in unknown.json()["message"]


async def test_a_signed_url_acts_only_as_the_user_it_was_signed_for(client: httpx.AsyncClient) -> None:
    """A header added to a signed file URL cannot pick the user (and with it the home relative paths resolve in):
    the review's ``Authorization: Basic ../../etc:`` turned ``shadow`` into /etc/shadow. User names that are not
    names ('..', with '/', leading '-') are refused on every route."""
    sandbox = await _create(client)
    await _upload(client, sandbox, "/home/user/mine.txt", b"mine")
    await _upload(client, sandbox, "/etc/mine.txt", b"not yours")
    signed = get_signature("mine.txt", "read", None, sandbox["envdAccessToken"], 60)
    params = {"path": "mine.txt", "signature": signed["signature"], "signature_expiration": signed["expiration"]}
    escape = {"X-API-KEY": "", "Authorization": "Basic " + base64.b64encode(b"../../etc:").decode()}
    answer = await client.get("/files", params=params, headers=escape)
    assert (answer.status_code, answer.content) == (200, b"mine")
    for name in ("..", "../../etc", "-R", "a/b"):
        refused = await client.get(
            "/e2b/envd/files", params={"path": "mine.txt", "username": name}, headers=_envd(sandbox)
        )
        assert refused.status_code == 400, (name, refused.text)
        assert "username" in refused.json()["message"]
