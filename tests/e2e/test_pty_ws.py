"""The PTY WebSocket ``GET /api/v1/agent/workspaces/{id}/pty`` against a real server and a real gVisor workspace:
typing, resize, exit codes, errors and authentication (header and subprotocol)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from tests.e2e.conftest import TOKEN, Server, gvisor_workspace

pytestmark = pytest.mark.e2e

API = "/api/v1/agent/workspaces"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def workspace(server: Server) -> Iterator[str]:
    """One gVisor workspace for the module, destroyed at the end."""
    with gvisor_workspace(server) as workspace_id:
        yield workspace_id


def _url(server: Server, workspace_id: str, query: str = "") -> str:
    return f"{server.url.replace('http://', 'ws://')}{API}/{workspace_id}/pty{'?' + query if query else ''}"


def _token_protocol(token: str) -> Subprotocol:
    return Subprotocol("corral.token." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("="))


def _read_until(ws: ClientConnection, wanted: bytes, deadline_s: float = 30) -> bytes:
    """Terminal output until ``wanted`` shows up (with a deadline)."""
    seen = b""
    deadline = time.monotonic() + deadline_s
    while wanted not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"{wanted!r} did not show within {deadline_s} s; the terminal showed {seen[-2000:]!r}")
        message = ws.recv(timeout=remaining)
        assert isinstance(message, bytes), message
        seen += message
    return seen


def _final(ws: ClientConnection, deadline_s: float = 30) -> tuple[dict[str, Any], int | None]:
    """The first text frame after any output, and the close code that follows it."""
    deadline = time.monotonic() + deadline_s
    while True:
        message = ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
        if isinstance(message, str):
            break
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
    return json.loads(message), ws.close_code


def test_type_resize_and_exit_code(server: Server, workspace: str) -> None:
    """``echo hi`` typed into the login shell prints hi; a resize shows in ``stty size``; ``exit 3`` arrives as the
    exit frame, then close 1000."""
    with connect(_url(server, workspace, "rows=30&cols=100"), additional_headers=AUTH) as ws:
        ws.send(b"echo h''i\r")  # the quotes keep the echoed command line from matching
        _read_until(ws, b"hi\r\n")
        ws.send(b"stty size\r")
        _read_until(ws, b"30 100")
        ws.send(json.dumps({"type": "resize", "rows": 40, "cols": 120}))
        ws.send(json.dumps({"type": "input", "data": "stty size\r"}))
        _read_until(ws, b"40 120")
        ws.send(b"exit 3\r")
        assert _final(ws) == ({"type": "exit", "exit_code": 3}, 1000)


def test_command_query_runs_that_command(server: Server, workspace: str) -> None:
    """``command`` runs under ``bash -l -c`` in ``cwd`` and the exit frame carries its code."""
    with connect(_url(server, workspace, "command=pwd%3B+exit+7&cwd=/tmp"), additional_headers=AUTH) as ws:
        _read_until(ws, b"/tmp")
        assert _final(ws) == ({"type": "exit", "exit_code": 7}, 1000)


def test_subprotocol_token_is_accepted_and_corral_pty_selected(server: Server, workspace: str) -> None:
    """A browser-style client (token in the subprotocol list) is accepted; the server selects ``corral.pty``."""
    protocols = [Subprotocol("corral.pty"), _token_protocol(TOKEN)]
    with connect(_url(server, workspace, "command=echo+ok"), subprotocols=protocols) as ws:
        assert ws.subprotocol == "corral.pty"
        _read_until(ws, b"ok")
        assert _final(ws)[0] == {"type": "exit", "exit_code": 0}


@pytest.mark.parametrize(
    ("headers", "protocols"),
    [
        ({}, None),
        ({"Authorization": "Bearer wrong"}, None),
        ({}, [Subprotocol("corral.pty"), _token_protocol("wrong")]),
        ({}, [Subprotocol("corral.pty"), Subprotocol("corral.token.!!!")]),
    ],
    ids=["missing", "wrong-header", "wrong-subprotocol", "garbled-subprotocol"],
)
def test_missing_or_wrong_token_is_refused_before_the_upgrade(
    server: Server, workspace: str, headers: dict[str, str], protocols: list[Subprotocol] | None
) -> None:
    """Without the right token the upgrade is answered HTTP 401 in Corral's error shape, never accepted."""
    with pytest.raises(InvalidStatus) as refused:
        connect(_url(server, workspace), additional_headers=headers, subprotocols=protocols)
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body)["error"]["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("workspace_id", "query", "close_code", "error_code"),
    [
        ("nope", "", 4404, "workspace_not_found"),
        (None, "rows=0", 4400, "invalid_request"),
        (None, "cols=abc", 4400, "invalid_request"),
    ],
    ids=["unknown-workspace", "zero-rows", "bad-cols"],
)
def test_errors_are_an_error_frame_then_a_close_code(
    server: Server, workspace: str, workspace_id: str | None, query: str, close_code: int, error_code: str
) -> None:
    """An unknown workspace or a bad query is an error frame, then close 4404 or 4400."""
    with connect(_url(server, workspace_id or workspace, query), additional_headers=AUTH) as ws:
        frame, code = _final(ws)
    assert (frame["type"], frame["code"], code) == ("error", error_code, close_code)


def test_bad_control_message_and_oversized_input_close_the_terminal(server: Server, workspace: str) -> None:
    """A text frame that is not a control message closes with 4400; a message over 64 KiB with 1009."""
    with connect(_url(server, workspace), additional_headers=AUTH) as ws:
        ws.send("not json")
        frame, code = _final(ws)
    assert (frame["code"], code) == ("invalid_request", 4400)
    with connect(_url(server, workspace), additional_headers=AUTH) as ws:
        ws.send(b"x" * (64 * 1024 + 1))
        frame, code = _final(ws)
    assert (frame["code"], code) == ("payload_too_large", 1009)


def test_closing_the_socket_kills_the_command(server: Server, workspace: str) -> None:
    """A client that goes away ends the terminal's command: its marker process disappears."""
    marker = f"sleep 876{int(time.time()) % 1000}"
    with connect(
        _url(server, workspace, f"command=echo+go%3B+{marker.replace(' ', '+')}"), additional_headers=AUTH
    ) as ws:
        _read_until(ws, b"go")  # the command runs: the marker now lives until the socket closes
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ps = server.client.post(
            f"{API}/{workspace}/exec", json={"command": "ps", "args": ["-eo", "args"], "mode": "argv"}
        )
        if marker not in ps.json()["stdout"]:
            return
        time.sleep(0.2)
    pytest.fail(f"{marker!r} still runs 30 s after the socket closed:\n{ps.json()['stdout']}")


def test_typing_into_an_open_terminal_counts_as_use(server: Server, workspace: str) -> None:
    """Keys typed into a terminal opened long ago push the workspace's idle expiry out, so a person working in the
    console's terminal is never stopped as idle."""
    with connect(_url(server, workspace), additional_headers=AUTH) as ws:
        _read_until(ws, b"#")  # the prompt: the terminal is open, and opening it was use
        opened = server.client.get(f"{API}/{workspace}").json()["expires_at"]
        assert opened is not None, "the e2e server runs with an idle timeout"
        deadline = time.monotonic() + 15
        while server.client.get(f"{API}/{workspace}").json()["expires_at"] == opened:
            assert time.monotonic() < deadline, f"typing never moved expires_at past {opened}"
            ws.send(b" ")  # a keystroke, no command: only the terminal sees it
            ws.recv(timeout=5)  # its echo
            time.sleep(0.2)  # let the clock pass the second expires_at shows
        assert server.client.get(f"{API}/{workspace}").json()["expires_at"] > opened
