"""The provider contract: what every backend (Firecracker, gVisor, Docker, E2B, HTTP, fake) implements.

A provider knows *where a workspace lives* and *how to reach it*; it knows nothing of agent types, sessions or the
HTTP API. The orchestrator hands it a :class:`WorkspaceSpec` with an id Corral chose, and from then on addresses the
workspace by that id. Values crossing the boundary are frozen dataclasses; errors are those of :mod:`corral.errors`.

Behaviour every provider guarantees (checked by :mod:`corral.testing.conformance`):

* ``create`` returns when the workspace can run commands; ``destroy`` is idempotent; after ``destroy`` every exec
  and file call raises :class:`~corral.errors.WorkspaceNotFoundError` or
  :class:`~corral.errors.WorkspaceDestroyedError`.
* ``stop`` keeps everything under ``/workspace``; ``resume`` brings the workspace back with that state.
* ``exec`` in ``shell`` mode runs ``/bin/sh -c`` with the arguments shell-quoted; in ``argv`` mode no shell is ever
  involved. A nonzero exit is a result; a deadline kills the process group and raises
  :class:`~corral.errors.ExecTimeoutError` carrying the partial output.
* File operations take absolute paths inside the sandbox (relative ones are taken from ``/workspace``);
  ``write_file`` creates missing parents; reads and writes stream, so a 10 MB file is never held twice.
* Given ``beneath`` (a directory, ``/workspace`` for the API and the tools), a file operation cannot reach outside
  it: a path outside it, a symlink leading out or a ``..`` climbing above it raises
  :class:`~corral.errors.InvalidRequestError` (naming the path and saying it leads outside), and symlinks inside
  it are followed. Agent-backed providers guarantee this race-free (a process in the sandbox swapping a directory
  for a symlink meanwhile changes nothing); remote providers check first and then act, which is best effort.
* ``health`` is fast and has no side effects.
"""

from __future__ import annotations

import contextlib
import enum
import posixpath
import shlex
import time
import warnings
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from corral.egress.policy import EgressPolicy
from corral.errors import ExecTimeoutError, InvalidRequestError, ProviderUnavailableError
from corral.streams import ByteStream
from corral.values import (
    WORKSPACE_ROOT,
    ContainerType,
    NetworkMode,
    ResourceLimits,
    parse_cpu,
    parse_size,
)

__all__ = [
    "WORKSPACE_ROOT",
    "ByteStream",
    "Capabilities",
    "DeathWatcher",
    "DirEvent",
    "DirEventStream",
    "DirEventType",
    "DirWatcher",
    "DiskUsageReporter",
    "EgressControl",
    "EventSource",
    "ExecExit",
    "ExecMode",
    "ExecOutput",
    "ExecRequest",
    "ExecResult",
    "ExecStream",
    "FileInfo",
    "Health",
    "NetworkMode",
    "Persistence",
    "PortDialer",
    "PortStream",
    "PortTunnel",
    "PtyHost",
    "PtyRequest",
    "PtySession",
    "ResourceLimits",
    "ResourceUsage",
    "ResourceUsageReporter",
    "Retention",
    "ShellHost",
    "ShellUnavailableError",
    "SnapshotInfo",
    "Snapshotter",
    "WorkspaceCalls",
    "WorkspaceEvent",
    "WorkspaceProvider",
    "WorkspaceSpec",
    "WorkspaceState",
    "check_beneath",
    "check_path",
    "check_user",
    "collect_exec",
    "escape_error",
    "lies_beneath",
    "parse_cpu",
    "parse_size",
]


Persistence = Literal["full", "workspace", "none"]
Retention = Literal["memory", "filesystem", "none"]


class ExecMode(enum.StrEnum):
    """How ``ExecRequest.command`` and ``args`` become a process."""

    SHELL = "shell"
    """``/bin/sh -c 'command arg1 arg2'`` with every arg shell-quoted."""
    ARGV = "argv"
    """``command`` is executed directly with ``args`` as literal arguments; no shell is ever involved."""


class WorkspaceState(enum.StrEnum):
    """What the runtime says about a workspace, as seen by ``WorkspaceProvider.state``."""

    RUNNING = "running"
    STOPPED = "stopped"
    PAUSED = "paused"
    """Stopped with its processes and memory checkpointed: ``resume`` brings them back."""
    MISSING = "missing"


# --- workspace spec -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkspaceSpec:
    """Everything a provider needs to create one workspace. ``id`` is chosen by Corral, not by the provider."""

    id: str
    image: str
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    network: NetworkMode = "isolated"
    container_type: ContainerType = "agent_workspace"
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


# --- exec ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """One command to run in a workspace."""

    command: str
    args: tuple[str, ...] = ()
    mode: ExecMode = ExecMode.SHELL
    cwd: str = WORKSPACE_ROOT
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    """Deadline for the whole command; ``None`` means the provider's default (no deadline for streams)."""
    user: str | None = None
    """The workspace user (a name in its /etc/passwd) to run as, with that user's HOME, USER and LOGNAME;
    ``None``: the workspace's default (root)."""

    def argv(self) -> list[str]:
        """The process arguments this request stands for, in either :class:`ExecMode`."""
        if self.mode is ExecMode.ARGV:
            return [self.command, *self.args]
        script = " ".join([self.command, *(shlex.quote(a) for a in self.args)]) if self.args else self.command
        return ["/bin/sh", "-c", script]

    def validate(self) -> None:
        """Reject requests no runtime could run, with a message naming the field."""
        if not self.command:
            raise InvalidRequestError("command: must not be empty", details={"field": "command"})
        for name, value in [("command", self.command), *(("args", a) for a in self.args), ("cwd", self.cwd)]:
            if "\x00" in value:
                raise InvalidRequestError(f"{name}: must not contain a NUL byte", details={"field": name})
        for key in self.env:
            if not key or "=" in key or "\x00" in key:
                raise InvalidRequestError(f"env: invalid variable name {key!r}", details={"field": "env"})
        if self.timeout_s is not None and not (0 < self.timeout_s <= 24 * 3600):
            raise InvalidRequestError(
                f"timeout_s: must be between 0 and 86400 seconds, got {self.timeout_s}", details={"field": "timeout_s"}
            )
        check_user(self.user)


def check_user(user: str | None, *, field_name: str = "user") -> None:
    """Reject a user name that cannot be an /etc/passwd entry: empty, over 256 characters, with ``:``, ``/``, a
    newline or a NUL, starting with ``-`` or ``.`` (names become home paths and command arguments)."""
    bad = not user or len(user) > 256 or any(c in user for c in ":/\n\x00") or user[0] in "-."
    if user is not None and bad:
        raise InvalidRequestError(
            f"{field_name}: must be a user name of the workspace (1-256 characters, no ':', '/', newline or NUL, "
            f"not starting with '-' or '.'), got {user!r}",
            details={"field": field_name},
        )


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of a finished command. ``exit_code`` is nonzero when the command failed; that is not an error."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_ms: float
    truncated: bool = False
    """True when output passed the provider's cap and the rest was dropped."""


@dataclass(frozen=True, slots=True)
class ExecOutput:
    """A chunk of output, yielded by ``exec_stream`` as soon as the process writes it."""

    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True, slots=True)
class ExecExit:
    """The last item of ``exec_stream``: the command has finished."""

    exit_code: int
    duration_ms: float


ExecEvent = ExecOutput | ExecExit

ExecStream: TypeAlias = AsyncGenerator[ExecEvent, None]
"""What ``exec_stream`` returns; ``aclose()`` before the :class:`ExecExit` kills the command."""


async def collect_exec(events: ExecStream, *, output_limit: int, provider: str) -> ExecResult:
    """Run an ``exec_stream`` to completion: at most ``output_limit`` bytes of each stream are kept (``truncated``
    says when more came), and an :class:`ExecTimeoutError` is re-raised carrying the output received so far.

    Every provider whose ``exec`` is its ``exec_stream`` collected uses this, so all of them cap and time out alike.
    """
    out, err = bytearray(), bytearray()
    truncated = False
    started = time.monotonic()
    try:
        async with contextlib.aclosing(events) as stream:
            async for event in stream:
                if isinstance(event, ExecExit):
                    return ExecResult(event.exit_code, bytes(out), bytes(err), event.duration_ms, truncated)
                sink = out if event.stream == "stdout" else err
                room = output_limit - len(sink)
                truncated = truncated or len(event.data) > room
                sink += event.data[: max(room, 0)]
    except ExecTimeoutError as exc:
        elapsed = (time.monotonic() - started) * 1000
        raise ExecTimeoutError(exc.message, stdout=bytes(out), stderr=bytes(err), duration_ms=elapsed) from None
    raise ProviderUnavailableError(provider, "the command ended without an exit status")


# --- files --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileInfo:
    """What ``stat`` and ``list`` report about one path. ``mode`` holds the permission bits only."""

    path: str
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    symlink_target: str | None = None
    owner: str | None = None
    """The owning user's name in the sandbox (its uid in digits when it has no name); None when not known."""
    group: str | None = None
    """The owning group's name in the sandbox (its gid in digits when it has no name); None when not known."""


def check_path(path: str, *, field_name: str = "path") -> str:
    """Validate a sandbox path and make it absolute (relative paths start at ``/workspace``).

    Raises:
        InvalidRequestError: for an empty path or one holding a NUL byte.
    """
    if not isinstance(path, str) or not path.strip():
        raise InvalidRequestError(f"{field_name}: must be a non-empty path", details={"field": field_name})
    if "\x00" in path:
        raise InvalidRequestError(f"{field_name}: must not contain a NUL byte", details={"field": field_name})
    return path if path.startswith("/") else f"{WORKSPACE_ROOT}/{path}"


def escape_error(path: str, root: str, how: str = "") -> InvalidRequestError:
    """The error for a path that leads outside ``root`` (``how`` says through what), worded alike by every provider."""
    return InvalidRequestError(
        f"{path!r} leads outside {root}{how}; paths must stay inside {root}", details={"path": path, "kind": "escape"}
    )


def lies_beneath(path: str, root: str) -> bool:
    """True when the absolute, normalised ``path`` is ``root`` or lies under it."""
    return root in ("/", path) or path.startswith(root.rstrip("/") + "/")


async def check_beneath(
    provider: WorkspaceProvider, workspace_id: str, path: str, beneath: str, *, follow: bool = True
) -> str:
    """``beneath`` for providers whose runtime cannot resolve a path beneath a directory (E2B, HTTP): best effort.

    The path must lie under ``beneath`` once normalised, and so must its real path (its parent's, when ``follow`` is
    false) as the provider's ``realpath`` reports it. The caller acts on the path afterwards, so a process in the
    sandbox that swaps a directory for a symlink between the check and the operation wins: this is not race-free.

    Returns:
        The real path that was checked (with ``follow`` false: the real parent joined with the last name).

    Raises:
        InvalidRequestError: the path, or a symlink on its way, leads outside ``beneath``.
    """
    root = "/" + posixpath.normpath(check_path(beneath, field_name="beneath")).lstrip("/")
    absolute = "/" + posixpath.normpath(check_path(path)).lstrip("/")
    if not lies_beneath(absolute, root):
        raise escape_error(path, root)
    if absolute == root:
        return root
    real = await provider.realpath(workspace_id, absolute if follow else posixpath.dirname(absolute))
    if not lies_beneath(real, root):
        raise escape_error(path, root, f" (it resolves to {real})")
    return real if follow else posixpath.join(real, posixpath.basename(absolute))


# --- health and capabilities --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Health:
    """A provider's answer to "can you create workspaces right now?"."""

    healthy: bool
    error: str | None = None
    checked_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    latency_ms: float = 0.0
    details: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a provider offers, what it needs from the host, and what it has left."""

    isolation: Literal["microvm", "gvisor", "container", "remote", "none"]
    persistence: Persistence
    """What stop/resume keeps: "full" (the whole filesystem), "workspace" (only /workspace) or "none"."""
    snapshots: Retention
    """What a snapshot captures (a fork is a snapshot restored N times): "memory" (processes and memory, with the
    filesystem), "filesystem", or "none" (no snapshots, no forks)."""
    warm_pool: bool
    streaming: bool
    disk_limit: Literal["enforced", "monitored", "none"]
    """"enforced": the runtime refuses writes past the limit; "monitored": usage is watched and a warning is given."""
    requirements: tuple[str, ...]
    startup_latency_ms: float
    """Expected create latency; measured on this host once the provider has created workspaces."""
    resources: Mapping[str, object] = field(default_factory=dict)
    """Current availability, e.g. ``{"cpu_count": 2, "memory_bytes": ..., "disk_free_bytes": ...}``."""
    pause: Retention = "none"
    """What pause keeps: "memory" (processes, memory, open files), "filesystem" (a stop keeping the disk), "none"."""
    pty: bool = False
    """Commands on a pseudo-terminal (:class:`PtyHost`): interactive shells, with input and resize."""
    dir_watch: bool = False
    """Directory watches (:class:`DirWatcher`): create, write, remove, rename and chmod events as they happen."""


# --- the contract -------------------------------------------------------------------------------------------------


@runtime_checkable
class WorkspaceCalls(Protocol):
    """The calls that work inside a workspace, addressed by its id: exec and files.

    Every provider implements them (see :class:`WorkspaceProvider`); so does
    :class:`corral.orchestrator.service.WorkspaceRuntime`, which the layers above the orchestrator (tools, checkout,
    E2B's envd) hold instead of a provider, so that every call goes through the workspace service.
    """

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """Run a command to completion. Nonzero exits are results; a passed deadline raises ExecTimeoutError."""

    def exec_stream(self, workspace_id: str, request: ExecRequest) -> ExecStream:
        """Run a command, yielding :class:`ExecOutput` chunks as produced and one :class:`ExecExit` last.

        Closing the iterator early kills the command.
        """

    # Every file method takes ``beneath``: when given (an absolute directory, e.g. WORKSPACE_ROOT), the provider
    # guarantees the operation cannot reach outside that directory, race-free where the runtime allows: symlinks
    # inside it are followed, and a path, symlink or ``..`` leading out raises InvalidRequestError. Without it, paths
    # are used as given.

    async def read_file(self, workspace_id: str, path: str, *, beneath: str | None = None) -> ByteStream:
        """Open a file and return a stream of its content in chunks.

        Errors about the path (missing, a directory) are raised here, before the first chunk. The caller must
        consume or ``aclose()`` the stream. ``beneath``: see above.
        """

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
        """Write a file, creating missing parent directories; return the number of bytes written.

        ``owner``: a workspace user (a name in its /etc/passwd) that the file then belongs to, with that user's
        primary group; ``None``: the runtime's default (root)."""

    async def list_dir(self, workspace_id: str, path: str, *, beneath: str | None = None) -> list[FileInfo]:
        """The entries of a directory, sorted by name."""

    async def delete(
        self, workspace_id: str, path: str, *, recursive: bool = False, beneath: str | None = None
    ) -> None:
        """Remove a file, or a directory (non-empty ones only with ``recursive``); a final symlink is removed."""

    async def move(self, workspace_id: str, src: str, dst: str, *, beneath: str | None = None) -> None:
        """Rename ``src`` to ``dst``, creating ``dst``'s parent directories."""

    async def chmod(self, workspace_id: str, path: str, mode: int, *, beneath: str | None = None) -> None:
        """Set permission bits."""

    async def stat(self, workspace_id: str, path: str, *, beneath: str | None = None) -> FileInfo:
        """Information about one path, without following a final symlink."""

    async def glob(
        self,
        workspace_id: str,
        pattern: str,
        *,
        root: str = WORKSPACE_ROOT,
        limit: int = 10_000,
        beneath: str | None = None,
    ) -> list[str]:
        """Absolute paths under ``root`` matching ``pattern`` (``**`` matches any depth), sorted, at most ``limit``.

        With ``beneath``, ``root`` must lie inside it and symlinks under ``root`` are matched but never walked into.
        """

    async def realpath(self, workspace_id: str, path: str, *, beneath: str | None = None) -> str:
        """The path with every symlink resolved (missing trailing components are kept as they are)."""


@runtime_checkable
class WorkspaceProvider(WorkspaceCalls, Protocol):
    """One backend. Every method addresses the workspace by the id given in its :class:`WorkspaceSpec`.

    Exec and file calls are those of :class:`WorkspaceCalls`; the rest is where a workspace lives."""

    name: str

    async def create(self, spec: WorkspaceSpec) -> None:
        """Create and start the workspace; return when it can run commands.

        Raises:
            ProviderUnavailableError: the runtime cannot serve (missing, unreachable, misconfigured).
            ResourceLimitError: the requested limits cannot be granted.
        """

    async def destroy(self, workspace_id: str) -> None:
        """Remove every runtime object of the workspace. Idempotent: destroying a missing workspace is fine."""

    async def stop(self, workspace_id: str) -> None:
        """Stop the workspace's processes and free CPU and memory; ``/workspace`` is kept."""

    async def resume(self, workspace_id: str) -> None:
        """Bring a stopped workspace back with its ``/workspace`` intact. Resuming a running one is a no-op."""

    async def state(self, workspace_id: str) -> WorkspaceState:
        """What the runtime holds for this workspace right now."""

    async def list_workspaces(self) -> list[str]:
        """Ids of every workspace this provider holds runtime objects for (running or stopped)."""

    async def health(self) -> Health:
        """Fast, side-effect-free check that the provider can create workspaces now."""

    async def capabilities(self) -> Capabilities:
        """Features, host requirements, expected startup latency and current resources."""

    async def aclose(self) -> None:
        """Release connections and background tasks. Workspaces are left as they are."""


@runtime_checkable
class DiskUsageReporter(Protocol):
    """Optional sub-interface of providers whose disk limit is monitored rather than enforced."""

    async def disk_usage(self, workspace_id: str) -> int:
        """Bytes used under /workspace."""


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """CPU and memory of one running workspace at one moment, as its runtime counts them."""

    cpu_ns: int
    """CPU time used since the workspace started, in nanoseconds (a counter: the rate comes from two readings)."""
    mem_used: int
    """Bytes of memory in use, page cache that could be dropped excluded (what ``docker stats`` shows)."""
    mem_cache: int
    """Bytes of page cache."""
    mem_limit: int
    """The runtime's memory limit in bytes; 0 when it has none."""
    layer_bytes: int = 0
    """Bytes written to the root filesystem outside /workspace (a container's writable layer: the home directory,
    installed packages); 0 where the runtime does not count them."""


@runtime_checkable
class ResourceUsageReporter(Protocol):
    """Optional sub-interface of providers that can read a running workspace's CPU and memory counters."""

    async def resource_usage(self, workspace_id: str) -> ResourceUsage:
        """One reading now; a workspace that is not running raises :class:`~corral.errors.WorkspaceStateError`."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What a provider stored for one snapshot."""

    kind: Literal["memory", "filesystem"]
    """"memory": restoring brings back processes and memory too; "filesystem": files only, processes start fresh."""
    size_bytes: int
    """Bytes the snapshot holds on the host (image layer, volume copy, memory checkpoint)."""


@runtime_checkable
class Snapshotter(Protocol):
    """Optional sub-interface of providers that pause with memory and take snapshots (see ``Capabilities.pause``
    and ``Capabilities.snapshots``). Snapshot ids are chosen by Corral, like workspace ids."""

    async def pause(self, workspace_id: str) -> Literal["memory", "filesystem"]:
        """Free the workspace's CPU and memory, keeping its processes and memory where the provider can ("memory":
        ``resume`` restores them) and else its whole disk ("filesystem": ``resume`` is a cold start).

        Pausing a paused workspace answers what it holds; a stopped one is refused (WorkspaceStateError)."""

    async def snapshot(self, workspace_id: str, snapshot_id: str) -> SnapshotInfo:
        """Capture the running workspace's filesystem, and its memory where the provider can, under ``snapshot_id``.
        The workspace keeps running; it may be held still for as long as the checkpoint takes."""

    async def restore(self, spec: WorkspaceSpec, snapshot_id: str) -> None:
        """Create the workspace ``spec.id`` from a snapshot, running: the snapshot's files, and its processes and
        memory when it has them. ``spec`` gives the new workspace's id, labels and env; the image comes from the
        snapshot. Raises SnapshotNotFoundError naming the snapshot when it is gone."""

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove every host object of the snapshot. Idempotent."""

    async def list_snapshots(self) -> list[str]:
        """Ids of every snapshot this provider holds host objects for (reconciliation)."""


@dataclass(frozen=True, slots=True)
class PtyRequest:
    """A command to run on a new pseudo-terminal (its stdin, stdout, stderr and controlling terminal)."""

    argv: tuple[str, ...] = ("/bin/bash", "-i", "-l")
    cwd: str = WORKSPACE_ROOT
    env: Mapping[str, str] = field(default_factory=dict)
    """On top of the workspace's; ``TERM`` is ``xterm-256color`` unless given."""
    rows: int = 24
    cols: int = 80
    timeout_s: float | None = None
    """Deadline for the whole command; ``None``: none."""
    user: str | None = None
    """The workspace user to run as (see :attr:`ExecRequest.user`)."""

    def validate(self) -> None:
        """Reject requests no runtime could run, with a message naming the field."""
        ExecRequest(self.argv[0] if self.argv else "", self.argv[1:], ExecMode.ARGV, self.cwd, self.env).validate()
        check_user(self.user)
        for name, value in (("rows", self.rows), ("cols", self.cols)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
                message = f"{name}: must be between 1 and 65535, got {value!r}"
                raise InvalidRequestError(message, details={"field": name})
        if self.timeout_s is not None and not (0 < self.timeout_s <= 24 * 3600):
            raise InvalidRequestError(
                f"timeout_s: must be between 0 and 86400 seconds, got {self.timeout_s}", details={"field": "timeout_s"}
            )


class PtySession(Protocol):
    """A command running on a pseudo-terminal, as :meth:`PtyHost.open_pty` returns it."""

    def events(self) -> ExecStream:
        """What the terminal shows (``ExecOutput`` on "stdout"), then one :class:`ExecExit`; call it once.

        Closing it before the exit kills the command."""

    async def write(self, data: bytes) -> None:
        """Type ``data`` into the terminal."""

    async def resize(self, rows: int, cols: int) -> None:
        """Change the terminal's size; the command gets SIGWINCH."""

    async def kill(self) -> None:
        """Kill the command's process group; :meth:`events` ends (with the exit, when still read)."""


@runtime_checkable
class PtyHost(Protocol):
    """Optional sub-interface of providers that run commands on pseudo-terminals (``Capabilities.pty``)."""

    async def open_pty(self, workspace_id: str, request: PtyRequest) -> PtySession:
        """Start ``request`` on a new terminal and return its session; raises what ``exec`` raises, and
        InvalidRequestError when this workspace cannot open terminals."""


class ShellUnavailableError(Exception):
    """The workspace cannot keep a persistent shell (its provider or agent has none): use ``exec`` instead."""


@runtime_checkable
class ShellHost(Protocol):
    """Optional sub-interface of providers that keep persistent shells in a workspace (the bash tool's hot path)."""

    async def exec_in_shell(
        self, workspace_id: str, request: ExecRequest, *, key: str, state_dir: str, command: str
    ) -> ExecResult:
        """Run ``command`` in the workspace's persistent shell ``key``, which ``request`` starts when there is none
        (its argv, cwd, env and user; a shell started otherwise is replaced); ``request.timeout_s`` bounds this call.
        The shell reads the command from ``state_dir/command`` (see :data:`corral.tools.shell.PERSISTENT_SCRIPT`).
        Raises what ``exec`` raises, and :class:`ShellUnavailableError` when this workspace has no such shells."""


DirEventType = Literal["create", "write", "remove", "rename", "chmod"]


@dataclass(frozen=True, slots=True)
class DirEvent:
    """One change below a watched directory."""

    name: str
    """The changed entry's path relative to the watched directory (``.`` for the directory itself)."""
    type: DirEventType
    dropped: int = 0
    """Events lost just before this one because the watcher fell behind (the workspace changed faster than it was
    read); nonzero means the watcher's picture is incomplete."""


DirEventStream: TypeAlias = AsyncGenerator[DirEvent, None]


@runtime_checkable
class DirWatcher(Protocol):
    """Optional sub-interface of providers that watch directories inside workspaces (``Capabilities.dir_watch``)."""

    async def watch_dir(self, workspace_id: str, path: str, *, recursive: bool = False) -> DirEventStream:
        """Start watching the directory ``path`` and return its events; closing the stream stops the watch.

        Raises WorkspaceFileNotFoundError when ``path`` does not exist, FileOperationError (kind
        ``not_a_directory``) when it is no directory, and InvalidRequestError when this workspace cannot watch.
        Events name entries relative to ``path``; ``recursive`` includes directories created later. A watcher that
        reads too slowly loses the oldest events (counted in :attr:`DirEvent.dropped`), never the host's memory.
        """


@dataclass(frozen=True, slots=True)
class WorkspaceEvent:
    """Something a provider saw happen to a workspace on its own, outside any call made on it.

    ``died``: the sandbox exited (OOM, pids limit, killed from outside) while it was meant to run. ``broken``: its
    agent broke the protocol (something inside drives it); the connection was closed.
    """

    workspace_id: str
    kind: Literal["died", "broken"]
    reason: str


@runtime_checkable
class EventSource(Protocol):
    """Optional sub-interface of providers that report :class:`WorkspaceEvent` as they happen."""

    def subscribe(self, listener: Callable[[WorkspaceEvent], None]) -> None:
        """Call ``listener`` (on the event loop, without awaiting anything) for every event from now on."""


@runtime_checkable
class DeathWatcher(Protocol):
    """Optional sub-interface of providers that watch their runtime for workspaces dying on their own."""

    def known_dead(self, workspace_id: str) -> bool:
        """True when the workspace is known to have stopped since it was created or resumed (no I/O)."""


@runtime_checkable
class EgressControl(Protocol):
    """Optional sub-interface of providers that enforce egress rules in their networked workspaces (see
    :mod:`corral.egress`)."""

    async def set_egress(self, workspace_id: str, policy: EgressPolicy | None) -> None:
        """Put ``policy`` in force now (if the workspace runs) and at every later start; None lifts every rule. An
        isolated workspace raises :class:`~corral.errors.InvalidRequestError`; rules that cannot be applied raise
        :class:`~corral.errors.ProviderUnavailableError` and leave the workspace stopped rather than unrestricted."""


@runtime_checkable
class PortDialer(Protocol):
    """Optional sub-interface of providers whose networked workspaces the host can reach by address (preview URLs)."""

    async def port_address(self, workspace_id: str, port: int) -> tuple[str, int]:
        """The ``(host, port)`` at which the server on ``port`` inside a running, networked workspace is reached from
        the host. A workspace that is not running raises :class:`~corral.errors.WorkspaceStateError`; one without a
        network raises :class:`~corral.errors.InvalidRequestError`."""


class PortStream(Protocol):
    """A byte stream to a server listening inside a workspace, as :meth:`PortTunnel.open_port` returns it.

    Every call may raise OSError when the connection breaks, or a :class:`~corral.errors.CorralError` when the
    workspace stops under it.
    """

    async def read(self) -> bytes:
        """The server's next bytes (as many as have arrived); ``b""`` once the server has shut its side."""

    async def write(self, data: bytes) -> None:
        """Send ``data``; waits while the server is slow to take bytes (the memory held for it is bounded)."""

    async def write_eof(self) -> None:
        """Shut the sending side (the server reads end of stream); reading goes on."""

    async def aclose(self) -> None:
        """Close the connection in both directions."""


@runtime_checkable
class PortTunnel(Protocol):
    """Optional sub-interface of providers that reach ports inside workspaces without any network (preview URLs of
    isolated workspaces): a connection to the workspace's loopback, relayed by its guest agent."""

    async def open_port(self, workspace_id: str, port: int) -> PortStream:
        """Connect to ``port`` (1-65535) on the loopback inside a running workspace.

        Raises ConnectionRefusedError when nothing listens there, :class:`~corral.errors.WorkspaceStateError` when
        the workspace is not running, and :class:`~corral.errors.InvalidRequestError` for a port out of range or an
        agent too old to tunnel."""


def __getattr__(name: str) -> type[WorkspaceState]:
    """``SandboxState``, the old name of :class:`WorkspaceState`, with a DeprecationWarning until the next release."""
    if name != "SandboxState":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.SandboxState is deprecated and goes away in the next release; use {__name__}.WorkspaceState",
        DeprecationWarning,
        stacklevel=2,
    )
    return WorkspaceState
