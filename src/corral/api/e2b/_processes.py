"""Commands started through envd's ``process.Process`` service, tracked per sandbox on top of the provider contract.

The provider contract offers one primitive for commands: ``exec_stream``, whose iterator kills the command when it
is closed early. envd offers more, and this module builds it from that primitive and from the file operations:

* **pids.** envd reports the command's Linux pid. A provider does not, so every command gets a pid from a counter
  of this server (unique across sandboxes). ``List``, ``Connect``, ``SendSignal`` and ``SendInput`` address it.
* **several listeners.** A pump task reads ``exec_stream`` and hands each event to every current subscriber (the
  ``Start`` stream, and any ``Connect`` stream). As with envd, a command keeps running when its listeners go away,
  and a listener that connects later sees the output from then on. A slow listener slows the command's output
  (backpressure) rather than growing memory.
* **signals.** ``SIGKILL`` closes the pump's stream, which makes the provider kill the command's process group.
  ``SIGTERM`` is delivered by a short ``kill`` run in the sandbox to every process whose *initial* environment holds
  the command's marker variable (``CORRAL_E2B_PROCESS=<token>``), i.e. the command and all its descendants that
  kept their environment (the scan repeats until it finds no new one, so children forked meanwhile are caught).
  envd signals only the command itself; signalling its descendants too is the one difference, and it leaves no
  orphans. A command that ignores SIGTERM keeps running, as it would under envd.
* **stdin.** Provider commands run with stdin from ``/dev/null``. A command started with ``stdin: true`` is wrapped in
  a small ``sh`` script that feeds it through a FIFO from numbered chunk files in ``/tmp/.corral-e2b-stdin/<token>``:
  ``SendInput`` writes the next chunk (write, then rename, so the reader never sees half a chunk) and
  ``CloseStdin`` writes an ``eof`` marker, after which the command reads end-of-file. The reader polls every 20 ms.
* **PTYs.** ``Start`` with ``pty`` opens the command on a pseudo-terminal through the provider's
  :class:`~corral.providers.base.PtyHost` (the guest agent's ``pty``): its output is sent as ``data.pty``, ``SendInput``
  types into the terminal, ``Update`` resizes it, and ``SendSignal`` SIGKILL kills it; listeners, pids and
  ``Connect`` work as for any command.
* **deadlines.** ``Connect-Timeout-Ms`` on ``Start`` becomes the exec deadline, so the provider kills the command
  when the client's ``timeout`` passes, and the stream ends with ``deadline_exceeded``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import signal as signals
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.api.e2b._connect import ConnectCode, ConnectError, b64encode
from corral.errors import CorralError, ExecTimeoutError
from corral.providers.base import (
    ExecMode,
    ExecOutput,
    ExecRequest,
    ExecStream,
    PtyRequest,
    PtySession,
    WorkspaceCalls,
)

__all__ = ["MARKER_ENV", "ProcessRegistry", "Subscriber", "TrackedProcess"]

log = logging.getLogger(__name__)

MARKER_ENV = "CORRAL_E2B_PROCESS"
"""Set in every command's environment; its value identifies the command for SIGTERM."""

STDIN_ROOT = "/tmp/.corral-e2b-stdin"  # noqa: S108 - a directory inside the sandbox, not on the host
SUBSCRIBER_QUEUE_LIMIT = 64
"""Events a listener may lag behind before the command's output waits for it."""

_STDIN_WRAPPER = r"""d=$1; shift
mkdir -p "$d" && mkfifo "$d/in" || exit 125
(
  i=0
  while :; do
    if [ -f "$d/$i" ]; then cat "$d/$i" && rm -f "$d/$i"; i=$((i+1))
    elif [ -e "$d/eof" ]; then exit 0
    else sleep 0.02; fi
  done
) >"$d/in" 2>/dev/null &
r=$!
"$@" <"$d/in"
c=$?
kill "$r" 2>/dev/null
rm -rf "$d"
exit "$c"
"""

# Signal every process whose initial environment holds the marker; scan again until a pass finds none not yet
# signalled, so children forked while the first pass ran are caught too (a process that ignores the signal is not
# signalled twice, which ends the loop).
_SIGNAL_SCRIPT = r"""seen=" "
while :; do
  new=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$seen" in *" $p "*) continue ;; esac
    if grep -qzx "$1" "$d/environ" 2>/dev/null; then kill -s "$2" "$p" 2>/dev/null; seen="$seen$p "; new=1; fi
  done
  [ "$new" = 0 ] && exit 0
done
"""

Event = dict[str, Any]
"""A ``process.ProcessEvent`` in protobuf JSON: ``{"start": ...}``, ``{"data": ...}``, ``{"end": ...}``."""


class Subscriber:
    """One listener of a command's events; the last item is an ``end`` event or a :class:`ConnectError`."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Event | ConnectError] = asyncio.Queue()
        self._space = asyncio.Event()
        self._space.set()
        self.closed = False

    async def offer(self, item: Event) -> None:
        """Queue an event, waiting while the listener lags too far behind."""
        while not self.closed and self._queue.qsize() >= SUBSCRIBER_QUEUE_LIMIT:
            self._space.clear()
            await self._space.wait()
        if not self.closed:
            self._queue.put_nowait(item)

    def finish(self, item: Event | ConnectError) -> None:
        """Queue the final item without waiting."""
        if not self.closed:
            self._queue.put_nowait(item)

    async def next(self, timeout_s: float | None) -> Event | ConnectError | None:
        """The next item, or None when nothing came within ``timeout_s`` (time for a keepalive)."""
        # An item already queued (the usual case: the command's end follows its output) is taken at once, and a
        # wait uses a timeout scope, not wait_for, which wraps every wait in a task of its own.
        try:
            if self._queue.empty():
                async with asyncio.timeout(timeout_s):
                    item = await self._queue.get()
            else:
                item = self._queue.get_nowait()
        except TimeoutError:
            return None
        self._space.set()
        return item

    def close(self) -> None:
        """Stop listening; the command goes on."""
        self.closed = True
        self._space.set()


@dataclass(eq=False)
class TrackedProcess:
    """A command started through ``process.Process/Start`` that has not ended yet."""

    pid: int
    sandbox_id: str
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str | None
    tag: str | None
    token: str
    stdin_dir: str | None
    subscribers: list[Subscriber] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    signal: int | None = None
    stdin_seq: int = 0
    stdin_closed: bool = False
    stdin_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    terminal: PtySession | None = None
    """The command's pseudo-terminal, for one started with ``pty``."""

    def subscribe(self) -> Subscriber:
        """A new listener for the events from now on."""
        subscriber = Subscriber()
        self.subscribers.append(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Remove a listener (its stream ended or its client went away)."""
        subscriber.close()
        with contextlib.suppress(ValueError):
            self.subscribers.remove(subscriber)

    def to_json(self) -> dict[str, Any]:
        """``process.ProcessInfo``."""
        config: dict[str, Any] = {"cmd": self.cmd, "args": self.args, "envs": self.envs}
        if self.cwd is not None:
            config["cwd"] = self.cwd
        info: dict[str, Any] = {"config": config, "pid": self.pid}
        if self.tag is not None:
            info["tag"] = self.tag
        return info

    async def broadcast(self, item: Event) -> None:
        """Hand an event to every listener."""
        for subscriber in list(self.subscribers):
            await subscriber.offer(item)

    def finish(self, item: Event | ConnectError) -> None:
        """Hand the final item to every listener."""
        for subscriber in list(self.subscribers):
            subscriber.finish(item)


def end_event(exit_code: int, signal: int | None) -> Event:
    """``ProcessEvent.EndEvent`` as envd reports it (Go's ``ProcessState``: -1 and ``signal: killed`` if signalled)."""
    if signal is not None and exit_code in (128 + signal, -signal):
        name = {signals.SIGKILL: "killed", signals.SIGTERM: "terminated"}.get(signals.Signals(signal), str(signal))
        return {"end": {"exitCode": -1, "exited": False, "status": f"signal: {name}"}}
    return {"end": {"exitCode": exit_code, "exited": True, "status": f"exit status {exit_code}"}}


def connect_error_for(exc: CorralError) -> ConnectError:
    """A Corral error met while a command runs, as an RPC error."""
    if isinstance(exc, ExecTimeoutError):
        return ConnectError(ConnectCode.DEADLINE_EXCEEDED, "the command passed its timeout and was killed")
    return ConnectError(ConnectCode.UNAVAILABLE, f"the command's sandbox failed: {exc.message}")


class ProcessRegistry:
    """Every running command started through envd's process service, by sandbox and pid."""

    def __init__(self) -> None:
        self._processes: dict[tuple[str, int], TrackedProcess] = {}
        self._pids = itertools.count(1000)

    def running(self, sandbox_id: str) -> list[TrackedProcess]:
        """The sandbox's running commands, oldest first."""
        return [p for (sid, _), p in sorted(self._processes.items()) if sid == sandbox_id]

    def find(self, sandbox_id: str, selector: Mapping[str, Any] | None) -> TrackedProcess:
        """The command a ``process.ProcessSelector`` (``{"pid": n}`` or ``{"tag": t}``) names.

        Raises:
            ConnectError: ``not_found`` (envd's answer for a finished or unknown command) or ``invalid_argument``.
        """
        if not selector:
            raise ConnectError(ConnectCode.INVALID_ARGUMENT, "process: a selector with pid or tag is required")
        if "pid" in selector:
            try:
                pid = int(selector["pid"])
            except (TypeError, ValueError):
                raise ConnectError(ConnectCode.INVALID_ARGUMENT, "process.pid: must be an integer") from None
            process = self._processes.get((sandbox_id, pid))
            if process is None:
                raise ConnectError(ConnectCode.NOT_FOUND, f"process with pid {pid} not found")
            return process
        if "tag" in selector:
            for process in self.running(sandbox_id):
                if process.tag == selector["tag"]:
                    return process
            raise ConnectError(ConnectCode.NOT_FOUND, f"process with tag {selector['tag']!r} not found")
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "process: a selector with pid or tag is required")

    def start(
        self,
        sandbox_id: str,
        provider: WorkspaceCalls,
        *,
        cmd: str,
        args: list[str],
        envs: dict[str, str],
        base_env: Mapping[str, str],
        cwd: str | None,
        workdir: str,
        tag: str | None,
        stdin: bool,
        deadline_s: float | None,
        user: str | None = None,
    ) -> tuple[TrackedProcess, Subscriber]:
        """Start a command and return it with a listener subscribed before its first output.

        Raises:
            InvalidRequestError: the command cannot be run (empty, NUL bytes, bad variable names).
        """
        token = secrets.token_hex(8)
        process = TrackedProcess(
            pid=next(self._pids),
            sandbox_id=sandbox_id,
            cmd=cmd,
            args=list(args),
            envs=dict(envs),
            cwd=cwd,
            tag=tag,
            token=token,
            stdin_dir=f"{STDIN_ROOT}/{token}" if stdin else None,
        )
        argv = [cmd, *args]
        if process.stdin_dir is not None:
            argv = ["/bin/sh", "-c", _STDIN_WRAPPER, "corral-stdin", process.stdin_dir, *argv]
        request = ExecRequest(
            command=argv[0],
            args=tuple(argv[1:]),
            mode=ExecMode.ARGV,
            cwd=workdir,
            env={**base_env, **envs, MARKER_ENV: token},
            timeout_s=None if deadline_s is None else min(deadline_s, 24 * 3600),
            user=user,
        )
        request.validate()
        subscriber = process.subscribe()
        self._processes[(sandbox_id, process.pid)] = process
        process.task = asyncio.create_task(self._run(process, provider, request), name=f"e2b-process-{process.pid}")
        return process, subscriber

    async def start_pty(
        self,
        sandbox_id: str,
        provider: WorkspaceCalls,
        *,
        cmd: str,
        args: list[str],
        envs: dict[str, str],
        base_env: Mapping[str, str],
        cwd: str | None,
        workdir: str,
        tag: str | None,
        rows: int,
        cols: int,
        deadline_s: float | None,
        user: str | None = None,
    ) -> tuple[TrackedProcess, Subscriber]:
        """Start a command on a pseudo-terminal of ``rows`` x ``cols`` and return it with a listener.

        Raises:
            InvalidRequestError: the command cannot be run, or the sandbox's provider has no terminals.
        """
        open_pty = getattr(provider, "open_pty", None)
        if open_pty is None:
            raise ConnectError(ConnectCode.UNIMPLEMENTED, "this sandbox's provider cannot open PTYs")
        token = secrets.token_hex(8)
        request = PtyRequest(
            argv=(cmd, *args),
            cwd=workdir,
            env={**base_env, **envs, MARKER_ENV: token},
            rows=rows,
            cols=cols,
            timeout_s=None if deadline_s is None else min(deadline_s, 24 * 3600),
            user=user,
        )
        request.validate()
        terminal: PtySession = await open_pty(sandbox_id, request)
        process = TrackedProcess(
            pid=next(self._pids),
            sandbox_id=sandbox_id,
            cmd=cmd,
            args=list(args),
            envs=dict(envs),
            cwd=cwd,
            tag=tag,
            token=token,
            stdin_dir=None,
            terminal=terminal,
        )
        subscriber = process.subscribe()
        self._processes[(sandbox_id, process.pid)] = process
        process.task = asyncio.create_task(self._pump(process, terminal.events()), name=f"e2b-pty-{process.pid}")
        return process, subscriber

    async def resize(self, process: TrackedProcess, rows: int, cols: int) -> None:
        """Change a PTY's size.

        Raises:
            ConnectError: ``failed_precondition`` when the command has no PTY.
        """
        if process.terminal is None:
            raise ConnectError(ConnectCode.FAILED_PRECONDITION, f"process {process.pid} was started without a PTY")
        await process.terminal.resize(rows, cols)

    async def _run(self, process: TrackedProcess, provider: WorkspaceCalls, request: ExecRequest) -> None:
        if process.stdin_dir is not None and request.user not in (None, "root"):
            # The command's own user makes its FIFO in the stdin directory, which root (this server's file writes)
            # may already have created for early input: make it, or take it over, for that user first.
            owned = ExecRequest(
                command="/bin/sh",
                args=("-c", 'mkdir -p -- "$1" && chown -- "$2:" "$1"', "sh", process.stdin_dir, str(request.user)),
                mode=ExecMode.ARGV,
                timeout_s=30,
            )
            with contextlib.suppress(CorralError):  # the wrapper then fails with 125, which the client hears
                await provider.exec(process.sandbox_id, owned)
        await self._pump(process, provider.exec_stream(process.sandbox_id, request))

    async def _pump(self, process: TrackedProcess, stream: ExecStream) -> None:
        final: Event | ConnectError = ConnectError(ConnectCode.INTERNAL, "the command ended without an exit status")
        key = "pty" if process.terminal is not None else None
        try:
            async for event in stream:
                if isinstance(event, ExecOutput):
                    await process.broadcast({"data": {key or event.stream: b64encode(event.data)}})
                else:
                    final = end_event(event.exit_code, process.signal)
                    break
        except asyncio.CancelledError:
            if process.signal == signals.SIGKILL:
                final = end_event(128 + signals.SIGKILL, process.signal)
            else:
                final = ConnectError(ConnectCode.UNAVAILABLE, "the sandbox was stopped while the command ran")
                raise
        except CorralError as exc:
            final = connect_error_for(exc)
        except Exception as exc:
            log.exception("e2b: command %d in sandbox %s failed", process.pid, process.sandbox_id)
            final = ConnectError(ConnectCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        finally:
            self._processes.pop((process.sandbox_id, process.pid), None)
            process.finish(final)
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def signal(self, process: TrackedProcess, provider: WorkspaceCalls, signum: int) -> None:
        """Deliver SIGKILL (by closing the command's stream) or SIGTERM (by marker, see the module docstring)."""
        process.signal = signum
        if signum == signals.SIGKILL:
            task = process.task
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            return
        request = ExecRequest(
            "/bin/sh",
            ("-c", _SIGNAL_SCRIPT, "corral-signal", f"{MARKER_ENV}={process.token}", signals.Signals(signum).name[3:]),
            mode=ExecMode.ARGV,
            cwd="/",
            timeout_s=30,
        )
        await provider.exec(process.sandbox_id, request)

    async def send_input(self, process: TrackedProcess, provider: WorkspaceCalls, data: bytes) -> None:
        """Queue bytes for the command's stdin.

        Raises:
            ConnectError: ``failed_precondition`` when the command was started without stdin, or stdin is closed.
        """
        if process.terminal is not None:
            await process.terminal.write(data)
            return
        directory = self._stdin_dir(process)
        async with process.stdin_lock:
            seq = process.stdin_seq
            process.stdin_seq += 1
            await provider.write_file(process.sandbox_id, f"{directory}/.part{seq}", data)
            await provider.move(process.sandbox_id, f"{directory}/.part{seq}", f"{directory}/{seq}")

    async def close_stdin(self, process: TrackedProcess, provider: WorkspaceCalls) -> None:
        """Let the command read end-of-file once it has read everything sent so far."""
        directory = self._stdin_dir(process)
        async with process.stdin_lock:
            process.stdin_closed = True
            await provider.write_file(process.sandbox_id, f"{directory}/eof", b"")

    @staticmethod
    def _stdin_dir(process: TrackedProcess) -> str:
        if process.stdin_dir is None:
            raise ConnectError(
                ConnectCode.FAILED_PRECONDITION, f"process {process.pid} was started without stdin (stdin=False)"
            )
        if process.stdin_closed:
            raise ConnectError(ConnectCode.FAILED_PRECONDITION, f"the stdin of process {process.pid} is closed")
        return process.stdin_dir

    async def forget(self, sandbox_id: str) -> None:
        """Stop tracking a sandbox's commands (it is being killed or paused); their listeners get an error."""
        await self._cancel([p for (sid, _), p in self._processes.items() if sid == sandbox_id])

    async def aclose(self) -> None:
        """Stop every pump (server shutdown): the commands are killed, their listeners get an error."""
        await self._cancel(list(self._processes.values()))

    @staticmethod
    async def _cancel(processes: list[TrackedProcess]) -> None:
        tasks = [p.task for p in processes if p.task is not None and not p.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_events(
    process: TrackedProcess, subscriber: Subscriber, *, keepalive_s: float | None, deadline_s: float | None
) -> AsyncGenerator[Event | ConnectError, None]:
    """A listener's items for one RPC stream: the start event, then events (with keepalives) up to the last one."""
    yield {"start": {"pid": process.pid}}
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    try:
        while True:
            wait = keepalive_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    yield ConnectError(ConnectCode.DEADLINE_EXCEEDED, "the stream passed its timeout")
                    return
                wait = left if wait is None else min(wait, left)
            item = await subscriber.next(wait)
            if item is None:
                if deadline is None or time.monotonic() < deadline:
                    yield {"keepalive": {}}
                continue
            yield item
            if isinstance(item, ConnectError) or "end" in item:
                return
    finally:
        process.unsubscribe(subscriber)
