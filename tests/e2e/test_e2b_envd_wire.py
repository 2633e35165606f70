"""envd's wire protocol as Corral serves it, spoken by hand (no SDK): Connect framing, codes, auth and SIGTERM.

These pin the bytes the E2B SDK depends on, so a regression shows here with the exact frame rather than as an SDK
exception, and they cover what the SDK has no public call for (SIGTERM).
"""

from __future__ import annotations

import base64
import gzip
import json
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import TOKEN, Server, serving_e2b

pytestmark = pytest.mark.e2e

_PREFIX = struct.Struct(">BI")


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One Corral server on gVisor for the module; skips (a failure under CI) without Docker or the base image."""
    with serving_e2b(tmp_path_factory, "corral-e2b-wire") as server:
        yield server


@pytest.fixture
def sandbox(e2b_server: Server) -> Iterator[dict[str, Any]]:
    """A sandbox created through the control plane (isolated network), killed after the test."""
    created = e2b_server.client.post(
        "/e2b/v2/sandboxes",
        headers={"X-API-KEY": TOKEN},
        json={"templateID": "base", "allow_internet_access": False, "timeout": 300},
    )
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    yield body
    e2b_server.client.delete(f"/e2b/sandboxes/{body['sandboxID']}", headers={"X-API-KEY": TOKEN})


def _headers(sandbox: dict[str, Any], *, stream: bool) -> dict[str, str]:
    return {
        "Content-Type": "application/connect+json" if stream else "application/json",
        "Connect-Protocol-Version": "1",
        "E2b-Sandbox-Id": sandbox["sandboxID"],
        "X-Access-Token": sandbox["envdAccessToken"],
    }


def _frame(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return _PREFIX.pack(0, len(data)) + data


class _Frames:
    """Reads enveloped messages from a streaming response as they arrive."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.iter_raw()
        self._buffer = b""

    def next(self) -> tuple[int, dict[str, Any]]:
        while (
            len(self._buffer) < _PREFIX.size or len(self._buffer) < _PREFIX.size + _PREFIX.unpack_from(self._buffer)[1]
        ):
            self._buffer += next(self._chunks)
        flags, length = _PREFIX.unpack_from(self._buffer)
        data, self._buffer = self._buffer[_PREFIX.size : _PREFIX.size + length], self._buffer[_PREFIX.size + length :]
        return flags, json.loads(data)

    def _complete(self) -> bool:
        if len(self._buffer) < _PREFIX.size:
            return False
        length: int = _PREFIX.unpack_from(self._buffer)[1]
        return len(self._buffer) >= _PREFIX.size + length

    def until_end(self) -> list[tuple[int, dict[str, Any]]]:
        frames = [self.next()]
        while not frames[-1][0] & 0x02:
            frames.append(self.next())
        return frames


def _start(server: Server, sandbox: dict[str, Any], script: str) -> httpx.Response:
    request = server.client.build_request(
        "POST",
        "/e2b/envd/process.Process/Start",
        headers=_headers(sandbox, stream=True),
        content=_frame({"process": {"cmd": "/bin/sh", "args": ["-c", script]}}),
    )
    return server.client.send(request, stream=True)


def _unary(server: Server, sandbox: dict[str, Any], method: str, message: dict[str, Any]) -> httpx.Response:
    return server.client.post(f"/e2b/envd/{method}", headers=_headers(sandbox, stream=False), json=message)


def test_start_streams_enveloped_events(e2b_server: Server, sandbox: dict[str, Any]) -> None:
    """Start answers application/connect+json: a start event with the pid, base64 output, the end event with the
    exit code, then an end-of-stream envelope (flag 0x02) with an empty object."""
    response = _start(e2b_server, sandbox, "printf out; printf err >&2; exit 4")
    try:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/connect+json"
        frames = _Frames(response).until_end()
    finally:
        response.close()
    assert frames[0][0] == 0
    assert set(frames[0][1]["event"]) == {"start"}
    assert isinstance(frames[0][1]["event"]["start"]["pid"], int)
    data = [f[1]["event"]["data"] for f in frames if "data" in f[1].get("event", {})]
    assert b"".join(base64.b64decode(d["stdout"]) for d in data if "stdout" in d) == b"out"
    assert b"".join(base64.b64decode(d["stderr"]) for d in data if "stderr" in d) == b"err"
    assert frames[-2][1] == {"event": {"end": {"exitCode": 4, "exited": True, "status": "exit status 4"}}}
    assert frames[-1] == (0x02, {})


def test_sigterm_reaches_the_command_and_its_children(e2b_server: Server, sandbox: dict[str, Any]) -> None:
    """SendSignal SIGTERM ends a running command and the children it started, and its stream reports
    "signal: terminated" as envd does."""
    response = _start(e2b_server, sandbox, "sleep 31 & sleep 32 & echo ready; wait")
    try:
        frames = _Frames(response)
        pid = frames.next()[1]["event"]["start"]["pid"]
        ready = frames.next()[1]["event"]["data"]["stdout"]
        assert base64.b64decode(ready) == b"ready\n", "the children run before the signal is sent"
        listed = _unary(e2b_server, sandbox, "process.Process/List", {}).json()
        assert pid in [p["pid"] for p in listed["processes"]]
        signal = {"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"}
        answer = _unary(e2b_server, sandbox, "process.Process/SendSignal", signal)
        assert (answer.status_code, answer.json()) == (200, {})
        rest = frames.until_end()
    finally:
        response.close()
    assert rest[-2][1] == {"event": {"end": {"exitCode": -1, "exited": False, "status": "signal: terminated"}}}
    listing = _start(e2b_server, sandbox, "cat /proc/[0-9]*/cmdline")
    try:
        output = b"".join(
            base64.b64decode(f[1]["event"]["data"].get("stdout", ""))
            for f in _Frames(listing).until_end()
            if "data" in f[1].get("event", {})
        )
    finally:
        listing.close()
    assert b"sleep\x0031" not in output
    assert b"sleep\x0032" not in output


def test_unary_errors_carry_connect_codes(e2b_server: Server, sandbox: dict[str, Any]) -> None:
    """Unary failures answer the protocol's status with {"code", "message"}: not_found, invalid_argument,
    already_exists and unimplemented."""
    missing = _unary(e2b_server, sandbox, "filesystem.Filesystem/Stat", {"path": "/home/user/missing"})
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    made = _unary(e2b_server, sandbox, "filesystem.Filesystem/MakeDir", {"path": "dir"})
    assert made.status_code == 200
    assert made.json()["entry"]["path"] == "/home/user/dir"
    assert made.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    again = _unary(e2b_server, sandbox, "filesystem.Filesystem/MakeDir", {"path": "/home/user/dir"})
    assert (again.status_code, again.json()["code"]) == (409, "already_exists")
    not_dir = _unary(e2b_server, sandbox, "filesystem.Filesystem/ListDir", {"path": "/etc/hostname", "depth": 1})
    assert (not_dir.status_code, not_dir.json()["code"]) == (400, "invalid_argument")
    unknown = _unary(e2b_server, sandbox, "process.Process/SendInput", {"process": {"pid": 1}, "input": {"stdin": ""}})
    assert (unknown.status_code, unknown.json()["code"]) == (404, "not_found")
    gone = _unary(e2b_server, sandbox, "filesystem.Filesystem/GetWatcherEvents", {"watcherId": "w-none"})
    assert (gone.status_code, gone.json()["code"]) == (404, "not_found")
    on_file = _unary(e2b_server, sandbox, "filesystem.Filesystem/CreateWatcher", {"path": "/etc/hostname"})
    assert (on_file.status_code, on_file.json()["code"]) == (400, "invalid_argument")
    unknown_rpc = _unary(e2b_server, sandbox, "filesystem.Filesystem/Nope", {})
    assert (unknown_rpc.status_code, unknown_rpc.json()["code"]) == (501, "unimplemented")


def test_authentication_and_unknown_sandboxes(e2b_server: Server, sandbox: dict[str, Any]) -> None:
    """The control plane wants X-API-KEY; envd wants the sandbox's access token (or the API key), and answers 502
    "was not found" for a sandbox that does not exist, as E2B's proxy does."""
    client = e2b_server.client
    refused = client.get("/e2b/v2/sandboxes", headers={"Authorization": ""})
    assert (refused.status_code, refused.json()["code"]) == (401, 401)
    assert client.get("/e2b/v2/sandboxes", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    health = {"E2b-Sandbox-Id": sandbox["sandboxID"]}
    assert client.get("/e2b/envd/health", headers={**health, "Authorization": ""}).status_code == 401
    assert client.get("/e2b/envd/health", headers={**health, "X-Access-Token": "wrong"}).status_code == 401
    assert (
        client.get("/e2b/envd/health", headers={**health, "X-Access-Token": sandbox["envdAccessToken"]}).status_code
        == 204
    )
    assert client.get("/e2b/envd/health", headers={**health, "X-API-KEY": TOKEN}).status_code == 204
    other = client.get("/e2b/envd/health", headers={"E2b-Sandbox-Id": "no-such-sandbox", "X-API-KEY": TOKEN})
    assert other.status_code == 502
    assert "was not found" in other.json()["message"]
    gone = client.get("/e2b/sandboxes/no-such-sandbox", headers={"X-API-KEY": TOKEN})
    assert (gone.status_code, gone.json()["code"]) == (404, 404)


def _ran(server: Server, sandbox: dict[str, Any], script: str) -> None:
    response = _start(server, sandbox, script)
    try:
        end = _Frames(response).until_end()[-2][1]
    finally:
        response.close()
    assert end["event"]["end"]["exitCode"] == 0, end


def test_file_transfer_encodings_metadata_and_entries(e2b_server: Server, sandbox: dict[str, Any]) -> None:
    """On a gVisor workspace: a gzipped upload with X-Metadata-* headers answers envd's JSON with the metadata; a
    download asked for gzip comes gzipped on the wire (Content-Encoding, Vary); Stat and ListDir entries carry
    exactly envd's fields (owner and group names, Go's permissions) and a symlink its target's type and path."""
    client = e2b_server.client
    auth = {"E2b-Sandbox-Id": sandbox["sandboxID"], "X-Access-Token": sandbox["envdAccessToken"]}
    content = b"line of text\n" * 5000
    uploaded = client.post(
        "/e2b/envd/files",
        params={"path": "/home/user/w/data.txt"},
        headers={
            **auth,
            "Content-Type": "application/octet-stream",
            "Content-Encoding": "gzip",
            "X-Metadata-Purpose": "wire",
        },
        content=gzip.compress(content),
    )
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json() == [
        {"name": "data.txt", "type": "file", "path": "/home/user/w/data.txt", "metadata": {"purpose": "wire"}}
    ]
    request = client.build_request(
        "GET", "/e2b/envd/files", params={"path": "/home/user/w/data.txt"}, headers={**auth, "Accept-Encoding": "gzip"}
    )
    response = client.send(request, stream=True)
    try:
        on_the_wire = b"".join(response.iter_raw())
    finally:
        response.close()
    assert (response.status_code, response.headers["content-encoding"], response.headers["vary"]) == (
        200,
        "gzip",
        "Accept-Encoding",
    )
    assert len(on_the_wire) < len(content) // 10
    assert gzip.decompress(on_the_wire) == content
    _ran(e2b_server, sandbox, "ln -s /home/user/w/data.txt /home/user/w/link && chmod 600 /home/user/w/data.txt")
    entry = _unary(e2b_server, sandbox, "filesystem.Filesystem/Stat", {"path": "/home/user/w/data.txt"}).json()["entry"]
    assert set(entry) == {
        "name", "type", "path", "size", "mode", "permissions", "owner", "group", "modifiedTime", "metadata"
    }  # fmt: skip
    assert (entry["size"], entry["mode"], entry["permissions"]) == (str(len(content)), 0o600, "-rw-------")
    assert (entry["owner"], entry["group"], entry["metadata"]) == ("user", "user", {"purpose": "wire"})
    link = _unary(e2b_server, sandbox, "filesystem.Filesystem/Stat", {"path": "/home/user/w/link"}).json()["entry"]
    assert (link["type"], link["symlinkTarget"], link["permissions"]) == (
        "FILE_TYPE_FILE",
        "/home/user/w/data.txt",
        "Lrwxrwxrwx",
    )
    assert "isSymlink" not in link
    listed = _unary(e2b_server, sandbox, "filesystem.Filesystem/ListDir", {"path": "/home/user/w"}).json()["entries"]
    assert [(e["name"], e["type"], e["owner"], e["metadata"]) for e in listed] == [
        ("data.txt", "FILE_TYPE_FILE", "user", {"purpose": "wire"}),
        ("link", "FILE_TYPE_FILE", "user", {"purpose": "wire"}),
    ]
