"""Exec and file operations of the provider contract, served by the guest agent over a :class:`GuestConnection`.

Every provider whose workspaces run :mod:`corral.guest.agent` (Docker and gVisor through ``docker exec -i``,
Firecracker through vsock) implements the same twelve contract methods the same way: get the workspace's agent
connection, send one request, turn the answer into contract values, and turn a lost connection into the
workspace's real state. :class:`AgentBackedProvider` holds that code once. A provider mixes it in and supplies

* ``name`` and ``output_limit`` (bytes kept per stream by :meth:`exec`);
* ``async _agent(workspace_id) -> GuestConnection``: a live connection (connecting, or reconnecting, as needed);
  it raises WorkspaceNotFoundError / WorkspaceStateError for missing or stopped workspaces;
* ``async _require_running(workspace_id)``: raise WorkspaceNotFoundError / WorkspaceStateError unless running;
* optionally ``_exec_env(workspace_id, request)``: the environment of a command (default: the request's), for
  providers that must add the workspace spec's variables themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, TypeVar, cast

from corral.errors import (
    CorralError,
    ExecTimeoutError,
    InvalidRequestError,
    ProviderUnavailableError,
    TooManyRequestsError,
    WorkspaceBrokenError,
)
from corral.guest.client import (
    ANSWER_TIMEOUT_S,
    GuestConnection,
    GuestConnectionLost,
    GuestProtocolError,
    GuestTerminal,
    GuestTunnel,
    WatchBatch,
)
from corral.providers.base import (
    WORKSPACE_ROOT,
    ByteStream,
    DirEvent,
    DirEventStream,
    DirEventType,
    ExecExit,
    ExecOutput,
    ExecRequest,
    ExecResult,
    ExecStream,
    FileInfo,
    PtyRequest,
    ShellUnavailableError,
    WorkspaceEvent,
    check_path,
    check_user,
    collect_exec,
)

__all__ = [
    "EXEC_GRACE_S",
    "MAX_TUNNELS_PER_WORKSPACE",
    "MAX_TUNNELS_TOTAL",
    "AgentBackedProvider",
    "AgentPortStream",
    "AgentPty",
    "ExecGate",
    "TunnelSlots",
    "file_info_from_json",
]

log = logging.getLogger(__name__)

WATCH_LOG_INTERVAL_S = 60.0
"""At most one "watch fell behind" line per watch this often: the agent decides how often it reports drops."""
_T = TypeVar("_T")

EXEC_GRACE_S = 15.0
"""How long past a command's own deadline the host waits for the agent to report the kill, before giving up."""
LOST = "lost the connection to the workspace agent"
LOST_STATE_GRACE_S = 2.0
WALK_TIMEOUT_S = 600.0
"""How long a walk of a whole tree (glob, disk usage) may take before the agent is given up as stuck."""
VIOLATION_GRACE_S = 1.0
"""How long a protocol violation waits to see whether the sandbox is dying (then it is a death, not an attack)."""
MAX_TUNNELS_PER_WORKSPACE = 32
"""Connections to ports one workspace may have open at once, counted by the host: the agent's own cap
(:data:`corral.guest.agent.MAX_TUNNELS`) is only as good as the agent, which the workspace can replace."""
MAX_TUNNELS_TOTAL = 256
"""Connections to ports into all workspaces this server may have open at once (each holds up to
:data:`corral.guest.agent.TUNNEL_WINDOW` of its memory)."""


def _exit_status(header: dict[str, Any]) -> tuple[int, float]:
    """The exit code and duration of an ``exit`` frame; the values come from inside the workspace, so check them."""
    code = header.get("code")
    if isinstance(code, bool) or not isinstance(code, int) or not -(2**31) <= code < 2**31:
        raise GuestProtocolError(f"an exit frame with an invalid exit code {str(code)[:40]!r}")
    return code, _duration(header)


def _duration(header: dict[str, Any]) -> float:
    duration = header.get("duration_ms", 0.0)
    return float(duration) if isinstance(duration, int | float) and not isinstance(duration, bool) else 0.0


def file_info_from_json(raw: dict[str, Any]) -> FileInfo:
    """The agent's ``stat``/``list`` entry as a :class:`FileInfo`.

    Raises:
        ValueError, TypeError or KeyError: an entry that is not what the agent's protocol sends.
    """
    kind, target = raw["type"], raw.get("symlink_target")
    if kind not in ("file", "dir", "symlink", "other"):
        raise ValueError(f"unknown file type {str(kind)[:20]!r}")
    return FileInfo(
        path=_text(raw["path"]),
        name=_text(raw["name"]),
        type=kind,
        size=_integer(raw["size"]),
        mode=_integer(raw["mode"]) & 0o7777,
        mtime=_timestamp(raw["mtime"]),
        symlink_target=None if target is None else _text(target),
        # Optional: an agent older than these fields (a workspace started before an upgrade) leaves them out.
        owner=None if raw.get("owner") is None else _text(raw["owner"]),
        group=None if raw.get("group") is None else _text(raw["group"]),
    )


def _integer(value: object) -> int:
    """A non-negative JSON integer of at most 64 bits (``int(inf)`` raises OverflowError, a float is not a size)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
        raise ValueError(f"expected a non-negative integer, got {str(value)[:30]!r}")
    return value


def _timestamp(value: object) -> float:
    """A modification time: a finite number within what ``datetime`` can show (NaN and 1e300 are not times)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not -(2**34) < value < 2**35:
        raise ValueError(f"expected a timestamp, got {str(value)[:30]!r}")
    return float(value)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _paths(result: dict[str, Any]) -> list[str]:
    paths = result["paths"]
    if not isinstance(paths, list):
        raise TypeError("paths is not a list")
    return [_text(p) for p in paths]


def _nothing(result: dict[str, Any]) -> None:
    del result


class ExecGate:
    """At most ``limit`` commands of one workspace run at once; up to ``queue`` more wait; past that, 429.

    Every command costs the sandbox a thread in the agent and processes of its own (under gVisor the pids limit
    counts the sandbox kernel's threads too), so 200 at once could take a workspace down; queued ones cost nothing
    inside it.
    """

    def __init__(self, limit: int, queue: int) -> None:
        self.limit = limit
        self.queue = queue
        self._slots = asyncio.Semaphore(limit)
        self._waiting = 0

    @contextlib.asynccontextmanager
    async def slot(self, workspace_id: str) -> AsyncIterator[None]:
        """Hold one of the workspace's command slots for the duration of the block."""
        if self._slots.locked() and self._waiting >= self.queue:
            raise TooManyRequestsError(
                f"workspace {workspace_id} already runs {self.limit} commands and has {self._waiting} waiting "
                f"(the most it queues is {self.queue}); retry when some have finished",
                details={"id": workspace_id, "running": self.limit, "queued": self._waiting},
            )
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            yield
        finally:
            self._slots.release()


class TunnelSlots:
    """Open connections to ports, per workspace and in all, each capped; past either cap, 429.

    Counted on the host, whatever the agent answers: an agent that ignores its own cap still gets no more tunnels.
    """

    def __init__(self, per_workspace: int, total: int) -> None:
        self.per_workspace = per_workspace
        self.total = total
        self.open: dict[str, int] = {}

    @property
    def in_use(self) -> int:
        """Tunnels open now, in all workspaces."""
        return sum(self.open.values())

    def take(self, workspace_id: str) -> Callable[[], None]:
        """Take a slot for one tunnel into ``workspace_id``; returns what gives it back (calling it twice is harmless).

        Raises:
            TooManyRequestsError: The workspace, or the server, has as many tunnels open as it may.
        """
        held = self.open.get(workspace_id, 0)
        if held >= self.per_workspace:
            raise TooManyRequestsError(
                f"workspace {workspace_id} has {held} connections to its ports open, the most one workspace may "
                "have; retry when some have closed",
                details={"id": workspace_id, "open": held, "limit": self.per_workspace},
            )
        if self.in_use >= self.total:
            raise TooManyRequestsError(
                f"the server has {self.total} connections to ports of workspaces open, the most it keeps; retry when "
                "some have closed",
                details={"id": workspace_id, "limit": self.total},
            )
        self.open[workspace_id] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self.open.get(workspace_id, 0) - 1
            if left > 0:
                self.open[workspace_id] = left
            else:
                self.open.pop(workspace_id, None)

        return release


class AgentBackedProvider:
    """Mixin: the exec and file half of :class:`~corral.providers.base.WorkspaceProvider` over the guest agent.

    It also reports :class:`~corral.providers.base.WorkspaceEvent` to subscribers (``broken`` when an agent breaks
    the protocol; providers add ``died`` from their runtime's events).
    """

    name: str
    output_limit: int = 16 * 1024 * 1024
    max_concurrent_execs: int = 16
    """Commands one workspace runs at once (CORRAL_MAX_CONCURRENT_EXECS)."""
    max_queued_execs: int = 256
    """Commands one workspace keeps waiting beyond those; more answer 429 (CORRAL_MAX_QUEUED_EXECS)."""
    tunnel_slots: ClassVar[TunnelSlots] = TunnelSlots(MAX_TUNNELS_PER_WORKSPACE, MAX_TUNNELS_TOTAL)
    """Open connections to ports: one count for every agent-backed provider of the process, since what they cap is
    the server's memory."""
    agent_answer_timeout_s: float = ANSWER_TIMEOUT_S
    """How long any answer of the agent may take (walks of the whole tree: WALK_TIMEOUT_S) before the connection is
    given up as stuck and the next call starts a fresh agent."""

    # --- what the provider supplies -------------------------------------------------------------------------------

    async def _agent(self, workspace_id: str) -> GuestConnection:
        """A live agent connection for the workspace."""
        raise NotImplementedError

    async def _require_running(self, workspace_id: str) -> None:
        """Raise WorkspaceNotFoundError or WorkspaceStateError unless the workspace runs."""
        raise NotImplementedError

    def _exec_env(self, workspace_id: str, request: ExecRequest) -> dict[str, str]:
        """The environment a command gets on top of the agent's own (default: the request's variables)."""
        del workspace_id
        return dict(request.env)

    # --- events -----------------------------------------------------------------------------------------------------

    def subscribe(self, listener: Callable[[WorkspaceEvent], None]) -> None:
        """Call ``listener`` for every :class:`WorkspaceEvent` this provider sees (see :class:`EventSource`)."""
        self.__dict__.setdefault("_listeners", []).append(listener)

    def _emit(self, event: WorkspaceEvent) -> None:
        for listener in self.__dict__.get("_listeners", []):
            try:
                listener(event)
            except Exception:  # a listener's bug must not break the provider
                log.exception("workspace event listener failed on %s", event)

    def _violation_reporter(self, workspace_id: str) -> Callable[[str], None]:
        """What a :class:`GuestConnection` calls when its agent breaks the protocol: report ``broken``, unless the
        sandbox is dying (a runtime that dies can write its own error text into the stream; that is a death, which
        the runtime's events report)."""

        generation = self._generation(workspace_id)

        def report(reason: str) -> None:
            task = asyncio.get_running_loop().create_task(self._report_violation(workspace_id, reason, generation))
            tasks: set[asyncio.Task[None]] = self.__dict__.setdefault("_violation_tasks", set())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        return report

    async def _report_violation(self, workspace_id: str, reason: str, generation: int) -> None:
        running = await self._still_running_after(workspace_id, VIOLATION_GRACE_S)
        if running and self._generation(workspace_id) == generation:  # not a sandbox restarted meanwhile
            self._emit(WorkspaceEvent(workspace_id, "broken", reason))

    def _generation(self, workspace_id: str) -> int:
        """Which incarnation of the workspace's sandbox runs now (providers that restart sandboxes count them)."""
        del workspace_id
        return 0

    async def _still_running_after(self, workspace_id: str, grace_s: float) -> bool:
        """True when the workspace still runs ``grace_s`` seconds from now (checked every 0.1 s)."""
        deadline = time.monotonic() + grace_s
        while True:
            try:
                await self._require_running(workspace_id)
            except CorralError:
                return False
            if time.monotonic() >= deadline:
                return True
            await asyncio.sleep(0.1)

    def _gate(self, workspace_id: str) -> ExecGate:
        gates: dict[str, ExecGate] = self.__dict__.setdefault("_exec_gates", {})
        gate = gates.get(workspace_id)
        if gate is None:
            gate = gates[workspace_id] = ExecGate(self.max_concurrent_execs, self.max_queued_execs)
        return gate

    def _forget_gate(self, workspace_id: str) -> None:
        self.__dict__.get("_exec_gates", {}).pop(workspace_id, None)

    # --- plumbing ---------------------------------------------------------------------------------------------------

    async def _lost(self, workspace_id: str, exc: GuestConnectionLost | None = None) -> CorralError:
        """After a lost connection: raise the workspace's real state if it is not running, else the error to raise.

        An agent that broke the protocol makes the workspace broken (the connection already reported it). Otherwise
        the runtime may report a dying sandbox as running for a moment after its agent stream broke, so the state is
        polled briefly before the loss is blamed on the agent alone.
        """
        if isinstance(exc, GuestProtocolError):
            if not await self._still_running_after(workspace_id, VIOLATION_GRACE_S):
                await self._require_running(workspace_id)  # raises the state it died into
            return WorkspaceBrokenError(
                f"workspace {workspace_id} is broken: {exc}; resume it to restart it",
                details={"id": workspace_id},
            )
        deadline = time.monotonic() + LOST_STATE_GRACE_S
        while True:
            await self._require_running(workspace_id)
            if time.monotonic() >= deadline:
                return ProviderUnavailableError(self.name, LOST)
            await asyncio.sleep(0.1)

    async def _with_agent(
        self,
        workspace_id: str,
        op: str,
        parse: Callable[[dict[str, Any]], _T],
        *,
        beneath: str | None = None,
        timeout: float | None = None,
        **args: Any,
    ) -> _T:
        """One request to the agent, its answer checked by ``parse``; a lost connection becomes the workspace's real
        state, or one retry; an answer ``parse`` rejects (it comes from inside the workspace) breaks the workspace."""
        for attempt in (1, 2):
            conn = await self._agent(workspace_id)
            try:
                result = await conn.call(op, timeout=timeout, **args, **self._beneath(conn, beneath))
            except GuestConnectionLost as exc:
                error = await self._lost(workspace_id, exc)
                if attempt == 2 or isinstance(error, WorkspaceBrokenError):
                    raise error from None
                continue
            try:
                return parse(result)
            except (KeyError, TypeError, ValueError) as exc:
                reason = f"the agent in workspace {workspace_id} answered {op!r} with a malformed result ({exc})"
                self._violation_reporter(workspace_id)(reason)
                await conn.aclose()
                raise await self._lost(workspace_id, GuestProtocolError(reason)) from None
        raise AssertionError("unreachable")

    # --- exec -------------------------------------------------------------------------------------------------------

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """Run to completion, keeping at most ``output_limit`` bytes of each stream."""
        return await collect_exec(
            self.exec_stream(workspace_id, request), output_limit=self.output_limit, provider=self.name
        )

    async def exec_stream(self, workspace_id: str, request: ExecRequest) -> ExecStream:
        """Yield output as the agent forwards it; the agent kills the process group at the deadline.

        At most :attr:`max_concurrent_execs` commands run per workspace; others wait their turn (up to
        :attr:`max_queued_execs`, then :class:`TooManyRequestsError`).
        """
        request.validate()
        async with self._gate(workspace_id).slot(workspace_id):
            async for event in self._exec_stream(workspace_id, request):
                yield event

    async def exec_in_shell(
        self, workspace_id: str, request: ExecRequest, *, key: str, state_dir: str, command: str
    ) -> ExecResult:
        """Run ``command`` in the agent's persistent shell ``key`` (see :class:`~corral.providers.base.ShellHost`);
        it takes one of the workspace's exec slots, as ``exec`` does."""
        request.validate()
        if "\x00" in command:
            raise InvalidRequestError("command: must not contain a NUL byte", details={"field": "command"})
        conn = await self._agent(workspace_id)
        if "shell" not in conn.features:
            raise ShellUnavailableError(f"the agent of workspace {workspace_id} predates persistent shells")
        shell = {"op": "shell", "key": key, "dir": state_dir, "command": command}
        admitted = False

        async def events() -> ExecStream:
            nonlocal admitted
            async with self._gate(workspace_id).slot(workspace_id):
                admitted = True
                async for event in self._exec_stream(workspace_id, request, shell):
                    yield event

        try:
            return await collect_exec(events(), output_limit=self.output_limit, provider=self.name)
        except TooManyRequestsError as exc:
            if not admitted:
                raise  # the workspace's exec queue is full: a plain exec would be refused as well
            # Every shell the agent keeps is running a command: this one runs in a shell of its own.
            raise ShellUnavailableError(exc.message) from None

    async def _exec_stream(
        self, workspace_id: str, request: ExecRequest, shell: dict[str, str] | None = None
    ) -> ExecStream:
        conn = await self._agent(workspace_id)
        frames: AsyncGenerator[tuple[dict[str, Any], bytes]] = conn.exec(
            request.argv(),
            cwd=request.cwd,
            env=self._exec_env(workspace_id, request),
            timeout_s=request.timeout_s,
            **self._user(conn, "user", request.user),
            **(shell or {}),
        )
        deadline = None if request.timeout_s is None else time.monotonic() + request.timeout_s + EXEC_GRACE_S
        try:
            while True:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                try:
                    header, payload = await asyncio.wait_for(anext(frames), remaining)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise ExecTimeoutError(
                        f"command did not finish within {request.timeout_s:g} s and the workspace did not confirm "
                        "the kill"
                    ) from None
                except GuestConnectionLost as exc:
                    raise await self._lost(workspace_id, exc) from None
                if header.get("ev") == "out":
                    yield ExecOutput("stdout" if header.get("fd") == 1 else "stderr", payload)
                elif header.get("ev") == "exit":
                    if header.get("timed_out"):
                        raise ExecTimeoutError(
                            f"command did not finish within {request.timeout_s:g} s; it was killed",
                            duration_ms=_duration(header),
                        )
                    try:
                        status = _exit_status(header)
                    except GuestProtocolError as exc:
                        reason = f"the agent in workspace {workspace_id} sent {exc}"
                        self._violation_reporter(workspace_id)(reason)
                        await conn.aclose()
                        raise await self._lost(workspace_id, GuestProtocolError(reason)) from None
                    yield ExecExit(*status)
        finally:
            await frames.aclose()

    # --- terminals --------------------------------------------------------------------------------------------------

    async def open_pty(self, workspace_id: str, request: PtyRequest) -> AgentPty:
        """Start a command on a new pseudo-terminal in the agent (see :class:`~corral.providers.base.PtyHost`).

        A terminal does not take one of the workspace's exec slots: it lives as long as its user types into it.
        """
        request.validate()
        conn = await self._agent(workspace_id)
        if "pty" not in conn.features:
            raise InvalidRequestError(
                f"the agent of workspace {workspace_id} predates terminals; stop and resume the workspace to "
                "upgrade it",
                details={"capability": "pty"},
            )
        env = self._exec_env(workspace_id, ExecRequest(request.argv[0], env=request.env))
        try:
            terminal = await conn.open_pty(
                list(request.argv),
                cwd=request.cwd,
                env=env,
                rows=request.rows,
                cols=request.cols,
                timeout_s=request.timeout_s,
                **self._user(conn, "user", request.user),
            )
        except GuestConnectionLost as exc:
            raise await self._lost(workspace_id, exc) from None
        return AgentPty(self, workspace_id, terminal, request.timeout_s)

    # --- ports ------------------------------------------------------------------------------------------------------

    async def open_port(self, workspace_id: str, port: int) -> AgentPortStream:
        """Connect to ``port`` on the workspace's loopback through its agent (see
        :class:`~corral.providers.base.PortTunnel`): no network needed, the agent relays the bytes.

        Like a terminal, a connection takes none of the workspace's exec slots; each holds one of the agent's
        worker threads while it is open, and one of :attr:`tunnel_slots` (TooManyRequestsError past its caps). One
        that carries no byte either way for :data:`~corral.guest.client.TUNNEL_IDLE_S` is closed.
        """
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidRequestError(f"port must be a number from 1 to 65535, got {port!r}", details={"port": port})
        conn = await self._agent(workspace_id)
        if "tunnel_window" not in conn.features:  # an agent of the first tunnels sends a window the host refuses
            raise InvalidRequestError(
                f"the agent of workspace {workspace_id} predates port tunnels; stop and resume the workspace to "
                "upgrade it",
                details={"capability": "port_tunnel"},
            )
        release = self.tunnel_slots.take(workspace_id)
        try:
            tunnel = await conn.open_tunnel(port, on_close=release)
        except GuestConnectionLost as exc:
            release()
            raise await self._lost(workspace_id, exc) from None
        except BaseException:
            release()
            raise
        return AgentPortStream(self, workspace_id, tunnel)

    # --- files ------------------------------------------------------------------------------------------------------
    #
    # With ``beneath`` the agent resolves every path one component at a time from a descriptor of that directory and
    # never lets the kernel follow a symlink (see :class:`corral.guest.agent.Beneath`), so confinement holds even
    # while a process in the workspace swaps directories for symlinks.

    def _beneath(self, conn: GuestConnection, beneath: str | None) -> dict[str, str]:
        """The request field that confines a file operation, once the agent is known to honour it."""
        if beneath is None:
            return {}
        if "beneath" not in conn.features:
            # An agent that predates it would ignore the field and use the path unconfined.
            raise ProviderUnavailableError(
                self.name, "the workspace agent is too old to confine file paths; stop and resume the workspace"
            )
        return {"beneath": check_path(beneath, field_name="beneath")}

    def _user(self, conn: GuestConnection, field_name: str, user: str | None) -> dict[str, str]:
        """The request field that names a workspace user, once the agent is known to honour it."""
        if user is None:
            return {}
        check_user(user, field_name=field_name)
        if "user" not in conn.features:
            # An agent that predates it would ignore the field and run as root.
            raise ProviderUnavailableError(
                self.name, "the workspace agent is too old to act as a user; stop and resume the workspace"
            )
        return {field_name: user}

    async def read_file(self, workspace_id: str, path: str, *, beneath: str | None = None) -> ByteStream:
        """Open for streaming; missing files raise WorkspaceFileNotFoundError before the first chunk."""
        path = check_path(path)
        conn = await self._agent(workspace_id)
        try:
            return await conn.open_read(path, **self._beneath(conn, beneath))
        except GuestConnectionLost as exc:
            raise await self._lost(workspace_id, exc) from None

    async def watch_dir(self, workspace_id: str, path: str, *, recursive: bool = False) -> DirEventStream:
        """Watch a directory with the agent's inotify (see :class:`~corral.providers.base.DirWatcher`).

        A watch holds no exec slot; its events are flow-controlled like a read, so an unread watch costs the host at
        most one window of data (the agent drops the oldest events beyond its own cap and counts them).
        """
        path = check_path(path)
        conn = await self._agent(workspace_id)
        if "watch" not in conn.features:
            raise InvalidRequestError(
                f"the agent of workspace {workspace_id} predates directory watches; stop and resume the workspace to "
                "upgrade it",
                details={"capability": "dir_watch"},
            )
        try:
            batches = await conn.open_watch(path, recursive=recursive)
        except GuestConnectionLost as exc:
            raise await self._lost(workspace_id, exc) from None
        return self._dir_events(workspace_id, batches)

    async def _dir_events(self, workspace_id: str, batches: AsyncGenerator[WatchBatch]) -> DirEventStream:
        logged, total = 0.0, 0
        try:
            async for events, dropped in batches:
                total += dropped
                if dropped and time.monotonic() - logged >= WATCH_LOG_INTERVAL_S:  # the workspace sets the pace
                    logged = time.monotonic()
                    log.warning("watch in workspace %s fell behind: %d events dropped so far", workspace_id, total)
                for index, (name, kind) in enumerate(events):
                    yield DirEvent(name, cast("DirEventType", kind), dropped if index == 0 else 0)
        except GuestConnectionLost as exc:
            raise await self._lost(workspace_id, exc) from None
        finally:
            await batches.aclose()

    async def write_file(
        self,
        workspace_id: str,
        path: str,
        data: bytes | AsyncIterable[bytes],
        *,
        mode: int | None = None,
        beneath: str | None = None,
        owner: str | None = None,
    ) -> int:
        """Stream into the file, creating parents; with ``owner`` the file then belongs to that user."""
        path = check_path(path)
        conn = await self._agent(workspace_id)
        try:
            return await conn.write(
                path, data, mode=mode, **self._beneath(conn, beneath), **self._user(conn, "owner", owner)
            )
        except GuestConnectionLost as exc:
            raise await self._lost(workspace_id, exc) from None

    async def list_dir(self, workspace_id: str, path: str, *, beneath: str | None = None) -> list[FileInfo]:
        """Directory entries, sorted by name."""
        return await self._with_agent(
            workspace_id,
            "list",
            lambda result: [file_info_from_json(e) for e in result["entries"]],
            path=check_path(path),
            beneath=beneath,
        )

    async def delete(
        self, workspace_id: str, path: str, *, recursive: bool = False, beneath: str | None = None
    ) -> None:
        """Remove a file or directory."""
        await self._with_agent(
            workspace_id, "delete", _nothing, path=check_path(path), recursive=recursive, beneath=beneath
        )

    async def move(self, workspace_id: str, src: str, dst: str, *, beneath: str | None = None) -> None:
        """Rename, creating the destination's parents."""
        await self._with_agent(
            workspace_id,
            "move",
            _nothing,
            src=check_path(src, field_name="src"),
            dst=check_path(dst, field_name="dst"),
            beneath=beneath,
        )

    async def chmod(self, workspace_id: str, path: str, mode: int, *, beneath: str | None = None) -> None:
        """Set permission bits."""
        await self._with_agent(workspace_id, "chmod", _nothing, path=check_path(path), mode=mode, beneath=beneath)

    async def stat(self, workspace_id: str, path: str, *, beneath: str | None = None) -> FileInfo:
        """lstat of one path."""
        return await self._with_agent(workspace_id, "stat", file_info_from_json, path=check_path(path), beneath=beneath)

    async def glob(
        self,
        workspace_id: str,
        pattern: str,
        *,
        root: str = WORKSPACE_ROOT,
        limit: int = 10_000,
        beneath: str | None = None,
    ) -> list[str]:
        """Matching absolute paths, sorted; with ``beneath``, symlinks are matched but never walked into."""
        if not pattern or "\x00" in pattern:
            raise InvalidRequestError("pattern: must be a non-empty glob pattern", details={"field": "pattern"})
        return await self._with_agent(
            workspace_id,
            "glob",
            _paths,
            pattern=pattern,
            root=check_path(root),
            limit=limit,
            beneath=beneath,
            timeout=WALK_TIMEOUT_S,
        )

    async def realpath(self, workspace_id: str, path: str, *, beneath: str | None = None) -> str:
        """Symlinks resolved inside the workspace."""
        return await self._with_agent(
            workspace_id, "realpath", lambda result: _text(result["path"]), path=check_path(path), beneath=beneath
        )

    async def disk_usage(self, workspace_id: str) -> int:
        """Bytes used under /workspace, counted without following a symlink out of it."""
        return await self._with_agent(
            workspace_id,
            "usage",
            lambda result: int(result["bytes"]),
            path=WORKSPACE_ROOT,
            beneath=WORKSPACE_ROOT,
            timeout=WALK_TIMEOUT_S,
        )


class AgentPty:
    """A command on a pseudo-terminal in a workspace's agent (a :class:`~corral.providers.base.PtySession`)."""

    def __init__(
        self, provider: AgentBackedProvider, workspace_id: str, terminal: GuestTerminal, timeout_s: float | None
    ) -> None:
        self._provider = provider
        self._workspace_id = workspace_id
        self._terminal = terminal
        self._timeout_s = timeout_s

    async def events(self) -> ExecStream:
        """What the terminal shows, then the exit; closing this early kills the command."""
        try:
            async for header, payload in self._terminal.frames():
                if header.get("ev") == "out":
                    yield ExecOutput("stdout", payload)
                elif header.get("ev") == "exit":
                    if header.get("timed_out"):
                        raise ExecTimeoutError(
                            f"terminal command did not finish within {self._timeout_s:g} s; it was killed",
                            duration_ms=_duration(header),
                        )
                    try:
                        status = _exit_status(header)
                    except GuestProtocolError as exc:
                        raise await self._provider._lost(self._workspace_id, exc) from None
                    yield ExecExit(*status)
        except GuestConnectionLost as exc:
            raise await self._provider._lost(self._workspace_id, exc) from None
        finally:
            await self._terminal.aclose()

    async def write(self, data: bytes) -> None:
        """Type ``data`` into the terminal."""
        await self._call(self._terminal.write(data))

    async def resize(self, rows: int, cols: int) -> None:
        """Change the terminal's size."""
        PtyRequest(rows=rows, cols=cols).validate()
        await self._call(self._terminal.resize(rows, cols))

    async def kill(self) -> None:
        """Kill the command's process group; :meth:`events` then ends with its exit."""
        await self._call(self._terminal.kill())

    async def _call(self, call: Awaitable[None]) -> None:
        try:
            await call
        except GuestConnectionLost as exc:
            raise await self._provider._lost(self._workspace_id, exc) from None


class AgentPortStream:
    """A connection to a port inside a workspace, relayed by its agent (a :class:`~corral.providers.base.PortStream`).

    A lost agent connection is raised as the workspace's real state (see :meth:`AgentBackedProvider._lost`).
    """

    def __init__(self, provider: AgentBackedProvider, workspace_id: str, tunnel: GuestTunnel) -> None:
        self._provider = provider
        self._workspace_id = workspace_id
        self._tunnel = tunnel

    async def read(self) -> bytes:
        """The server's next bytes; ``b""`` once it has shut its side."""
        try:
            return await self._tunnel.read()
        except GuestConnectionLost as exc:
            raise await self._provider._lost(self._workspace_id, exc) from None

    async def write(self, data: bytes) -> None:
        """Send ``data``, as fast as the server takes it."""
        await self._call(self._tunnel.write(data))

    async def write_eof(self) -> None:
        """Shut the sending side."""
        await self._call(self._tunnel.write_eof())

    async def aclose(self) -> None:
        """Close the connection (the agent closes its socket)."""
        await self._tunnel.aclose()

    async def _call(self, call: Awaitable[None]) -> None:
        try:
            await call
        except GuestConnectionLost as exc:
            raise await self._provider._lost(self._workspace_id, exc) from None
