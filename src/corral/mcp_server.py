"""``corral mcp``: one session's allowed tools, served over MCP on stdin/stdout.

The MCP server holds no policy of its own. It lists the tools the session's agent type enables, each with a JSON
schema for its arguments, and forwards every call, whatever its name, to Corral's HTTP API (through
:class:`LeanTools`, one keep-alive connection, for a plain http:// server; else the SDK). So the
server decides what is allowed and audits every call exactly as it does for HTTP clients; a refused call comes back
as an MCP error result carrying the server's message (``Tool 'bash' is not enabled for this agent type``).

With ``--agent-type`` the command starts the session itself, waits until it is active, and ends it when the MCP
client closes stdin or sends SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import anyio
import h11
import httpx
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.dispatcher import as_request_id, coerce_request_id
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import RequestId, methods
from pydantic import ValidationError

import corral
from corral.client import AsyncCorral, AsyncSession, _api
from corral.client._errors import CorralConnectionError, CorralTimeoutError
from corral.client._lean import LeanClient
from corral.errors import CorralError, InvalidRequestError

__all__ = [
    "TOOL_SPECS",
    "LeanTools",
    "allowed_tools",
    "build_server",
    "render_result",
    "serve_stdio",
    "tool_definitions",
    "tool_result",
]

log = logging.getLogger(__name__)

END_SESSION_TIMEOUT_S = 30.0
FINISH_CALLS_S = 30.0
"""How long corral mcp, its stdin closed, still waits for the tool calls in flight to answer and for the client to
read the answers."""
INTERNAL_ERROR = types.ErrorData(code=types.INTERNAL_ERROR, message="Internal error (see corral mcp's log)")
"""What a tool call that failed unexpectedly answers, on either path: the failure itself goes to stderr only."""
_LINE_LIMIT = 1 << 30
"""The longest JSON-RPC line read from stdin (a write tool call carries the whole file)."""

_PATH = {"type": "string", "minLength": 1, "description": "a path relative to /workspace"}
TOOL_SPECS: Mapping[str, tuple[str, dict[str, Any]]] = {
    "bash": (
        "Run a shell command in the workspace's persistent bash session (it starts in /workspace; cd and export "
        "carry over to the next call). Returns stdout, stderr and the exit code.",
        {
            "type": "object",
            "properties": {
                "command": {"type": "string", "minLength": 1, "description": "the command line"},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600,
                              "description": "kill the command after this many seconds (default 120)"},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    ),
    "read": (
        "Read a text file in the workspace, as a window of lines.",
        {
            "type": "object",
            "properties": {
                "path": _PATH,
                "offset": {"type": "integer", "minimum": 1, "description": "the first line, 1-based (default 1)"},
                "limit": {"type": "integer", "minimum": 1, "description": "how many lines (default 2000)"},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    ),
    "write": (
        "Write a text file in the workspace, replacing it; parent directories are created.",
        {
            "type": "object",
            "properties": {"path": _PATH, "content": {"type": "string", "description": "the file's new content"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    ),
    "edit": (
        "Replace an exact string in a file. old_string must occur exactly once, unless replace_all is true.",
        {
            "type": "object",
            "properties": {
                "path": _PATH,
                "old_string": {"type": "string", "description": "the exact text to replace"},
                "new_string": {"type": "string", "description": "its replacement"},
                "replace_all": {"type": "boolean", "description": "replace every occurrence (default false)"},
            },
            "required": ["path", "old_string", "new_string"],
            "additionalProperties": False,
        },
    ),
    "grep": (
        "Search file contents in the workspace with a regular expression (ripgrep); returns path:line: text.",
        {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "minLength": 1, "description": "the regular expression"},
                "path": {**_PATH, "description": "where to search (default /workspace)"},
                "include": {"type": "string", "description": "a glob file names must match, e.g. *.py"},
                "case_insensitive": {"type": "boolean", "description": "ignore case (default false)"},
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
    ),
    "glob": (
        "Find paths in the workspace matching a glob; ** matches any depth.",
        {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "minLength": 1, "description": "the glob, e.g. src/**/*.py"},
                "path": {**_PATH, "description": "where to search (default /workspace)"},
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
    ),
    "git": (
        "Run git in /workspace. Options that make git run other programs (-c, hooks, ext:: URLs...) are refused.",
        {
            "type": "object",
            "properties": {
                "args": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                         "description": 'git\'s arguments, e.g. ["log", "--oneline", "-5"]'},
            },
            "required": ["args"],
            "additionalProperties": False,
        },
    ),
}  # fmt: skip
"""Per tool: its description and the JSON schema of its arguments (the HTTP API's tool arguments)."""


def tool_definitions(allowed: Iterable[str]) -> list[types.Tool]:
    """The MCP tool list for the allowed tools, in the API's order; names without a spec are skipped."""
    wanted = set(allowed)
    return [
        types.Tool(name=name, description=description, input_schema=schema)
        for name, (description, schema) in TOOL_SPECS.items()
        if name in wanted
    ]


def _command_output(result: Mapping[str, Any]) -> str:
    parts = [str(result.get("stdout") or "")]
    stderr = str(result.get("stderr") or "")
    if stderr:
        parts.append(f"[stderr]\n{stderr}")
    code = result.get("exit_code")
    if code != 0 or not any(parts):
        parts.append(f"[exit code {code}]")
    return "\n".join(p.rstrip("\n") for p in parts if p)


def _read_output(result: Mapping[str, Any]) -> str:
    note = f"\n[{result.get('total_lines')} lines in all; more follow]" if result.get("truncated") else ""
    return f"{result.get('content', '')}{note}"


def _listing(lines: list[str], truncated: bool, cut: str, empty: str) -> str:
    return "\n".join([*lines, *([cut] if truncated else [])]) or empty


def _grep_output(result: Mapping[str, Any]) -> str:
    lines = [f"{m.get('path')}:{m.get('line_number')}: {m.get('line')}" for m in result.get("matches") or ()]
    return _listing(lines, bool(result.get("truncated")), "[more matches were cut]", "no matches")


def _glob_output(result: Mapping[str, Any]) -> str:
    paths = [str(p) for p in result.get("paths") or ()]
    return _listing(paths, bool(result.get("truncated")), "[more paths were cut]", "no paths match")


_RENDERERS: Mapping[str, Callable[[Mapping[str, Any]], str]] = {
    "bash": _command_output,
    "git": _command_output,
    "read": _read_output,
    "write": lambda r: f"wrote {r.get('bytes_written')} bytes",
    "edit": lambda r: f"{r.get('replacements')} replacement(s)",
    "grep": _grep_output,
    "glob": _glob_output,
}


def render_result(tool: str, result: Mapping[str, Any]) -> str:
    """A tool's JSON result as the text a model reads (the JSON itself goes along as structured content)."""
    renderer = _RENDERERS.get(tool)
    return renderer(result) if renderer is not None else json.dumps(result, indent=2)


async def allowed_tools(client: AsyncCorral, session: AsyncSession) -> tuple[str, ...]:
    """The tools the session may call: its own snapshot when the API shows one, else its agent type's config."""
    snapshot = session.info.raw.get("tools")
    if isinstance(snapshot, list):
        return tuple(str(t) for t in snapshot)
    return (await client.agent_types.get(session.info.agent_type_id)).tools


ToolCall = Callable[[str, Mapping[str, Any]], Awaitable[dict[str, Any]]]
"""``(tool, arguments) -> result``, as :meth:`corral.client.AsyncTools.call`."""


class LeanTools:
    """A session's tool calls over one keep-alive HTTP/1.1 connection (:mod:`corral.client._lean`): what
    ``session.tools.call`` does, without httpx's client, which costs about 2 ms a call here (as much as the API's
    own work). For a plain ``http://`` server only; answers and errors are read exactly as the SDK reads them."""

    def __init__(self, base_url: str, token: str | None, session_id: str) -> None:
        url = httpx.URL(base_url)
        if url.scheme != "http" or not url.host:
            raise ValueError(f"LeanTools needs a plain http:// server URL, got {base_url!r}")
        self._base_url = base_url.rstrip("/")
        self._prefix = url.path.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = LeanClient(url.host, url.port or 80, self._headers)
        self._session_id = session_id

    @staticmethod
    def serves(base_url: str) -> bool:
        """Whether ``base_url`` is a server this client can reach (plain http, no TLS)."""
        url = httpx.URL(base_url)
        return url.scheme == "http" and bool(url.host)

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Call ``tool``; raises the SDK's typed errors (and CorralConnectionError / CorralTimeoutError)."""
        timeout = arguments.get("timeout_s")
        wait = float(timeout) if isinstance(timeout, int | float) and not isinstance(timeout, bool) else None
        op = _api.call_tool(self._session_id, tool, arguments, timeout_s=wait or None)
        try:
            async with asyncio.timeout(op.timeout_s):
                answer = await self._client.request(op.method, self._prefix + op.path, json_body=op.json)
        except TimeoutError:
            await self._client.aclose()  # the answer may still come: this connection cannot be reused
            raise CorralTimeoutError(f"no answer from Corral at {self._base_url} in time") from None
        except (OSError, h11.ProtocolError) as exc:
            await self._client.aclose()
            reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else str(exc) or type(exc).__name__
            raise CorralConnectionError(
                f"cannot reach Corral at {self._base_url}: {reason} (is `corral serve` running there? set CORRAL_URL)"
            ) from None
        if 200 <= answer.status < 300:  # read as the SDK reads it (response.json()), without building httpx objects
            result: dict[str, Any] = json.loads(answer.body)
            return result
        request = httpx.Request(op.method, self._base_url + op.path, headers=self._headers)
        response = httpx.Response(answer.status, headers=list(answer.headers), content=answer.body, request=request)
        return op.parse(_api.check(response))

    async def aclose(self) -> None:
        """Close the connection."""
        await self._client.aclose()


def build_server(session: AsyncSession, tools: Sequence[str], call: ToolCall | None = None) -> Server[Any]:
    """A low-level MCP server listing ``tools`` and forwarding every call to the session over HTTP (through
    ``call``, default the SDK's ``session.tools.call``)."""
    definitions = tool_definitions(tools)
    call_over_http = call or session.tools.call

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=definitions)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await tool_result(call_over_http, params.name, params.arguments or {})

    return Server(
        "corral",
        version=corral.__version__,
        instructions=(
            f"Tools of Corral session {session.id}: they run in its isolated workspace, with paths relative to "
            "/workspace."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def tool_result(call: ToolCall, name: str, arguments: Mapping[str, Any]) -> types.CallToolResult:
    """One tool call's MCP result: the rendered text with the JSON as structured content, or the server's refusal
    (or any other Corral error) as an error result the model reads."""
    # No check here on purpose: the server enforces the tool policy and audits refused calls too.
    try:
        result = await call(name, arguments)
        text = render_result(name, result)
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=result)
    except CorralError as exc:
        return types.CallToolResult(content=[types.TextContent(text=exc.message)], is_error=True)
    except Exception:  # a bug, or an answer of another shape: the client sees that much, the log sees the rest
        log.exception("tool call %r failed", name)
        raise MCPError.from_error_data(INTERNAL_ERROR) from None


async def _serve(session: AsyncSession, tools: Sequence[str], call: ToolCall | None = None) -> None:
    call_over_http = call or session.tools.call
    server = build_server(session, tools, call_over_http)
    options = server.create_initialization_options()
    async with _stdio_pipes() as pipes:
        if pipes is None:
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, options)
            return
        wire = _Wire(*pipes, call_over_http)
        try:
            await server.run(wire, wire, options)
        finally:
            await wire.finish()


def _plain_request(message: types.JSONRPCMessage) -> tuple[RequestId, str, dict[str, Any] | None] | None:
    """``(id, method, params)`` of a ping or of a plain tools/call (``name`` and ``arguments``, no ``_meta`` or
    task); None for any other message."""
    if not isinstance(message, types.JSONRPCRequest) or (request_id := as_request_id(message.id)) is None:
        return None
    params = message.params
    if message.method == "ping" and params is None:
        return request_id, "ping", None
    if message.method == "tools/call" and isinstance(params, dict) and params.keys() <= {"name", "arguments"}:
        return request_id, "tools/call", params
    return None


class _Wire:
    """The MCP wire over stdin and stdout pipes, read and written by the event loop, in two parts.

    - The hot requests are answered here: ``tools/call`` of the plain form (``name`` and ``arguments``, nothing
      else) and ``ping``, once the package's server has answered the client's ``initialize``. Each call runs in
      its own task, so calls overlap as they do in the mcp package, and ``notifications/cancelled`` cancels one
      (then no answer is written, as MCP says). Lines are decoded and parsed as the package's stdio transport
      does, ids are matched as its dispatcher matches them, and requests and answers go through the same
      per-version checks of ``mcp_types.methods``: the answer is the message the package writes for the call.
    - Everything else (the handshake, ``tools/list``, a call carrying ``_meta`` or a task, a line that is not
      JSON-RPC) goes to the package's server, which reads and writes whole messages through :meth:`receive` and
      :meth:`send`.

    Why: the package's server passes each message through a relay task, a dispatcher, a middleware chain and a
    handler task, about ten turns of the event loop: 0.3 ms a call on a quiet machine, 0.8 ms in the tool bench,
    where corral mcp's code is cold between calls (timestamps in corral mcp). Answered here, a call is one parse,
    the HTTP call and one write.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, call: ToolCall) -> None:
        self._reader = reader
        self._writer = writer
        self._call = call
        self._initialize_id: RequestId | None = None  # an initialize request the package has not answered yet
        self._version: str | None = None  # the protocol version the package's server agreed in its initialize answer
        self._calls: dict[RequestId, asyncio.Task[None]] = {}  # by coerce_request_id, as the package keys them
        self._lost = False  # the client closed its end of stdout: nothing more is read or started

    async def receive(self) -> SessionMessage | Exception:
        """The next message for the package's server (ReadStream)."""
        while not self._lost:
            try:
                line = await self._reader.readline()
            except ValueError as exc:  # longer than _LINE_LIMIT: what was read of it is dropped, serving goes on
                return exc
            if not line:
                break
            try:  # decoded as the package's stdio transport decodes stdin
                message = types.jsonrpc_message_adapter.validate_json(line.decode(errors="replace"), by_name=False)
            except Exception as exc:  # the package logs and drops it, as over its own stdio transport
                return exc
            if await self._answered_here(message):
                continue
            self._observe(message)
            return SessionMessage(message)
        raise anyio.EndOfStream

    def __aiter__(self) -> _Wire:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def send(self, item: SessionMessage) -> None:
        """Write one of the package server's messages (WriteStream)."""
        message = item.message
        if self._initialize_id is not None and getattr(message, "id", None) == self._initialize_id:
            agreed = message.result.get("protocolVersion") if isinstance(message, types.JSONRPCResponse) else None
            if isinstance(agreed, str):  # the initialize answer (a ping answered under the same id is not)
                self._version, self._initialize_id = agreed, None
            elif isinstance(message, types.JSONRPCError):
                self._initialize_id = None
        self._write(message)
        await self._drain()

    async def aclose(self) -> None:
        """Nothing to close: the pipes outlive the package's server, for the calls still being answered here."""

    async def __aenter__(self) -> _Wire:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def finish(self) -> None:
        """stdin closed: wait for the calls still running and for the client to read their answers, together up to
        ``FINISH_CALLS_S``; the calls left are cancelled, unanswered."""
        deadline = time.monotonic() + FINISH_CALLS_S
        if self._calls:
            _, late = await asyncio.wait(list(self._calls.values()), timeout=FINISH_CALLS_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                await self._drain()
        except TimeoutError:  # what is left unread is dropped, so the pipes' own exit drain does not wait again
            self._writer.transport.abort()

    def _observe(self, message: types.JSONRPCMessage) -> None:
        if isinstance(message, types.JSONRPCRequest) and message.method == "initialize":
            self._initialize_id = message.id
        elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            request_id = as_request_id((message.params or {}).get("requestId"))
            task = self._calls.get(coerce_request_id(request_id)) if request_id is not None else None
            if task is not None:
                task.cancel()

    async def _answered_here(self, message: types.JSONRPCMessage) -> bool:
        """Answer ``message`` here if it is a ping or a plain tools/call after the handshake; False leaves it to the
        package (an id in flight here too, as the package would see it)."""
        request = _plain_request(message) if self._version is not None else None
        if request is None or coerce_request_id(request[0]) in self._calls:
            return False
        request_id, method, params = request
        try:
            methods.validate_client_request(method, self._version or "", params)
        except (ValueError, KeyError, ValidationError):
            return False  # the package answers with its error
        if params is None:
            self._answer(request_id, method, {})
            await self._drain()
            return True
        key = coerce_request_id(request_id)
        task = asyncio.create_task(self._call_tool(request_id, params), name=f"mcp-call-{request_id}")
        self._calls[key] = task
        task.add_done_callback(lambda _: self._calls.pop(key, None))
        return True

    async def _call_tool(self, request_id: RequestId, params: dict[str, Any]) -> None:
        try:
            result = await tool_result(self._call, params["name"], params.get("arguments") or {})
            self._answer(request_id, "tools/call", result.model_dump(by_alias=True, mode="json", exclude_none=True))
        except MCPError as exc:
            self._write(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=exc.error))
        except Exception:  # every call is answered: a result the package's shape check refuses too
            log.exception("tool call %r: its answer could not be written", params["name"])
            self._write(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=INTERNAL_ERROR))
        await self._drain()

    def _answer(self, request_id: RequestId, method: str, result: dict[str, Any]) -> None:
        """Write the result as the package's server shapes it for the agreed version."""
        shaped = methods.serialize_server_result(method, self._version or "", result)
        self._write(types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=shaped))

    def _write(self, message: types.JSONRPCMessage) -> None:
        try:
            line = message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
        except ValueError:  # e.g. an id holding a lone surrogate: it cannot be written back as JSON
            log.warning("dropped an answer that cannot be written as JSON")
            return
        self._writer.write(line)

    async def _drain(self) -> None:
        """Wait while the client is not reading. A client that closed its end of stdout is gone: nothing more is
        read, and calls in flight are still waited for but their answers go nowhere."""
        try:
            await self._writer.drain()
        except ConnectionError:
            self._lost = True


@contextlib.asynccontextmanager
async def _stdio_pipes() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None]:
    """stdin and stdout served by the event loop, or None where they cannot be (a regular file, a terminal...):
    then the mcp package's transport serves them, with a worker thread per line read and two per message written.

    As the mcp package does, the wire moves to private descriptors while serving, and fd 0 reads the null device
    and fd 1 writes to stderr, so nothing else in this process (a library, a child) can read or tear the wire.
    """
    if not _pipes_of_their_own():
        yield None
        return
    loop = asyncio.get_running_loop()
    wire = [os.dup(0), os.dup(1)]  # above 2 and not inherited; kept to put the wire back on exit
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    try:
        reader = asyncio.StreamReader(limit=_LINE_LIMIT)
        read_transport, _ = await loop.connect_read_pipe(  # the transports own (and close) duplicates of their own
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(wire[0]), "rb", buffering=0)
        )
        write_transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(os.dup(wire[1]), "wb", buffering=0)
        )
        writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
        try:
            yield reader, writer
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(FINISH_CALLS_S):  # a client that stopped reading does not hold the exit
                    await writer.drain()
            read_transport.close()
            write_transport.close()
    finally:
        for fd, kept in enumerate(wire):  # the wire back on fd 0 and 1, blocking as it was
            os.dup2(kept, fd)
            os.set_blocking(fd, True)
            os.close(kept)


def _pipes_of_their_own() -> bool:
    """stdin and stdout are pipes (or sockets) the event loop can wait on, and stdout is not stderr's pipe too:
    the loop makes the wire non-blocking, which stderr must not become."""
    if sys.platform == "win32":
        return False
    try:
        found = [os.fstat(fd) for fd in (0, 1, 2)]
    except OSError:
        return False
    streams = all(stat.S_ISFIFO(f.st_mode) or stat.S_ISSOCK(f.st_mode) for f in found[:2])
    return streams and (found[1].st_dev, found[1].st_ino) != (found[2].st_dev, found[2].st_ino)


class _Lifetime:
    """The session being served, and ending it (once) when this process started it."""

    def __init__(self, client: AsyncCorral) -> None:
        self.client = client
        self.session: AsyncSession | None = None
        self.owned = False
        self._ending: anyio.Event | None = None

    async def end(self) -> None:
        """End an owned session, once; shielded and bounded, so neither a cancellation nor a slow server can skip
        or hang it. A second caller (a signal arriving during the first) waits for the first to finish."""
        if not self.owned or self.session is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(END_SESSION_TIMEOUT_S):
            if self._ending is not None:
                await self._ending.wait()
                return
            self._ending = anyio.Event()
            try:
                await self.session.end()
                log.info("ended session %s", self.session.id)
            finally:
                self._ending.set()

    async def exit_on_signal(self) -> None:
        """SIGTERM or SIGINT: end an owned session, then exit at once.

        Exiting cannot wait for an orderly shutdown: the stdio transport reads stdin in a worker thread that only a
        closed stdin releases, and a signal usually comes precisely because the client did not close it.
        """
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s; stopping", signal.Signals(signum).name)
                await self.end()
                sys.stderr.flush()
                os._exit(128 + signum)


async def _run(
    lifetime: _Lifetime,
    *,
    session_id: str | None,
    agent_type_id: str,
    task_context: Mapping[str, Any] | None,
    wait_timeout_s: float,
    token: str | None,
) -> None:
    client = lifetime.client
    if session_id is not None:
        session = await client.sessions.get(session_id)
        if session.status == "ended":
            raise InvalidRequestError(f"session {session_id} has ended; start a new one")
    else:
        session = await client.sessions.start(agent_type_id, task_context=task_context)
        lifetime.owned = True
        log.info("started session %s", session.id)
    lifetime.session = session
    info = await session.wait(timeout_s=wait_timeout_s)
    if info.degraded:
        log.warning("session %s is degraded: %s", session.id, info.degraded_reason)
    tools = await allowed_tools(client, session)
    if not LeanTools.serves(client.base_url):
        await _serve(session, tools)
        return
    lean = LeanTools(client.base_url, _api.resolve_token(token), session.id)
    try:
        await _serve(session, tools, lean.call)
    finally:
        await lean.aclose()


async def serve_stdio(
    *,
    session_id: str | None = None,
    agent_type_id: str | None = None,
    task_context: Mapping[str, Any] | None = None,
    base_url: str | None = None,
    token: str | None = None,
    wait_timeout_s: float = 300.0,
) -> None:
    """Serve a session's tools over MCP on stdin/stdout until the client closes stdin (or a signal arrives).

    Args:
        session_id: An existing session to serve (it is left running afterwards).
        agent_type_id: Start a session of this type instead, and end it on exit (stdin closed, SIGTERM, SIGINT).
        task_context: With ``agent_type_id``: the task's repository context.
        base_url: The Corral server (default ``CORRAL_URL``).
        token: The API token (default ``CORRAL_API_TOKEN``).
        wait_timeout_s: How long a provisioning session may take before serving gives up.

    Raises:
        CorralError: The session or agent type does not exist, or the server is unreachable.
        TimeoutError: The session still provisions after ``wait_timeout_s``.
    """
    if (session_id is None) == (agent_type_id is None):
        raise InvalidRequestError("give exactly one of session_id and agent_type_id")
    failure: Exception | None = None
    async with AsyncCorral(base_url, token) as client, anyio.create_task_group() as group:
        lifetime = _Lifetime(client)
        group.start_soon(lifetime.exit_on_signal)
        try:
            await _run(lifetime, session_id=session_id, agent_type_id=agent_type_id or "",
                       task_context=task_context, wait_timeout_s=wait_timeout_s, token=token)  # fmt: skip
        except Exception as exc:  # re-raised below, so that it is not wrapped in the task group's ExceptionGroup
            failure = exc
        finally:
            await lifetime.end()
            group.cancel_scope.cancel()
    if failure is not None:
        raise failure
