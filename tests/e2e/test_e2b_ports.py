"""Preview URLs against a real Corral server on gVisor: the unmodified E2B SDK's ``get_host(port)`` names a host that
reaches a server inside a networked sandbox through Corral (host routing under ``CORRAL_SANDBOX_DOMAIN``), the same
proxy answers on Corral's path route, private sandboxes need their traffic access token, and bodies stream.

There is no DNS for the preview domain here, so requests go to the server's loopback address with the preview host
in the ``Host`` header, as a wildcard DNS name would send them.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect
from websockets.typing import Subprotocol

from tests.e2e.conftest import BASE_IMAGE, TOKEN, Server, start_server, stop_server
from tests.e2e.test_e2b_sdk import run_user_script

pytestmark = pytest.mark.e2e

DOMAIN = "corral.test"
MiB = 1024 * 1024

# A server for the sandbox: GET /N answers N bytes, POST answers how many bytes it read, both in 64 KiB pieces; GET
# /headers answers the request's headers as JSON.
BODY_SERVER = """
import http.server, json

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/headers":
            body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        size = int(self.path.strip("/"))
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        piece = b"x" * 65536
        while size > 0:
            self.wfile.write(piece[: min(size, len(piece))])
            size -= len(piece)

    def do_POST(self):
        left, seen = int(self.headers["Content-Length"]), 0
        while left > 0:
            data = self.rfile.read(min(left, 65536))
            if not data:
                break
            seen += len(data)
            left -= len(data)
        body = str(seen).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("0.0.0.0", 3000), Handler).serve_forever()
"""


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server on gVisor with the preview domain set; skips (a failure under CI) without Docker or the base image."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")
    env = {"CORRAL_PROVIDERS": "gvisor", "CORRAL_SANDBOX_DOMAIN": DOMAIN}
    server = start_server(tmp_path_factory.mktemp("corral-e2b-ports"), env)
    try:
        assert server.client.get("/e2b/v2/sandboxes", headers={"X-API-KEY": TOKEN}).status_code == 200
        yield server
    finally:
        stop_server(server)


def _sandbox(server: Server, tmp_path: Path, create_args: str, start: str) -> dict[str, Any]:
    """Create a sandbox with the SDK, start a server in it (background), and report its id, host and tokens."""
    return run_user_script(
        server,
        tmp_path,
        f"""
        import json
        from e2b import Sandbox

        sandbox = Sandbox.create({create_args})
        {start}
        print(json.dumps({{
            "id": sandbox.sandbox_id, "host": sandbox.get_host(3000), "closed_host": sandbox.get_host(3001),
            "domain": sandbox.sandbox_domain, "traffic_token": sandbox.traffic_access_token,
        }}))
        """,
    )


def _http_server(server: Server, tmp_path: Path, create_args: str = "") -> dict[str, Any]:
    start = (
        'sandbox.files.write("/tmp/site/hello.txt", "hello from port 3000")\n'
        '        sandbox.commands.run("python3 -m http.server 3000 --bind 0.0.0.0", background=True, cwd="/tmp/site")'
    )
    return _sandbox(server, tmp_path, create_args, start)


def _poll(client: httpx.Client, path: str, headers: dict[str, str], seconds: float = 60) -> httpx.Response:
    """GET until the server inside answers 200 (it starts in the background), or the deadline passes."""
    deadline = time.monotonic() + seconds
    while True:
        answer = client.get(path, headers=headers)
        if answer.status_code == 200 or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def _kill(server: Server, sandbox_id: str) -> None:
    server.client.delete(f"/e2b/sandboxes/{sandbox_id}", headers={"X-API-KEY": TOKEN})


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def test_get_host_reaches_a_server_in_the_sandbox(e2b_server: Server, tmp_path: Path) -> None:
    """get_host(3000) names {port}-{id}.{CORRAL_SANDBOX_DOMAIN} (from create's domain, without E2B_DOMAIN), which
    reaches python's http.server in the sandbox through Corral; the path route serves it too (bearer token needed);
    a closed port is 502, an unknown sandbox 404, a malformed preview host 400, and other hosts stay Corral's API."""
    sandbox = _http_server(e2b_server, tmp_path)
    try:
        assert sandbox["domain"] == DOMAIN
        assert sandbox["host"] == f"3000-{sandbox['id']}.{DOMAIN}"
        assert sandbox["traffic_token"] is None  # public by default, as on E2B
        with httpx.Client(base_url=e2b_server.url, timeout=30) as client:
            answer = _poll(client, "/hello.txt", {"Host": sandbox["host"]})
            assert answer.status_code == 200, answer.text
            assert answer.text == "hello from port 3000"

            listing = client.get("/?x=1", headers={"Host": sandbox["host"]})
            assert listing.status_code == 200
            assert "hello.txt" in listing.text  # the directory listing: the path and query reached the server

            path = f"/api/v1/agent/workspaces/{sandbox['id']}/ports/3000/hello.txt"
            routed = client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert routed.status_code == 200
            assert routed.text == "hello from port 3000"
            refused = client.get(path)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "unauthorized"

            closed = client.get("/", headers={"Host": sandbox["closed_host"]})
            assert closed.status_code == 502
            assert closed.json() == {
                "code": 502,
                "message": "The sandbox is running but port is not open",
                "sandboxId": sandbox["id"],
                "port": "3001",
            }
            closed_path = client.get(
                f"/api/v1/agent/workspaces/{sandbox['id']}/ports/3001/", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert closed_path.status_code == 502
            assert closed_path.json()["error"]["code"] == "port_closed"

            unknown = client.get("/", headers={"Host": f"3000-0123456789abcdef.{DOMAIN}"})
            assert unknown.status_code == 404
            assert unknown.json()["message"] == "The sandbox was not found"
            unknown_path = client.get(
                "/api/v1/agent/workspaces/0123456789abcdef/ports/3000/", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert unknown_path.status_code == 404
            assert unknown_path.json()["error"]["code"] == "workspace_not_found"

            malformed = client.get("/", headers={"Host": f"web.{DOMAIN}"})
            assert malformed.status_code == 400
            assert "{port}-{sandbox id}" in malformed.json()["message"]

            assert client.get("/healthz", headers={"Host": DOMAIN}).status_code == 200
    finally:
        _kill(e2b_server, sandbox["id"])
    with httpx.Client(base_url=e2b_server.url, timeout=30) as client:
        gone = client.get("/hello.txt", headers={"Host": sandbox["host"]})
        assert gone.status_code == 404  # a killed sandbox's host is not found


def test_private_sandbox_needs_its_traffic_access_token(e2b_server: Server, tmp_path: Path) -> None:
    """A sandbox created with network allow_public_traffic=False gets a traffic access token; its preview host
    refuses requests without the e2b-traffic-access-token header or with a wrong one (403, E2B's words) and serves
    them with it."""
    sandbox = _http_server(e2b_server, tmp_path, 'network={"allow_public_traffic": False}')
    try:
        token = sandbox["traffic_token"]
        assert isinstance(token, str) and token
        with httpx.Client(base_url=e2b_server.url, timeout=30) as client:
            allowed = _poll(client, "/hello.txt", {"Host": sandbox["host"], "e2b-traffic-access-token": token})
            assert allowed.status_code == 200
            assert allowed.text == "hello from port 3000"

            missing = client.get("/hello.txt", headers={"Host": sandbox["host"]})
            assert missing.status_code == 403
            assert missing.json()["message"] == (
                "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"
            )
            wrong = client.get("/hello.txt", headers={"Host": sandbox["host"], "e2b-traffic-access-token": "x" + token})
            assert wrong.status_code == 403
            assert "is invalid" in wrong.json()["message"]
    finally:
        _kill(e2b_server, sandbox["id"])


def test_large_bodies_stream_through_without_growing_the_server(e2b_server: Server, tmp_path: Path) -> None:
    """Headers reach the app (its own Authorization on the preview host, never Corral's token from the path route);
    128 MiB down and 128 MiB up through the preview host arrive whole, while the Corral server's peak memory grows
    by far less than either body: the proxy streams instead of buffering."""
    start = (
        f'sandbox.files.write("/tmp/bodies.py", {BODY_SERVER!r})\n'
        '        sandbox.commands.run("python3 /tmp/bodies.py", background=True)'
    )
    sandbox = _sandbox(e2b_server, tmp_path, "", start)
    size = 128 * MiB
    pid = e2b_server.process.pid
    try:
        with httpx.Client(base_url=e2b_server.url, timeout=120) as client:
            host = {"Host": sandbox["host"]}
            assert _poll(client, "/1", host).status_code == 200
            seen = client.get("/headers", headers={**host, "Authorization": "Bearer app-token"}).json()
            assert seen["host"] == sandbox["host"]  # the app sees the preview host it was asked by
            assert seen["authorization"] == "Bearer app-token"  # host routing leaves the app's own auth alone
            assert seen["x-forwarded-for"] == "127.0.0.1"
            by_path = client.get(
                f"/api/v1/agent/workspaces/{sandbox['id']}/ports/3000/headers",
                headers={"Authorization": f"Bearer {TOKEN}"},
            ).json()
            assert "authorization" not in by_path  # Corral's token never reaches the workspace

            rss_before = _status_kib(pid, "VmRSS") * 1024

            received = 0
            with client.stream("GET", f"/{size}", headers=host) as answer:
                assert answer.status_code == 200
                for chunk in answer.iter_raw():
                    received += len(chunk)
            assert received == size

            def upload() -> Iterator[bytes]:
                piece = b"y" * MiB
                for _ in range(size // MiB):
                    yield piece

            sent = client.post("/", content=upload(), headers={**host, "Content-Length": str(size)})
            assert sent.status_code == 200
            assert int(sent.text) == size

            peak = _status_kib(pid, "VmHWM") * 1024
            assert peak - rss_before < 48 * MiB, f"server peak grew by {(peak - rss_before) / MiB:.0f} MiB"
    finally:
        _kill(e2b_server, sandbox["id"])


# A WebSocket echo server from the standard library (the image has no WebSocket package): it answers each text or
# binary message with "echo:" before it, takes the first subprotocol offered, and answers pings and closes.
WS_SERVER = r"""
import base64, hashlib, socketserver, struct

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        self.rfile.readline()
        headers = {}
        while True:
            line = self.rfile.readline().decode().strip()
            if not line:
                break
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()).decode()
        protocol = headers.get("sec-websocket-protocol", "").split(",")[0].strip()
        extra = f"Sec-WebSocket-Protocol: {protocol}\r\n" if protocol else ""
        self.wfile.write(
            f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\n{extra}\r\n".encode()
        )
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, size = head[0] & 0x0F, head[1] & 0x7F
            if size == 126:
                size = struct.unpack(">H", self.rfile.read(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(size)))
            if opcode == 8:
                self.wfile.write(b"\x88" + bytes([len(data[:2])]) + data[:2])
                return
            if opcode == 9:
                opcode = 10
            elif opcode in (1, 2):
                data = b"echo:" + data
            if len(data) < 126:
                length = bytes([len(data)])
            elif len(data) < 65536:
                length = bytes([126]) + struct.pack(">H", len(data))
            else:
                length = bytes([127]) + struct.pack(">Q", len(data))
            self.wfile.write(bytes([0x80 | opcode]) + length + data)

socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", 3000), Handler).serve_forever()
"""


def _ws(server: Server, host: str, path: str, **kwargs: Any) -> ClientConnection:
    """A WebSocket to ``path`` on the server, sent with ``host`` as its Host (the URI names it; the socket goes to
    the server's loopback address)."""
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return ws_connect(f"ws://{host}:{port}{path}", sock=sock, open_timeout=30, proxy=None, **kwargs)


def test_websocket_through_the_preview_host_and_the_path_route(e2b_server: Server, tmp_path: Path) -> None:
    """A WebSocket to get_host(3000) reaches an echo server in the sandbox: text and binary messages both ways, the
    subprotocol negotiated by the server inside; the path route relays it too with the bearer token, and refuses
    it without (403), as it refuses a closed port."""
    start = (
        f'sandbox.files.write("/tmp/ws.py", {WS_SERVER!r})\n'
        '        sandbox.commands.run("python3 /tmp/ws.py", background=True)'
    )
    sandbox = _sandbox(e2b_server, tmp_path, "", start)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                ws = _ws(e2b_server, sandbox["host"], "/chat", subprotocols=[Subprotocol("chat")])
                break
            except (InvalidStatus, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with ws:
            assert ws.subprotocol == "chat"
            ws.send("hello")
            assert ws.recv(timeout=30) == "echo:hello"
            ws.send(b"\x00\x01\xff")
            assert ws.recv(timeout=30) == b"echo:\x00\x01\xff"
            ws.send("x" * 200_000)
            assert ws.recv(timeout=30) == "echo:" + "x" * 200_000

        path = f"/api/v1/agent/workspaces/{sandbox['id']}/ports/3000/chat"
        with _ws(e2b_server, "127.0.0.1", path, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            ws.send("by path")
            assert ws.recv(timeout=30) == "echo:by path"
        with pytest.raises(InvalidStatus) as refused:
            _ws(e2b_server, "127.0.0.1", path)
        assert refused.value.response.status_code == 403
        with pytest.raises(InvalidStatus) as closed:
            _ws(e2b_server, sandbox["closed_host"], "/")
        assert closed.value.response.status_code == 403
    finally:
        _kill(e2b_server, sandbox["id"])


def test_an_isolated_sandbox_is_reached_through_its_agent(e2b_server: Server, tmp_path: Path) -> None:
    """A sandbox without network (allow_internet_access=False) has no address, yet its preview host and the path
    route reach servers on its loopback through the guest agent's tunnel: headers arrive, 64 MiB stream down and up
    whole while the Corral server's peak memory grows by far less, a WebSocket echoes both ways, and a port nothing
    listens on answers 502 in E2B's words."""
    start = (
        f'sandbox.files.write("/tmp/bodies.py", {BODY_SERVER!r})\n'
        f'        sandbox.files.write("/tmp/ws.py", {WS_SERVER.replace("3000", "3002")!r})\n'
        '        sandbox.commands.run("python3 /tmp/bodies.py", background=True)\n'
        '        sandbox.commands.run("python3 /tmp/ws.py", background=True)'
    )
    sandbox = _sandbox(e2b_server, tmp_path, "allow_internet_access=False", start)
    size = 64 * MiB
    pid = e2b_server.process.pid
    try:
        assert e2b_server.client.get(f"/api/v1/agent/workspaces/{sandbox['id']}").json()["network"] == "isolated"
        with httpx.Client(base_url=e2b_server.url, timeout=120) as client:
            host = {"Host": sandbox["host"]}
            assert _poll(client, "/1", host).status_code == 200
            seen = client.get("/headers", headers={**host, "Authorization": "Bearer app-token"}).json()
            assert seen["host"] == sandbox["host"]
            assert seen["authorization"] == "Bearer app-token"
            by_path = client.get(
                f"/api/v1/agent/workspaces/{sandbox['id']}/ports/3000/5", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert by_path.status_code == 200
            assert by_path.content == b"xxxxx"

            closed = client.get("/", headers={"Host": sandbox["closed_host"]})
            assert closed.status_code == 502
            assert closed.json() == {
                "code": 502,
                "message": "The sandbox is running but port is not open",
                "sandboxId": sandbox["id"],
                "port": "3001",
            }
            closed_path = client.get(
                f"/api/v1/agent/workspaces/{sandbox['id']}/ports/3001/", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert closed_path.status_code == 502
            assert closed_path.json()["error"]["code"] == "port_closed"

            rss_before = _status_kib(pid, "VmRSS") * 1024
            received = 0
            with client.stream("GET", f"/{size}", headers=host) as answer:
                assert answer.status_code == 200
                for chunk in answer.iter_raw():
                    assert chunk.count(b"x") == len(chunk)
                    received += len(chunk)
            assert received == size

            def upload() -> Iterator[bytes]:
                piece = b"y" * MiB
                for _ in range(size // MiB):
                    yield piece

            sent = client.post("/", content=upload(), headers={**host, "Content-Length": str(size)})
            assert sent.status_code == 200
            assert int(sent.text) == size
            peak = _status_kib(pid, "VmHWM") * 1024
            assert peak - rss_before < 32 * MiB, f"server peak grew by {(peak - rss_before) / MiB:.0f} MiB"

        ws_host = sandbox["host"].replace("3000-", "3002-", 1)
        deadline = time.monotonic() + 60
        while True:
            try:
                ws = _ws(e2b_server, ws_host, "/chat", subprotocols=[Subprotocol("chat")])
                break
            except (InvalidStatus, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with ws:
            assert ws.subprotocol == "chat"
            ws.send("hello")
            assert ws.recv(timeout=30) == "echo:hello"
            ws.send(b"\x00\x01\xff")
            assert ws.recv(timeout=30) == b"echo:\x00\x01\xff"
            ws.send("x" * 200_000)
            assert ws.recv(timeout=30) == "echo:" + "x" * 200_000
        path = f"/api/v1/agent/workspaces/{sandbox['id']}/ports/3002/chat"
        with _ws(e2b_server, "127.0.0.1", path, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            ws.send("by path")
            assert ws.recv(timeout=30) == "echo:by path"
        with pytest.raises(InvalidStatus) as closed_ws:
            _ws(e2b_server, sandbox["closed_host"], "/")
        assert closed_ws.value.response.status_code == 403
    finally:
        _kill(e2b_server, sandbox["id"])


def test_a_request_target_that_is_not_a_path_is_refused(e2b_server: Server, tmp_path: Path) -> None:
    """``GET @127.0.0.1:PORT/x`` (or an absolute URL) with a preview Host is refused with 400: the target must not
    become the authority of the upstream URL and reach a service on the server's own loopback."""
    sandbox = _http_server(e2b_server, tmp_path)
    seen: list[bytes] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        host, server_port = e2b_server.url.removeprefix("http://").split(":")
        try:
            for target in (f"@127.0.0.1:{port}/x", f"http://127.0.0.1:{port}/x"):
                with socket.create_connection((host, int(server_port)), timeout=10) as client:
                    request = f"GET {target} HTTP/1.1\r\nHost: {sandbox['host']}\r\nConnection: close\r\n\r\n"
                    client.sendall(request.encode())
                    answer = b""
                    while chunk := client.recv(4096):
                        answer += chunk
                assert answer.startswith(b"HTTP/1.1 400"), answer
                assert b"must be a path" in answer, answer
                with contextlib.suppress(TimeoutError):
                    seen.append(listener.accept()[0].recv(100))
        finally:
            _kill(e2b_server, sandbox["id"])
    assert seen == [], f"the proxy reached the server's loopback: {seen}"
