"""``corral mcp`` over real pipes: plain tool calls and pings are answered off the mcp package's dispatcher, with
the very message the package writes, and everything else still goes to the package.

Each test runs ``corral.mcp_server._serve`` in a subprocess (stdin and stdout are pipes, as an MCP host starts it)
with a tool call function standing in for the HTTP API: ``bash`` answers after ``arguments["sleep_s"]`` seconds
(with ``arguments["out_bytes"]`` bytes of output), ``read`` is refused as the server refuses a tool, ``grep`` fails
with an unexpected error, and ``glob`` answers a JSON list where an object belongs. Every call it receives is logged
to stderr as ``CALL <name>``, so a test sees which calls reached the API. ``Peer(line_limit=..., finish_s=...)``
lowers corral mcp's longest line and its wait for calls at exit.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mcp_types import methods

pytestmark = pytest.mark.unit

_SERVE = """
import asyncio, os, sys
import corral.mcp_server
from corral.errors import CorralError
from corral.mcp_server import _serve

corral.mcp_server._LINE_LIMIT = int(os.environ.get("LINE_LIMIT", corral.mcp_server._LINE_LIMIT))
corral.mcp_server.FINISH_CALLS_S = float(os.environ.get("FINISH_S", corral.mcp_server.FINISH_CALLS_S))

class Session:
    id = "s1"

async def call(name, arguments):
    print("CALL", name, file=sys.stderr, flush=True)
    if name == "read":
        raise CorralError("Tool 'read' is not enabled for this agent type")
    if name == "grep":
        raise RuntimeError("a secret in the traceback")
    if name == "glob":
        return []
    await asyncio.sleep(arguments.get("sleep_s", 0))
    out = f"ran {arguments.get('command')}\\n" + "x" * arguments.get("out_bytes", 0)
    return {"exit_code": 0, "stdout": out, "stderr": "", "duration_ms": 1}

asyncio.run(_serve(Session(), ["bash", "read", "grep"], call))
"""

LEGACY_VERSIONS = [v for v in methods.KNOWN_PROTOCOL_VERSIONS if v < "2026"]


class Peer:
    """The host's side of the wire: JSON-RPC lines in, answers read with a deadline."""

    def __init__(self, **limits: float) -> None:
        env = {**os.environ, **{name.upper(): str(value) for name, value in limits.items()}}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self._buffer = b""
        self.calls: list[str] = []

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self, timeout_s: float = 20.0) -> dict[str, Any] | None:
        """The next line written, parsed; None at EOF."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                assert left > 0 and selector.select(left), f"no answer in {timeout_s} s"
                chunk = self.proc.stdout.read1(65536)
                if not chunk:
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def initialize(self, version: str) -> None:
        client = {"name": "test", "version": "1"}
        params = {"protocolVersion": version, "capabilities": {}, "clientInfo": client}
        self.send({"id": "init", "method": "initialize", "params": params})
        answer = self.answer()
        assert answer is not None and answer["result"]["protocolVersion"] == version
        self.send({"method": "notifications/initialized"})

    def wait_for_call(self) -> None:
        """Read corral mcp's log until the next call reaches the API."""
        assert self.proc.stderr is not None
        while line := self.proc.stderr.readline().decode():
            if line.startswith("CALL "):
                self.calls.append(line.split()[1])
                return
        raise AssertionError("corral mcp exited before the call reached the API")

    def close(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Close stdin; the answers still written before exit, and the calls that reached the API."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        rest = []
        while (answer := self.answer()) is not None:
            rest.append(answer)
        assert self.proc.wait(timeout=20) == 0
        assert self.proc.stderr is not None
        log = self.proc.stderr.read().decode().splitlines()
        return rest, self.calls + [line.split()[1] for line in log if line.startswith("CALL ")]


@pytest.fixture
def make_peer() -> Iterator[Callable[..., Peer]]:
    """Peers (corral mcp subprocesses), each killed and its pipes closed at the end."""
    made: list[Peer] = []

    def make(**limits: float) -> Peer:
        made.append(Peer(**limits))
        return made[-1]

    yield make
    for peer in made:
        if peer.proc.poll() is None:
            peer.proc.kill()
        peer.proc.wait()
        for stream in (peer.proc.stdin, peer.proc.stdout, peer.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def peer(make_peer: Callable[..., Peer]) -> Peer:
    return make_peer()


def _call(request_id: str, name: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": request_id, "method": "tools/call", "params": {"name": name, "arguments": arguments, **extra}}


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_a_plain_call_gets_the_same_answer_the_package_gives(peer: Peer, version: str) -> None:
    """For every protocol version with the initialize handshake, a plain call (answered by corral mcp itself) and
    the same call carrying ``_meta`` (left to the mcp package's server) get the same result, success and refusal
    alike; so does a ping."""
    peer.initialize(version)
    for name, arguments in (("bash", {"command": "echo hi"}), ("read", {"path": "a"})):
        peer.send(_call("plain", name, arguments))
        plain = peer.answer()
        peer.send(_call("package", name, arguments, _meta={}))
        package = peer.answer()
        assert plain is not None and package is not None
        assert (plain["id"], package["id"]) == ("plain", "package")
        assert json.dumps(plain["result"]) == json.dumps(package["result"]), name
    assert plain["result"]["isError"] is True and "not enabled" in plain["result"]["content"][0]["text"]
    peer.send({"id": 7, "method": "ping"})
    assert peer.answer() == {"jsonrpc": "2.0", "id": 7, "result": {}}
    assert peer.close() == ([], ["bash", "bash", "read", "read"])


def test_an_unexpected_failure_is_the_same_internal_error_on_both_paths(peer: Peer) -> None:
    """A call failing with something else than a Corral error answers JSON-RPC's internal error without the
    exception's text, whether corral mcp or the package answers it; the failure goes to the log."""
    peer.initialize("2025-06-18")
    peer.send(_call(1, "grep", {"pattern": "x"}))
    peer.send(_call(2, "grep", {"pattern": "x"}, _meta={}))
    peer.send(_call(3, "glob", {"pattern": "*"}))  # an answer of the wrong shape fails the same way
    peer.send(_call(4, "glob", {"pattern": "*"}, _meta={}))
    answers = sorted([peer.answer() for _ in range(4)], key=lambda a: a["id"] if a else 0)
    error = {"code": -32603, "message": "Internal error (see corral mcp's log)"}
    assert answers == [{"jsonrpc": "2.0", "id": n, "error": error} for n in (1, 2, 3, 4)]
    peer.proc.stdin.close()  # type: ignore[union-attr]
    assert peer.proc.wait(timeout=20) == 0
    log = peer.proc.stderr.read().decode()  # type: ignore[union-attr]
    assert log.count("a secret in the traceback") == 2


def test_lines_that_are_not_json_rpc_are_dropped_and_serving_goes_on(peer: Peer) -> None:
    """Deep nesting, a lone surrogate in an id and garbage are dropped as the package drops them; bytes that are
    not UTF-8 are read as the package reads them (replaced), and serving goes on."""
    peer.initialize("2025-06-18")
    for line in (b"[" * 5000 + b"]" * 5000, b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}', b"\xff\xfe garbage"):
        assert peer.proc.stdin is not None
        peer.proc.stdin.write(line + b"\n")
    peer.proc.stdin.write(b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"bash","arguments":'
                          b'{"command":"caf\xe9"}}}\n')  # fmt: skip
    peer.proc.stdin.flush()
    answer = peer.answer()
    assert answer is not None and answer["id"] == 3
    assert answer["result"]["content"][0]["text"] == "ran caf\ufffd"
    assert peer.close() == ([], ["bash"])


def test_calls_overlap_and_stdin_closed_with_one_in_flight_still_gets_its_answer(peer: Peer) -> None:
    """A slow call does not hold up a quick one behind it; closing stdin while a call runs still writes its answer
    before corral mcp exits (the mcp package's path answers such a call "Connection closed")."""
    peer.initialize("2025-11-25")
    peer.send(_call("slow", "bash", {"command": "slow", "sleep_s": 1.0}))
    peer.send(_call("quick", "bash", {"command": "quick"}))
    quick = peer.answer()
    assert quick is not None and quick["id"] == "quick"
    rest, calls = peer.close()
    assert [(a["id"], a["result"]["content"][0]["text"]) for a in rest] == [("slow", "ran slow")]
    assert calls == ["bash", "bash"]


@pytest.mark.parametrize(("request_id", "cancelled_id"), [("long", "long"), (5, "5")])
def test_a_cancelled_call_gets_no_answer(peer: Peer, request_id: str | int, cancelled_id: str) -> None:
    """notifications/cancelled stops a call in flight, and no answer is written for it (MCP: the receiver should
    not answer a cancelled request); ids match as the package matches them ("5" is 5), and a boolean cancels
    nothing (true is not id 1)."""
    peer.initialize("2025-06-18")
    peer.send(_call(1, "bash", {"command": "one", "sleep_s": 3}))
    peer.send(_call(request_id, "bash", {"command": "long", "sleep_s": 30}))  # type: ignore[arg-type]
    peer.wait_for_call()
    peer.wait_for_call()
    peer.send({"method": "notifications/cancelled", "params": {"requestId": True}})
    peer.send({"method": "notifications/cancelled", "params": {"requestId": cancelled_id, "reason": "user"}})
    peer.send({"id": "after", "method": "ping"})
    assert peer.answer() == {"jsonrpc": "2.0", "id": "after", "result": {}}
    started = time.monotonic()
    rest, calls = peer.close()
    assert [a["id"] for a in rest] == [1] and calls == ["bash", "bash"]
    assert time.monotonic() - started < 20  # nothing waited for the cancelled call's 30 s


def test_an_initialize_id_used_again_later_keeps_calls_answered_here(peer: Peer) -> None:
    """Ids need only be unique among requests in flight: a tools/list reusing the initialize request's id leaves
    the next calls answered here (a call still running when stdin closes gets its answer, where the package's
    path answers "Connection closed")."""
    peer.initialize("2025-06-18")
    peer.send({"id": "init", "method": "tools/list"})
    listed = peer.answer()
    assert listed is not None and [t["name"] for t in listed["result"]["tools"]] == ["bash", "read", "grep"]
    peer.send(_call("slow", "bash", {"command": "slow", "sleep_s": 0.5}))
    peer.wait_for_call()
    rest, _ = peer.close()
    assert [(a["id"], "result" in a) for a in rest] == [("slow", True)]


def test_requests_before_initialize_and_odd_shapes_are_left_to_the_package(peer: Peer) -> None:
    """A call before the handshake is the package's to refuse (it never reaches the API); after it, a call whose
    arguments are not an object gets the package's error, and one whose id is a boolean is not run."""
    peer.send(_call("early", "bash", {"command": "early"}))
    early = peer.answer()
    assert early is not None and early["id"] == "early" and "error" in early
    peer.send({"id": "first", "method": "ping"})  # a ping may come before initialize
    assert peer.answer() == {"jsonrpc": "2.0", "id": "first", "result": {}}
    peer.initialize("2025-06-18")
    peer.send(_call("grep", "grep", {"pattern": "x"}))  # answered here now: the internal error tells it
    grep = peer.answer()
    assert grep is not None and grep["error"]["message"] == "Internal error (see corral mcp's log)"
    peer.send({"id": "args", "method": "tools/call", "params": {"name": "bash", "arguments": ["not", "an", "object"]}})
    args = peer.answer()
    assert args is not None and args["id"] == "args" and args["error"]["code"] == -32602
    peer.send(_call(True, "bash", {"command": "boolean id"}))  # type: ignore[arg-type]  # not a JSON-RPC id
    assert peer.close() == ([], ["grep"])


def test_a_line_over_the_limit_is_dropped_and_serving_goes_on(make_peer: Callable[..., Peer]) -> None:
    """A line longer than corral mcp's limit (1 GiB; 100 kB here) is dropped, and the next request is answered."""
    peer = make_peer(line_limit=100_000)
    peer.initialize("2025-06-18")
    assert peer.proc.stdin is not None
    big = b'{"jsonrpc":"2.0","id":"big","method":"ping","params":{"x":"' + b"y" * 300_000 + b'"}}\n'
    peer.proc.stdin.write(big)
    peer.send({"id": "next", "method": "ping"})
    assert peer.answer() == {"jsonrpc": "2.0", "id": "next", "result": {}}
    assert peer.close() == ([], [])


def test_a_client_that_stops_reading_does_not_hold_the_exit(make_peer: Callable[..., Peer]) -> None:
    """stdin closed with an answer the client never reads: corral mcp gives up after its wait (1 s here) and exits."""
    peer = make_peer(finish_s=1)
    peer.initialize("2025-06-18")
    peer.send(_call("big", "bash", {"command": "big", "out_bytes": 4_000_000}))
    peer.wait_for_call()
    assert peer.proc.stdin is not None
    peer.proc.stdin.close()
    assert peer.proc.wait(timeout=20) == 0


def test_a_ping_sharing_the_initialize_id_does_not_switch_the_fast_path_off(peer: Peer) -> None:
    """A ping and initialize sent together under one id: the ping's answer is not taken for initialize's, so calls
    are still answered here (a call in flight at EOF gets its answer)."""
    assert peer.proc.stdin is not None
    client = {"name": "test", "version": "1"}
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
    ping, initialize = {"id": 1, "method": "ping"}, {"id": 1, "method": "initialize", "params": params}
    peer.proc.stdin.write(b"".join(json.dumps({"jsonrpc": "2.0", **m}).encode() + b"\n" for m in (ping, initialize)))
    peer.proc.stdin.flush()
    first, second = peer.answer(), peer.answer()
    assert first is not None and second is not None
    assert {"protocolVersion" in a["result"] for a in (first, second)} == {True, False}
    peer.send({"method": "notifications/initialized"})
    peer.send(_call("slow", "bash", {"command": "slow", "sleep_s": 0.5}))
    peer.wait_for_call()
    rest, _ = peer.close()
    assert [(a["id"], "result" in a) for a in rest] == [("slow", True)]


def test_a_client_that_closed_stdout_ends_the_session_without_a_crash(peer: Peer) -> None:
    """The host closes its end of stdout but not stdin: corral mcp stops reading at the first answer it cannot
    write, and exits cleanly, whichever path wrote it."""
    peer.initialize("2025-06-18")
    assert peer.proc.stdout is not None
    peer.proc.stdout.close()
    peer.send({"id": "list", "method": "tools/list"})  # answered by the package
    peer.send({"id": "ping", "method": "ping"})
    assert peer.proc.wait(timeout=20) == 0
