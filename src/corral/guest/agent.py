"""The in-sandbox agent: one long-lived process per workspace that serves exec and file operations.

It runs INSIDE the sandbox (a gVisor or runc container, or a Firecracker VM), so it uses the standard library only
and must run on the Python of the base image (3.11, Debian bookworm). The host starts it once (``docker exec -i``,
or the VM's init, reached over vsock) and then speaks frames over the agent's stdin/stdout, many requests at once,
each tagged with an ``id``:

    frame := u32 header_len | header (UTF-8 JSON object) | u32 payload_len | payload (raw bytes)

Requests carry ``{"id": n, "op": ...}``; replies carry the same ``id`` and an ``ev``:

* ``exec {argv, cwd, env, timeout_s}`` -> ``out`` frames (``fd`` 1 or 2, payload = bytes as produced), then
  ``exit {code, timed_out, duration_ms}``. When the command ends (exit, deadline or kill), every process still in
  its process group is killed, so nothing it started keeps running unnoticed (a fork bomb included); a process meant
  to outlive its command must start its own session (``setsid``). ``kill {target}`` kills a running exec's process
  group, or stops a read.
* ``pty {argv, cwd, env, rows, cols, timeout_s}`` (feature ``pty``): the command runs with a new pseudo-terminal as
  its stdin, stdout, stderr and controlling terminal (``TERM=xterm-256color`` unless ``env`` says otherwise) ->
  ``out`` frames (``fd`` 1: what the terminal shows), then ``exit`` as for ``exec``. ``pty_input {target}`` (payload:
  bytes typed into the terminal) and ``pty_resize {target, rows, cols}`` -> ``result {}``; ``kill {target}`` ends it.
* ``read {path}`` -> ``open {size}``, ``data`` frames, ``end``. ``write {path, mode}`` -> the host then sends
  ``data`` frames and ``end`` with the same id -> ``result {bytes_written}``.
* Flow control: of each exec's output and each read, at most :data:`WINDOW` bytes may be unacknowledged; the host
  grants more with ``credit {target, bytes}`` (id 0) as it consumes them. An exec whose window is full stops reading
  its pipes, so the command blocks on write: a slow client slows the command, it never fills anyone's memory.
* Limits: a header holds at most :data:`MAX_HEADER` bytes and a payload :data:`MAX_PAYLOAD`; the host closes the
  connection on any frame past them.
* ``watch {path, recursive}`` (feature ``watch``): inotify on a directory (and, recursive, on every directory below
  it, those created later included) -> ``open {}``, then ``data`` frames (payload: a JSON object ``{"events": [[name,
  type], ...], "dropped": n}``, names relative to the directory, types ``create``, ``write``, ``remove``,
  ``rename``, ``chmod``) under the same flow control as a read; ``kill {target}`` ends it. See :class:`DirWatch`.
* ``tunnel {port}`` (feature ``tunnel``): a TCP connection to ``127.0.0.1:port`` inside the sandbox (``::1`` when
  nothing listens there), relayed both ways -> ``open {}``, or ``error`` with kind ``refused`` when nothing listens.
  Then the server's bytes come as ``data`` frames under the same flow control as a read, and ``eof`` once it has
  shut its side. The host sends ``data`` frames with the same id (at most :data:`WINDOW` bytes it has not been
  granted ``credit {bytes}`` for: the agent grants bytes as the server takes them) and ``eof`` to shut the
  connection's sending side. ``end`` once both sides are shut; ``kill {target}`` closes the connection at once (no
  last frame). At most :data:`MAX_TUNNELS` at once; more are refused with kind ``busy``. A tunnel's own window,
  toward the host, is :data:`TUNNEL_WINDOW` (feature ``tunnel_window``): the server holds what the host has not passed
  on to a visitor yet, for many visitors at once. See :class:`Tunnel`.
* ``stat``, ``list``, ``delete``, ``move``, ``chmod``, ``mkdir``, ``glob``, ``realpath``, ``usage``, ``ping`` ->
  ``result {...}``.
* Every file operation also takes ``beneath`` (an absolute directory, e.g. ``/workspace``): its paths are then
  resolved beneath that root without ever letting the kernel follow a symlink (see :class:`Beneath`), and a path, a
  symlink or a ``..`` that leads outside it fails with kind ``escape``. Without it, paths are used as given.
* Any failure -> ``error {kind, message}`` where kind is ``not_found``, ``exists``, ``not_a_directory``,
  ``is_a_directory``, ``not_empty``, ``permission``, ``escape``, ``invalid``, ``refused``, ``busy`` or ``os``.

Every exec runs in its own session (process group) so a deadline kills the command and all its children.
Diagnostics go to stderr, which the host logs; stdout carries frames only.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import queue
import re
import select
import signal
import socket
import stat as statlib
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, BinaryIO, TypeVar

# Imported where used, not here: shutil, glob and fnmatch (only some operations need them) and dataclasses (it pulls
# in inspect, ast and dis). Each module the agent loads stays in its memory, in every workspace, while it runs.

PROTOCOL_VERSION = 2
LOADER_VARIABLES = (
    "LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "LD_DEBUG", "LD_DEBUG_OUTPUT", "LD_PROFILE", "LD_PROFILE_OUTPUT",
    "LD_ORIGIN_PATH", "LD_HWCAP_MASK", "LD_USE_LOAD_BIAS", "GLIBC_TUNABLES", "MALLOC_TRACE", "GCONV_PATH", "LOCPATH",
    "NLSPATH", "TZDIR", "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "RESOLV_HOST_CONF", "LC_ALL",
)  # fmt: skip
"""The variables the host empties for the agent's own process (see corral.providers.agent_runtime). Flags the loader
honours whatever their value (LD_SHOW_AUXV, LD_BIND_NOT...) cannot be emptied this way; they change no code path."""
FEATURES = ["beneath", "pty", "shell", "tunnel", "tunnel_window", "user", "watch"]
"""What the hello frame says this agent can do beyond the protocol version (``beneath``: confined file paths;
``pty``: commands on a pseudo-terminal; ``shell``: persistent shells; ``tunnel``: TCP connections to ports inside
the sandbox; ``user``: commands run as, and files written for, a user of the workspace)."""
CHUNK = 256 * 1024
MAX_HEADER = 1024 * 1024
"""The largest frame header either side accepts (a directory listing or glob result travels in one; one that would
not fit is answered with an error instead)."""
FRAME_COST = 64
"""What one streamed frame costs of its window besides its payload: the host counts its header at this much."""
MAX_PAYLOAD = 1024 * 1024
"""The largest frame payload either side accepts (data chunks are CHUNK bytes)."""
WINDOW = 4 * CHUNK
"""Streamed bytes of one request that may be in flight before the host grants credit."""
TUNNEL_WINDOW = 128 * 1024
"""A tunnel's window toward the host: smaller than :data:`WINDOW`, since the host holds one per open tunnel."""
TUNNEL_CHUNK = TUNNEL_WINDOW // 4
"""The most a tunnel's data frame carries: a quarter window, so the next frames flow while the host passes one on."""
_LEN = struct.Struct(">I")

Header = dict[str, Any]  # a frame header: a JSON object
Handler = Callable[[Header], Header | None]  # an ``op_*`` method


# --- framing (imported by the host-side client too) ----------------------------------------------------------------


def encode_frame(header: Header, payload: bytes = b"") -> bytes:
    """Serialise one frame: header dict and raw payload bytes."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join((_LEN.pack(len(head)), head, _LEN.pack(len(payload)), payload))


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(stream: BinaryIO) -> tuple[Header, bytes] | None:
    """Read one frame from a blocking binary stream; None at end of stream (or past the size limits)."""
    raw = _read_exact(stream, 4)
    if raw is None or _LEN.unpack(raw)[0] > MAX_HEADER:
        return None
    head = _read_exact(stream, _LEN.unpack(raw)[0])
    if head is None:
        return None
    raw = _read_exact(stream, 4)
    if raw is None or _LEN.unpack(raw)[0] > MAX_PAYLOAD:
        return None
    payload = _read_exact(stream, _LEN.unpack(raw)[0])
    if payload is None:
        return None
    return json.loads(head), payload


# --- the agent -----------------------------------------------------------------------------------------------------


class Agent:
    def __init__(self, inp: BinaryIO, out: BinaryIO) -> None:
        self.inp = inp
        self.out = out
        self.out_lock = threading.Lock()
        self.workers = Workers()
        self.procs: dict[int, Process] = {}  # exec id -> its process, for kill
        self.streams: dict[int, Window] = {}  # exec or read id -> its flow-control window
        self.writes: dict[int, BinaryIO] = {}  # write id -> open file
        self.terminals: dict[int, Terminal] = {}  # pty id -> its terminal, for input and resize
        self.tunnels: dict[int, Tunnel] = {}  # tunnel id -> its connection, for the host's data and eof
        self.shells: dict[str, Shell] = {}  # shell key -> its persistent shell (the ``shell`` op)
        self.shells_lock = threading.Lock()
        self.base_env = dict(os.environ)
        # The host starts the agent with the loader's variables emptied and LC_ALL=C (see the agent runtime); its
        # commands get the container's own values back.
        restore = self.base_env.pop("CORRAL_AGENT_RESTORE_ENV", None)
        if restore is not None:
            for name in LOADER_VARIABLES:
                self.base_env.pop(name, None)
            with contextlib.suppress(ValueError, TypeError):
                self.base_env.update({str(k): str(v) for k, v in json.loads(restore).items()})
        self.spawner: str | None = self.base_env.pop("CORRAL_SPAWNER_SOCKET", None) or None
        self.spawner_seen = False
        self.base_env.setdefault("HOME", "/root")
        self.base_env.setdefault("LANG", "C.UTF-8")
        self.base_env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")

    # output -------------------------------------------------------------------------------------------------------
    def send(self, header: Header, payload: bytes = b"") -> None:
        frame = encode_frame(header, payload)
        with self.out_lock:
            try:
                self.out.write(frame)
                self.out.flush()
            except (BrokenPipeError, ValueError):
                os._exit(0)  # the host went away; nothing left to serve

    def send_exit(self, rid: int, code: int, timed_out: bool, started: float) -> None:
        """A command's last frame: its exit status (a signal ``-N`` as ``128 + N``, as a shell says it)."""
        self.send(
            {
                "id": rid,
                "ev": "exit",
                "code": 128 - code if code < 0 else code,
                "timed_out": timed_out,
                "duration_ms": (time.monotonic() - started) * 1000,
            }
        )

    def result(self, rid: int, value: Header) -> None:
        header = {"id": rid, "ev": "result", "result": value}
        if len(json.dumps(header, separators=(",", ":"))) > MAX_HEADER:
            count = next((len(v) for v in value.values() if isinstance(v, list)), 0)
            message = f"the answer ({count} entries) is larger than the {MAX_HEADER}-byte frame limit; narrow it down"
            header = {"id": rid, "ev": "error", "kind": "too_large", "message": message}
        self.send(header)

    def error(self, rid: int, exc: BaseException) -> None:
        kind, message = describe_error(exc)
        self.send({"id": rid, "ev": "error", "kind": kind, "message": message})

    # main loop ----------------------------------------------------------------------------------------------------
    def serve(self) -> None:
        self.send({"id": 0, "ev": "hello", "version": PROTOCOL_VERSION, "pid": os.getpid(), "features": FEATURES})
        while True:
            frame = read_frame(self.inp)
            if frame is None:
                break
            header, payload = frame
            try:
                self.dispatch(header, payload)
            except Exception as exc:
                self.error(header.get("id", 0), exc)
        for proc in list(self.procs.values()):
            kill_group(proc)
        for shell in list(self.shells.values()):
            shell.close()

    def dispatch(self, h: Header, payload: bytes) -> None:
        op, rid = h.get("op"), h.get("id", 0)
        if op == "data":  # a chunk of an open write: written inline, so writes stay ordered
            tunnel = self.tunnels.get(rid)
            if tunnel is not None:  # a tunnel's bytes are queued for its thread: the server may be slow to take them
                tunnel.feed(payload)
                return
            f = self.writes.get(rid)
            if f is not None:
                try:
                    f.write(payload)
                except Exception as exc:
                    self.writes.pop(rid, None)
                    f.close()
                    self.error(rid, exc)
            return
        if op == "eof":
            tunnel = self.tunnels.get(rid)
            if tunnel is not None:
                tunnel.end_input()
            return
        if op == "end":
            f = self.writes.pop(rid, None)
            if f is not None:
                size = f.tell()
                f.close()
                self.result(rid, {"bytes_written": size})
            return
        if op == "write":
            # The owner first: an unknown user fails before anything is created.
            owner = lookup_account(h["owner"]) if h.get("owner") else None
            if h.get("beneath"):
                fd = create_beneath(h)
            else:
                path = h["path"]
                parent = os.path.dirname(path)
                if parent:
                    makedirs_owned(parent, owner)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, h.get("mode") or 0o644)
            writable_file(fd, h["path"], owner)
            if owner is not None:
                os.fchown(fd, owner.uid, owner.gid)
            if h.get("mode") is not None:
                os.fchmod(fd, h["mode"])
            self.writes[rid] = os.fdopen(fd, "wb")
            self.send({"id": rid, "ev": "ready"})
            return
        if op == "credit":
            window = self.streams.get(h.get("target", -1))
            if window is not None:
                window.grant(int(h.get("bytes", 0)))
            return
        if op == "pty_input":  # inline too, so keystrokes stay ordered
            terminal = self.terminals.get(h.get("target", -1))
            if terminal is None:
                raise ValueError(f"no terminal {h.get('target')!r} is running")
            terminal.feed(payload)
            self.result(rid, {})
            return
        if op == "kill":
            terminal = self.terminals.get(h["target"])
            if terminal is not None:
                terminal.killed = True  # a kill right behind the request: its worker may not have started it yet
            tunnel = self.tunnels.get(h["target"])
            if tunnel is not None:
                tunnel.kill()
            window = self.streams.get(h["target"])
            if window is not None:
                window.cancel()
            proc = self.procs.get(h["target"])
            if proc is not None:
                kill_group(proc)
            self.result(rid, {})
            return
        handler = getattr(self, "op_" + str(op), None)
        if handler is None:
            self.send({"id": rid, "ev": "error", "kind": "invalid", "message": f"unknown operation {op!r}"})
            return
        if op == "pty":  # its terminal exists at once: input or a resize sent right behind may come before the worker
            rows, cols = _size(h)
            self.terminals[rid] = Terminal(*os.openpty())
            self.terminals[rid].resize(rows, cols)
        if op == "tunnel":  # it exists at once, so that a kill sent right behind finds it
            if len(self.tunnels) >= MAX_TUNNELS:
                message = f"{MAX_TUNNELS} connections to ports are open already; close one first"
                self.send({"id": rid, "ev": "error", "kind": "busy", "message": message})
                return
            self.tunnels[rid] = Tunnel()
        if op in ("exec", "shell", "pty", "read", "glob", "usage", "watch", "tunnel"):
            self.workers.submit(self.guarded, handler, rid, h)
        else:
            self.result(rid, handler(h))

    def guarded(self, handler: Handler, rid: int, h: Header) -> None:
        try:
            value = handler(h)
            if value is not None:
                self.result(rid, value)
        except Exception as exc:
            self.error(rid, exc)

    # commands -----------------------------------------------------------------------------------------------------
    def spawn(
        self, argv: list[str], cwd: str, env: dict[str, str], account: Account | None = None, stdin: int | None = None
    ) -> Process:
        """Start a command with its own session, stdin from /dev/null (or the descriptor ``stdin``) and stdout/stderr
        piped to the agent.

        Through the spawner when the container runs one (see "the spawner" below), so that the command belongs to
        the container's own process tree and survives a checkpoint; else (an older container, a spawner killed by
        the workspace) as the agent's own child. With ``account`` it runs as that user (groups: its primary only).
        """
        uid, gid = (account.uid, account.gid) if account is not None else (-1, -1)
        if self.spawner is not None:
            sock = self.spawner_connection()
            if sock is not None:
                return Spawned.start(sock, argv, cwd, env, uid=uid, gid=gid, stdin=stdin)
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            user=None if account is None else uid,
            group=None if account is None else gid,
            extra_groups=None if account is None else [gid],
        )

    def spawner_connection(self) -> socket.socket | None:
        """A connection to the spawner; the first time, wait for it to boot (it starts with the container)."""
        assert self.spawner is not None
        deadline = time.monotonic() + (0 if self.spawner_seen else SPAWNER_BOOT_S)
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.spawner)
            except OSError:
                sock.close()
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.01)
                continue
            self.spawner_seen = True
            return sock

    def command_setup(
        self, h: Header, defaults: dict[str, str] | None = None
    ) -> tuple[dict[str, str], Account | None, float, float | None]:
        """A command request's environment (the agent's, ``defaults``, its user's login variables, then its own
        ``env``), its user's account, its start time and its deadline (None without ``timeout_s``)."""
        env = {**self.base_env, **(defaults or {})}
        account = lookup_account(h["user"]) if h.get("user") else None
        if account is not None:
            env.update(account.env())
        env.update(h.get("env") or {})
        started = time.monotonic()
        timeout = h.get("timeout_s")
        return env, account, started, started + timeout if timeout else None

    # operations ---------------------------------------------------------------------------------------------------
    def op_ping(self, h: Header) -> Header:
        return {"pid": os.getpid(), "version": PROTOCOL_VERSION}

    def op_exec(self, h: Header) -> None:
        rid = h["id"]
        env, account, started, deadline = self.command_setup(h)
        try:
            proc = self.spawn(h["argv"], h.get("cwd") or "/", env, account)
        except FileNotFoundError as exc:
            # Same convention as a shell: a missing program or cwd is exit 127 with the reason on stderr.
            what = h.get("cwd") if exc.filename == h.get("cwd") else h["argv"][0]
            self.send({"id": rid, "ev": "out", "fd": 2}, f"{what}: not found\n".encode())
            self.send({"id": rid, "ev": "exit", "code": 127, "timed_out": False, "duration_ms": 0.0})
            return
        except PermissionError:
            self.send({"id": rid, "ev": "out", "fd": 2}, f"{h['argv'][0]}: permission denied\n".encode())
            self.send({"id": rid, "ev": "exit", "code": 126, "timed_out": False, "duration_ms": 0.0})
            return
        self.procs[rid] = proc
        window = self.streams[rid] = Window()
        timed_out = False
        stdout, stderr = proc.stdout, proc.stderr
        assert stdout is not None  # both are PIPE
        assert stderr is not None
        fds = {stdout.fileno(): 1, stderr.fileno(): 2}
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        exited_at: float | None = None
        try:
            while fds:
                timed_out, exited_at, wait = output_turn(proc, deadline, timed_out, exited_at)
                if wait is None:
                    break
                if window.cancelled:
                    break
                if window.room() <= 0:
                    # No credit: leave the pipes unread, so the command blocks on its writes until the host reads.
                    window.wait(max(0.0, wait))
                    continue
                for fd, _ in poller.poll(max(0.0, wait) * 1000):
                    if window.room() <= 0:
                        break  # the other pipe's frame used the credit up
                    data = os.read(fd, min(CHUNK, window.room()))
                    if data:
                        window.take(len(data) + FRAME_COST)
                        self.send({"id": rid, "ev": "out", "fd": fds[fd]}, data)
                    else:
                        poller.unregister(fd)
                        del fds[fd]
            # Its output is over; the command itself may still be exiting (or run on with its pipes closed): wait
            # for it, within its deadline.
            while True:
                try:
                    code = proc.wait(None if deadline is None or timed_out else max(deadline - time.monotonic(), 0))
                    break
                except subprocess.TimeoutExpired:
                    timed_out = True
                    kill_group(proc)
            # The command is over: nothing it left in its process group keeps running (fork bombs, stray jobs).
            kill_group(proc)
        finally:
            self.procs.pop(rid, None)
            self.streams.pop(rid, None)
            stdout.close()
            stderr.close()
        if timed_out:
            kill_group(proc)  # children that outlived the leader
        self.send_exit(rid, code, timed_out, started)
        return

    def op_shell(self, h: Header) -> None:
        """Run ``command`` in the persistent shell ``key``, started from ``argv`` when there is none (see
        :class:`Shell`); answered like ``exec``."""
        key, command, directory = h["key"], h["command"], h["dir"]
        if not isinstance(key, str) or not 0 < len(key) <= 128:
            raise ValueError("key: must be a string of 1-128 characters")
        if not isinstance(directory, str) or not directory.startswith("/") or "\0" in directory:
            raise ValueError("dir: must be an absolute path")
        if not isinstance(command, str) or "\0" in command:
            raise ValueError("command: must be text without a NUL character")
        timeout = h.get("timeout_s")
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            with self.shells_lock:
                shell = self.shells.get(key)
                if shell is None:
                    if len(self.shells) >= MAX_SHELLS and not self.evict_shell():
                        message = f"{MAX_SHELLS} shells are running commands already; try again when one is done"
                        self.send({"id": h["id"], "ev": "error", "kind": "busy", "message": message})
                        return
                    shell = self.shells[key] = Shell()
                shell.used = time.monotonic()
            # The call before of this shell holds it until its own deadline at the latest; so does this one.
            if not shell.lock.acquire(timeout=-1 if deadline is None else max(deadline - time.monotonic(), 0)):
                waited = (time.monotonic() - deadline + (timeout or 0)) * 1000 if deadline is not None else 0.0
                self.send({"id": h["id"], "ev": "exit", "code": 137, "timed_out": True, "duration_ms": waited})
                return
            try:
                with self.shells_lock:
                    current = self.shells.get(key) is shell  # not evicted while this call waited for the one before
                if current:
                    self.run_in_shell(h, shell, command, directory)
                    return
            finally:
                shell.lock.release()

    def evict_shell(self) -> bool:
        """Close the shell used longest ago that runs nothing now (the caller holds ``shells_lock``); a call that
        waits for a shell takes its lock before it checks the shell is still kept, so it never runs on a closed one."""
        for _, key in sorted((shell.used, key) for key, shell in self.shells.items()):
            shell = self.shells[key]
            if shell.lock.acquire(blocking=False):
                try:
                    del self.shells[key]
                    shell.close()
                finally:
                    shell.lock.release()
                return True
        return False

    def run_in_shell(self, h: Header, shell: Shell, command: str, directory: str) -> None:
        rid = h["id"]
        env, account, started, deadline = self.command_setup(h)
        spec = (tuple(h["argv"]), h.get("cwd") or "/", tuple(sorted(env.items())), h.get("user") or "")
        if shell.spec != spec or shell.proc is None or shell.proc.poll() is not None:
            shell.close()  # gone, or started for another user, directory or environment: a fresh one restores state
            make_shell_dir(directory, account)
            ours, theirs = socket.socketpair()
            try:
                shell.proc = self.spawn(list(h["argv"]), h.get("cwd") or "/", env, account, stdin=theirs.fileno())
            except (FileNotFoundError, PermissionError) as exc:
                ours.close()
                failed = 127 if isinstance(exc, FileNotFoundError) else 126
                self.send({"id": rid, "ev": "out", "fd": 2}, f"{h['argv'][0]}: {exc.strerror}\n".encode())
                self.send({"id": rid, "ev": "exit", "code": failed, "timed_out": False, "duration_ms": 0.0})
                return
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            shell.control, shell.spec = ours, spec
        proc, control = shell.proc, shell.control
        assert proc is not None
        assert control is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        self.procs[rid] = proc  # a kill from the host ends the shell: the next call starts a fresh one
        window = self.streams[rid] = Window()
        try:
            shell.hand_over(command, directory, account)
        except BaseException:
            self.procs.pop(rid, None)
            self.streams.pop(rid, None)
            raise
        fds = {proc.stdout.fileno(): 1, proc.stderr.fileno(): 2}
        poller = select.poll()
        for fd in (*fds, control.fileno()):
            poller.register(fd, select.POLLIN)
        code: int | None = None
        timed_out = ended = False
        try:
            # Until the shell reports the command's status on its control socket (or ends, or the deadline passes).
            while code is None and not ended and not window.cancelled:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    timed_out = True
                    break
                if proc.poll() is not None:
                    ended = True
                    break
                wait = 0.05 if deadline is None else min(0.05, deadline - now)  # the status wakes the poll at once
                if window.room() <= 0:
                    window.wait(wait)  # no credit: the pipes stay unread and the command blocks on its writes
                    continue
                for fd, _ in poller.poll(wait * 1000):
                    if fd == control.fileno():
                        code, ended = shell.take_status(poller)
                    elif window.room() > 0:
                        ended = not self.forward(rid, fd, fds, poller, window) and not fds
            if code is not None:
                self.drain(rid, fds, poller, window, deadline)  # all the command wrote is in the pipes by now
            else:
                if ended and not window.cancelled and not timed_out:
                    # It ended by itself (exit N, set -e, exec): what it wrote before is still in the pipes.
                    self.drain(rid, fds, poller, window, deadline, until_eof_s=0.25)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        code = proc.wait(SHELL_EXIT_S)  # its socket closed first: the process is still exiting
                shell.close()  # a timeout or a kill ends it too, its background jobs included
        finally:
            self.procs.pop(rid, None)
            self.streams.pop(rid, None)
        if code is None:
            code = -signal.SIGKILL
        self.send_exit(rid, code, timed_out, started)

    def forward(self, rid: int, fd: int, fds: dict[int, int], poller: select.poll, window: Window) -> bool:
        """Send what one of a command's pipes holds as an ``out`` frame; False (and the pipe unregistered) at its
        end of file."""
        data = os.read(fd, min(CHUNK, window.room()))
        if not data:
            poller.unregister(fd)
            del fds[fd]
            return False
        window.take(len(data) + FRAME_COST)
        self.send({"id": rid, "ev": "out", "fd": fds[fd]}, data)
        return True

    def drain(
        self,
        rid: int,
        fds: dict[int, int],
        poller: select.poll,
        window: Window,
        deadline: float | None,
        until_eof_s: float = 0.0,
    ) -> None:
        """Send what the pipes hold now (``until_eof_s``: wait that long for their end of file), at most
        :data:`SHELL_DRAIN_MAX` bytes: a background job that writes without end must not hold the call. Credit is
        waited for until the call's deadline."""
        end = time.monotonic() + until_eof_s
        sent = 0
        while fds and sent < SHELL_DRAIN_MAX and not window.cancelled:
            left = end - time.monotonic()
            if window.room() <= 0:
                if deadline is not None and time.monotonic() >= deadline:
                    return
                window.wait(0.05 if deadline is None else min(deadline - time.monotonic(), 0.05))
                continue
            ready = [fd for fd, _ in poller.poll(max(left, 0) * 1000) if fd in fds]
            if not ready:
                return
            for fd in ready:
                if window.room() > 0 and fd in fds:
                    before = window.credit
                    self.forward(rid, fd, fds, poller, window)
                    sent += before - window.credit

    def op_pty(self, h: Header) -> None:
        rid = h["id"]
        terminal = self.terminals[rid]
        try:
            self.run_terminal(rid, h, terminal)
        finally:
            self.terminals.pop(rid, None)
            terminal.close()

    def run_terminal(self, rid: int, h: Header, terminal: Terminal) -> None:
        # TERM: what a terminal client renders; the request may say otherwise.
        env, account, started, deadline = self.command_setup(h, {"TERM": "xterm-256color"})
        master, slave = terminal.master, terminal.slave
        assert slave is not None  # closed only once the command has started
        try:
            proc = self.spawn_terminal(h["argv"], h.get("cwd") or "/", env, slave, account)
        except FileNotFoundError as exc:
            what = h.get("cwd") if exc.filename == h.get("cwd") else h["argv"][0]
            self.send({"id": rid, "ev": "out", "fd": 1}, f"{what}: not found\r\n".encode())
            self.send({"id": rid, "ev": "exit", "code": 127, "timed_out": False, "duration_ms": 0.0})
            return
        finally:
            terminal.close_slave()  # the command holds its own copies: the master reads EIO once they are all closed
        self.procs[rid] = proc
        if terminal.killed:
            kill_group(proc)
        window = self.streams[rid] = Window()
        timed_out = False
        poller = select.poll()
        poller.register(terminal.wake_r, select.POLLIN)
        poller.register(master, 0)
        exited_at: float | None = None
        try:
            while not window.cancelled:
                timed_out, exited_at, next_wait = output_turn(proc, deadline, timed_out, exited_at)
                if next_wait is None:
                    break
                wait = next_wait
                room = window.room() > 0
                # No credit: the terminal is left unread, so the command blocks on its writes until the host reads.
                poller.modify(master, (select.POLLIN if room else 0) | (select.POLLOUT if terminal.pending else 0))
                if not room and not terminal.pending:
                    window.wait(max(0.0, wait))
                    continue
                ended = False
                for fd, events in poller.poll(max(0.0, wait) * 1000):
                    if fd == terminal.wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(terminal.wake_r, 4096)
                        continue
                    if events & select.POLLOUT:
                        terminal.flush()
                    if not events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                        continue
                    if window.room() <= 0:
                        window.wait(max(0.0, wait))  # a hung-up terminal polls ready at once: do not spin
                        continue
                    try:
                        data = os.read(master, min(CHUNK, window.room()))
                    except BlockingIOError:
                        continue
                    except OSError:  # EIO: every copy of the slave side is closed
                        data = b""
                    if not data:
                        ended = True
                        break
                    window.take(len(data) + FRAME_COST)
                    self.send({"id": rid, "ev": "out", "fd": 1}, data)
                if ended:
                    break
            while True:
                try:
                    code = proc.wait(None if deadline is None or timed_out else max(deadline - time.monotonic(), 0))
                    break
                except subprocess.TimeoutExpired:
                    timed_out = True
                    kill_group(proc)
            kill_group(proc)  # nothing it left in its process group keeps running
        finally:
            self.procs.pop(rid, None)
            self.streams.pop(rid, None)
        self.send_exit(rid, code, timed_out, started)

    def op_pty_resize(self, h: Header) -> Header:
        terminal = self.terminals.get(h.get("target", -1))
        if terminal is None:
            raise ValueError(f"no terminal {h.get('target')!r} is running")
        terminal.resize(*_size(h))
        return {}

    def spawn_terminal(
        self, argv: list[str], cwd: str, env: dict[str, str], slave: int, account: Account | None = None
    ) -> Process:
        """Start a command in its own session with the pty ``slave`` as its stdin, stdout, stderr and controlling
        terminal: through the spawner when there is one (see :meth:`spawn`), else as the agent's own child."""
        uid, gid = (account.uid, account.gid) if account is not None else (-1, -1)
        if self.spawner is not None:
            sock = self.spawner_connection()
            if sock is not None:
                return Spawned.start(sock, argv, cwd, env, uid=uid, gid=gid, terminal=slave)
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_take_terminal,  # noqa: PLW1509 - runs after setsid; only the fallback without a spawner
            user=None if account is None else uid,
            group=None if account is None else gid,
            extra_groups=None if account is None else [gid],
        )

    def op_read(self, h: Header) -> None:
        rid = h["id"]
        window = self.streams[rid] = Window()
        try:
            with open_beneath(h) if h.get("beneath") else open(h["path"], "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self.send({"id": rid, "ev": "open", "size": size})
                while not window.cancelled:
                    if window.room() <= 0:
                        window.wait(1.0)
                        continue
                    chunk = f.read(min(CHUNK, window.room()))
                    if not chunk:
                        break
                    window.take(len(chunk) + FRAME_COST)
                    self.send({"id": rid, "ev": "data"}, chunk)
        finally:
            self.streams.pop(rid, None)
        if not window.cancelled:
            self.send({"id": rid, "ev": "end"})
        return

    def op_stat(self, h: Header) -> Header:
        if h.get("beneath"):
            return stat_beneath(h)
        return file_info(h["path"])

    def op_list(self, h: Header) -> Header:
        if h.get("beneath"):
            return list_beneath(h)
        path = h["path"]
        names = sorted(os.listdir(path))
        out: list[Header] = []
        owners: dict[str, dict[int, str]] = {}
        for name in names:
            try:
                out.append(file_info(os.path.join(path, name), names=owners))
            except FileNotFoundError:
                continue  # removed while we listed
        return {"entries": out}

    def op_delete(self, h: Header) -> Header:
        if h.get("beneath"):
            return delete_beneath(h)
        path = h["path"]
        st = os.lstat(path)
        if statlib.S_ISDIR(st.st_mode):
            if h.get("recursive"):
                import shutil  # noqa: PLC0415 - lazy: see the imports

                shutil.rmtree(path)
            else:
                os.rmdir(path)
        else:
            os.unlink(path)
        return {}

    def op_move(self, h: Header) -> Header:
        if h.get("beneath"):
            return move_beneath(h)
        parent = os.path.dirname(h["dst"])
        if parent:
            os.makedirs(parent, exist_ok=True)
        os.rename(h["src"], h["dst"])
        return {}

    def op_chmod(self, h: Header) -> Header:
        if h.get("beneath"):
            return chmod_beneath(h)
        os.chmod(h["path"], h["mode"])
        return {}

    def op_mkdir(self, h: Header) -> Header:
        if h.get("beneath"):
            return mkdir_beneath(h)
        owner = lookup_account(h["owner"]) if h.get("owner") else None
        if not h.get("exist_ok", True) and os.path.lexists(h["path"]):
            raise FileExistsError(errno.EEXIST, "File exists", h["path"])
        makedirs_owned(h["path"], owner)
        return {}

    def op_realpath(self, h: Header) -> Header:
        if h.get("beneath"):
            return realpath_beneath(h)
        return {"path": os.path.realpath(h["path"])}

    def op_glob(self, h: Header) -> Header:
        if h.get("beneath"):
            return glob_beneath(h)
        root, pattern, limit = h.get("root") or "/workspace", h["pattern"], h.get("limit") or 10000
        if not os.path.isdir(root):
            raise FileNotFoundError(errno.ENOENT, "no such directory", root)
        paths: list[str] = []
        import glob as globlib  # noqa: PLC0415 - lazy: see the imports

        for rel in globlib.iglob(pattern, root_dir=root, recursive=True, include_hidden=h.get("hidden", False)):
            paths.append(os.path.normpath(os.path.join(root, rel)))
            if len(paths) > limit:
                break
        paths.sort()
        return {"paths": paths[:limit], "truncated": len(paths) > limit}

    def op_usage(self, h: Header) -> Header:
        if h.get("beneath"):
            return usage_beneath(h)
        total = 0
        for dirpath, dirnames, filenames in os.walk(h["path"]):
            for name in dirnames + filenames:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
        return {"bytes": total}

    def op_watch(self, h: Header) -> None:
        rid = h["id"]
        path = realpath_beneath(h)["path"] if h.get("beneath") else os.path.normpath(h["path"])
        window = self.streams[rid] = Window()
        try:
            with DirWatch(path, recursive=bool(h.get("recursive"))) as watch:
                self.send({"id": rid, "ev": "open"})
                while not window.cancelled:
                    watch.poll(WATCH_TICK_S)
                    while watch.pending and not window.cancelled:
                        if window.room() < WATCH_BATCH:
                            window.wait(WATCH_TICK_S)  # the host is behind: inotify keeps queueing, bounded
                            watch.poll(0)
                            continue
                        payload = watch.take(WATCH_BATCH)
                        window.take(len(payload) + FRAME_COST)
                        self.send({"id": rid, "ev": "data"}, payload)
        finally:
            self.streams.pop(rid, None)
        # Only a kill ends a watch (as envd's, it outlives its directory), and a killed request gets no last frame.

    def op_tunnel(self, h: Header) -> None:
        rid = h["id"]
        tunnel = self.tunnels[rid]
        try:
            port = h.get("port")
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ValueError(f"port must be a number from 1 to 65535, got {port!r}")
            tunnel.connect(port)
            self.streams[rid] = tunnel.window
            if tunnel.killed:
                return
            self.send({"id": rid, "ev": "open"})
            ended = tunnel.relay(rid, self.send)
        finally:
            self.tunnels.pop(rid, None)
            self.streams.pop(rid, None)
            tunnel.close()
        if ended:
            self.send({"id": rid, "ev": "end"})


WATCH_TICK_S = 0.1
"""How often a watch looks whether it was stopped while no event arrives."""
WATCH_BATCH = 64 * 1024
"""The largest payload of one watch frame (a JSON batch of events)."""
WATCH_MAX_PENDING = 4096
"""Events a watch holds while the host does not take them; past this the oldest are dropped (and counted)."""
_IN_MODIFY, _IN_ATTRIB, _IN_MOVED_FROM, _IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
_IN_CREATE, _IN_DELETE, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
_IN_Q_OVERFLOW, _IN_IGNORED, _IN_ISDIR = 0x4000, 0x8000, 0x40000000
_IN_ONLYDIR, _IN_DONT_FOLLOW, _IN_EXCL_UNLINK = 0x01000000, 0x02000000, 0x04000000
_WATCH_MASK = (
    _IN_MODIFY | _IN_ATTRIB | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF
    | _IN_MOVE_SELF | _IN_ONLYDIR | _IN_DONT_FOLLOW | _IN_EXCL_UNLINK
)  # fmt: skip
# inotify bits -> event types, in the order envd (fsnotify) reports the operations of one event
_WATCH_TYPES = (
    (_IN_CREATE | _IN_MOVED_TO, "create"),
    (_IN_MOVED_FROM | _IN_MOVE_SELF, "rename"),
    (_IN_ATTRIB, "chmod"),
    (_IN_MODIFY, "write"),
    (_IN_DELETE | _IN_DELETE_SELF, "remove"),
)
_INOTIFY_EVENT = struct.Struct("iIII")


class DirWatch:
    """inotify on one directory (and, ``recursive``, every directory below it), as envd's ``WatchDir`` reports it.

    gVisor implements inotify for changes made inside the sandbox (tested under runsc: create, modify, attrib,
    moved_from/moved_to with a shared cookie, delete, and IN_ISDIR on a new directory), so no polling is needed.
    Event names are relative to the watched directory (``.`` for the directory itself); a directory created (or
    moved in) below a recursive watch is watched at once, and what it already holds by then is reported as created,
    so a file written right after ``mkdir`` is not missed. At most :data:`WATCH_MAX_PENDING` events wait for the
    host; past that the oldest are dropped and counted in the next batch's ``dropped``.
    """

    def __init__(self, path: str, *, recursive: bool) -> None:
        if not statlib.S_ISDIR(os.stat(path).st_mode):  # a missing path raises FileNotFoundError (kind not_found)
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        self.root = path
        self.recursive = recursive
        self.pending: collections.deque[tuple[str, str]] = collections.deque(maxlen=WATCH_MAX_PENDING)
        self.dropped = 0
        self.dirs: dict[int, str] = {}  # watch descriptor -> its directory, relative to the root ("" for the root)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify is not available: {os.strerror(err)}")
        try:
            self._add("", report=False)
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> DirWatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.close(self.fd)

    def _add(self, rel: str, *, report: bool) -> None:
        """Watch the directory ``rel`` (and, recursive, those below it); ``report``: its entries are new."""
        full = os.path.join(self.root, rel) if rel else self.root
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(full), _WATCH_MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if rel and err in (errno.ENOENT, errno.ENOTDIR):
                return  # gone again before it could be watched: its removal is reported by its parent
            raise OSError(err, os.strerror(err), full)
        self.dirs[wd] = rel
        if not (self.recursive or report):
            return
        with contextlib.suppress(OSError), os.scandir(full) as entries:
            for entry in entries:
                name = os.path.join(rel, entry.name) if rel else entry.name
                if report:
                    self._push(name, "create")
                if self.recursive and entry.is_dir(follow_symlinks=False):
                    self._add(name, report=report)

    def _push(self, name: str, kind: str) -> None:
        if len(self.pending) == self.pending.maxlen:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                print(f"watch {self.root}: the host is behind, {self.dropped} events dropped", file=sys.stderr)
        self.pending.append((name, kind))

    def poll(self, timeout: float) -> None:
        """Read what inotify has (waiting up to ``timeout`` seconds for something) into :attr:`pending`."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return
        offset = 0
        while offset + _INOTIFY_EVENT.size <= len(data):
            wd, mask, _cookie, size = _INOTIFY_EVENT.unpack_from(data, offset)
            raw = data[offset + _INOTIFY_EVENT.size : offset + _INOTIFY_EVENT.size + size].rstrip(b"\0")
            offset += _INOTIFY_EVENT.size + size
            self._event(wd, mask, os.fsdecode(raw))

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & _IN_Q_OVERFLOW:
            self.dropped += 1  # the kernel's own queue overflowed: some events are lost
            return
        rel = self.dirs.get(wd)
        if rel is None:
            return
        if mask & _IN_IGNORED:
            self.dirs.pop(wd, None)  # the directory is gone (or unwatched)
            return
        if not name and rel:
            return  # a subdirectory's own removal or move: its parent reports it by name
        full = os.path.join(rel, name) if name else (rel or ".")
        for bits, kind in _WATCH_TYPES:
            if mask & bits:
                self._push(full, kind)
        if self.recursive and mask & _IN_ISDIR and mask & (_IN_CREATE | _IN_MOVED_TO) and name:
            self._add(full, report=True)

    def take(self, limit: int) -> bytes:
        """The next batch of pending events as a frame payload of at most about ``limit`` bytes."""
        events: list[list[str]] = []
        size = 0
        # Half the limit, plus one name of at most PATH_MAX escaped characters (6 bytes each at worst), stays below it.
        while self.pending and (not events or size < limit // 2):
            name, kind = self.pending.popleft()
            events.append([name, kind])
            size += len(json.dumps(name)) + 12  # as encoded: escapes make a name longer than its bytes
        payload = json.dumps({"events": events, "dropped": self.dropped}, separators=(",", ":"))
        self.dropped = 0
        return payload.encode(errors="surrogateescape")


class Window:
    """The flow-control window of one streamed request: bytes it may still send before the host grants more."""

    def __init__(self, limit: int = WINDOW) -> None:
        self.cond = threading.Condition()
        self.limit = limit
        self.credit = limit
        self.cancelled = False

    def room(self) -> int:
        """Payload bytes the next frame may carry (its header's cost is taken from the credit as well)."""
        return self.credit - FRAME_COST

    def take(self, n: int) -> None:
        with self.cond:
            self.credit -= n

    def grant(self, n: int) -> None:
        with self.cond:
            self.credit = min(self.credit + max(0, n), self.limit)
            self.cond.notify_all()

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()

    def wait(self, timeout: float) -> None:
        with self.cond:
            if self.credit <= FRAME_COST and not self.cancelled:
                self.cond.wait(timeout)


TUNNEL_CONNECT_S = 10.0
"""How long connecting to a port inside the sandbox may take (a listening server answers at once)."""
TUNNEL_HOSTS = ("127.0.0.1", "::1")
MAX_TUNNELS = 32
"""Connections to ports open at once: each holds a worker thread, and half the workers stay for commands and files
(a preview URL's visitors must not be able to starve the workspace's own exec)."""


class Tunnel:
    """One TCP connection to a server inside the sandbox, relayed over the agent's stream by one worker thread.

    Both directions are bounded: the server's bytes go out only within the host's credit (a :class:`Window` of
    :data:`TUNNEL_WINDOW`), and the host's bytes wait in :attr:`pending`, at most :data:`WINDOW` of them, granted
    back (``credit`` frames) as the server takes them. A host that sends past its credit breaks the tunnel, never the
    agent's memory.
    """

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()
        self.pending = bytearray()
        self.input_ended = False  # the host sent eof: shut the sending side once pending is written
        self.failure: str | None = None
        self.killed = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.window = _WakingWindow(self.wake)

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"\0")

    def connect(self, port: int) -> None:
        """Connect to ``port`` on the loopback addresses in turn; the last refusal is raised when none listens."""
        error: OSError | None = None
        for host in TUNNEL_HOSTS:
            try:
                sock = socket.create_connection((host, port), timeout=TUNNEL_CONNECT_S)
            except OSError as exc:
                error = error or exc  # the IPv4 answer says most (a sandbox may have no IPv6 at all)
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = sock
            return
        assert error is not None
        raise ConnectionRefusedError(
            error.errno or errno.ECONNREFUSED, f"nothing listens on port {port} ({error.strerror or error})"
        )

    def feed(self, data: bytes) -> None:
        """Queue the host's ``data`` for the server (the dispatch loop never blocks on a slow server)."""
        with self.lock:
            if len(self.pending) + len(data) > WINDOW:
                self.failure = f"the host sent more than {WINDOW} bytes the server has not taken yet"
            elif not self.input_ended:
                self.pending += data
        self.wake()

    def end_input(self) -> None:
        with self.lock:
            self.input_ended = True
        self.wake()

    def kill(self) -> None:
        self.killed = True
        self.window.cancel()

    def relay(self, rid: int, send: Callable[..., None]) -> bool:
        """Move bytes both ways until both sides are shut (True) or the tunnel is killed (False)."""
        sock = self.sock
        assert sock is not None
        reading = writing = True  # the server may still send; the host may still send
        poller = select.poll()
        poller.register(self.wake_r, select.POLLIN)
        watched = False  # a hung-up socket polls ready whatever is asked: watch it only when there is work for it
        while reading or writing:
            if self.killed or self.window.cancelled:
                return False
            with self.lock:
                pending, ended, failure = bool(self.pending), self.input_ended, self.failure
            if failure is not None:
                raise ValueError(failure)
            if writing and ended and not pending:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
                writing = False
                continue
            room = reading and self.window.room() > 0
            if room or pending:
                mask = (select.POLLIN if room else 0) | (select.POLLOUT if pending else 0)
                if watched:
                    poller.modify(sock, mask)
                else:
                    poller.register(sock, mask)
                watched = True
            elif watched:
                poller.unregister(sock)  # wait for credit, the host's data, its eof or a kill: all wake the pipe
                watched = False
            for fd, events in poller.poll(1000):
                if fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                    continue
                if pending and events & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                    with self.lock:
                        chunk = bytes(self.pending[:CHUNK])
                    try:
                        written = sock.send(chunk)
                    except BlockingIOError:
                        written = 0
                    if written:
                        with self.lock:
                            del self.pending[:written]
                        send({"id": rid, "ev": "credit", "bytes": written})
                if room and events & (select.POLLIN | select.POLLERR | select.POLLHUP):
                    try:
                        data = sock.recv(min(TUNNEL_CHUNK, self.window.room()))
                    except BlockingIOError:
                        continue
                    if data:
                        self.window.take(len(data) + FRAME_COST)
                        send({"id": rid, "ev": "data"}, data)
                    else:
                        reading = False
                        send({"id": rid, "ev": "eof"})
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)


class _WakingWindow(Window):
    """A :class:`Window` that also wakes the thread polling its tunnel when credit arrives or it is cancelled."""

    def __init__(self, wake: Callable[[], None]) -> None:
        super().__init__(TUNNEL_WINDOW)
        self._wake = wake

    def grant(self, n: int) -> None:
        super().grant(n)
        self._wake()

    def cancel(self) -> None:
        super().cancel()
        self._wake()


MAX_SHELLS = 16
"""Persistent shells kept at once: starting another closes the one used longest ago (its state is on disk)."""
SHELL_STATUS_MAX = 4096
"""The most a shell's control socket may hold without a complete status line before the shell is taken as broken."""
SHELL_EXIT_S = 1.0
"""How long a shell that closed its control socket may take to exit before it is killed."""
SHELL_DRAIN_MAX = 4 * 1024 * 1024
"""The most output read after a command's status: what background jobs write on without end waits for the next call."""


def _fresh_file(folder: int, name: str) -> int:
    """A new, empty regular file ``name`` in the directory ``folder``, opened for writing: whatever was there (a FIFO
    that would block the open, a hard link to someone else's file, a symlink) is unlinked first, and the file is
    created exclusively. Raises FileExistsError when something keeps taking the name."""
    for _ in range(3):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=folder)
        try:
            return os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder
            )
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "something in the workspace keeps creating it", name)


def make_shell_dir(directory: str, account: Account | None) -> None:
    """Create a shell's state directory (mode 0700, owned by its user) unless it exists."""
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if account is not None:
            os.chown(directory, account.uid, account.gid, follow_symlinks=False)


class Shell:
    """A persistent shell of the ``shell`` op: a process the host's driver script runs (``bash -c DRIVER``), kept
    between calls so that a command costs no process start of its own.

    Its stdin is ``control``, one end of a socket pair: per call the agent writes the command to ``<dir>/command``
    and a serial number plus newline to the socket; the driver reads the file, runs the command (stdin /dev/null,
    stdout and stderr the shell's pipes to the agent) and answers ``<serial> <status>`` on the socket. The answer
    wakes the agent's poll: completion is signalled, never polled for. A line with another serial (a command that
    wrote to the socket itself) is ignored. When the shell ends instead (``exit``, ``set -e``, ``exec``), its exit
    status is the command's; a deadline or a kill ends it with its process group. Calls take ``lock`` in turn.
    """

    __slots__ = ("buffer", "control", "lock", "proc", "serial", "spec", "used")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: Process | None = None
        self.control: socket.socket | None = None
        self.spec: tuple[Any, ...] = ()
        self.serial = 0
        self.buffer = b""
        self.used = time.monotonic()

    def hand_over(self, command: str, directory: str, account: Account | None) -> None:
        """Write ``command`` where the driver reads it, then wake the driver (a shell that died meanwhile is seen
        by the caller's loop)."""
        assert self.control is not None
        make_shell_dir(directory, account)
        folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fd = _fresh_file(folder, "command")
        finally:
            os.close(folder)
        try:
            if account is not None:
                os.fchown(fd, account.uid, account.gid)
            view = memoryview(command.encode("utf-8", "surrogateescape"))
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        self.serial += 1
        self.buffer = b""
        with contextlib.suppress(OSError):
            self.control.sendall(b"%d\n" % self.serial)

    def take_status(self, poller: select.poll) -> tuple[int | None, bool]:
        """Read the control socket: ``(status, False)`` once this call's status line came, ``(None, True)`` when the
        shell closed it or wrote past :data:`SHELL_STATUS_MAX` without one, else ``(None, False)``."""
        assert self.control is not None
        try:
            data = self.control.recv(SHELL_STATUS_MAX)
        except OSError:
            data = b""
        if not data:
            poller.unregister(self.control.fileno())
            return None, True
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            serial, _, status = line.partition(b" ")
            if serial == b"%d" % self.serial and status.isdigit() and len(status) <= 3:
                return int(status), False
        if len(self.buffer) > SHELL_STATUS_MAX:
            poller.unregister(self.control.fileno())
            return None, True
        return None, False

    def close(self) -> None:
        """End the shell and everything left in its process group (its background jobs too)."""
        proc, control = self.proc, self.control
        self.proc = self.control = None
        self.spec = ()
        if control is not None:
            control.close()
        if proc is not None:
            kill_group(proc)
            proc.poll()
            if isinstance(proc, Spawned):
                proc.close()
            else:
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()


class Terminal:
    """The master side of a running pty command: input waiting for the terminal to take it, and a pipe that wakes
    the thread serving the command when some arrives."""

    MAX_PENDING = 1024 * 1024
    """Typed bytes the terminal may lag behind (a command that reads no input); more is refused."""

    def __init__(self, master: int, slave: int) -> None:
        self.master = master
        self.slave: int | None = slave
        os.set_blocking(master, False)
        self.lock = threading.Lock()
        self.pending = bytearray()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.closed = False
        self.killed = False

    def feed(self, data: bytes) -> None:
        """Queue ``data`` for the terminal, written by its thread as the terminal takes it."""
        with self.lock:
            if self.closed:
                raise ValueError("the terminal has ended")
            if len(self.pending) + len(data) > self.MAX_PENDING:
                raise ValueError(f"the command has not read {len(self.pending)} bytes of input; wait for it")
            self.pending += data
            with contextlib.suppress(OSError):
                os.write(self.wake_w, b"\0")

    def flush(self) -> None:
        """Write what the terminal takes now (the master is non-blocking)."""
        with self.lock:
            try:
                written = os.write(self.master, self.pending[:CHUNK]) if self.pending else 0
            except BlockingIOError:
                return
            except OSError:
                written = len(self.pending)  # the terminal is gone: its input with it
            del self.pending[:written]

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size; the kernel sends SIGWINCH to its foreground process group."""
        with self.lock:
            if not self.closed:
                fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def close_slave(self) -> None:
        """Drop the agent's copy of the slave side once the command has its own."""
        if self.slave is not None:
            os.close(self.slave)
            self.slave = None

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.close_slave()
            for fd in (self.master, self.wake_r, self.wake_w):
                os.close(fd)


def _size(h: Header) -> tuple[int, int]:
    """The ``rows`` and ``cols`` of a request, checked (a terminal's size is two 16-bit numbers)."""
    rows, cols = h.get("rows", 24), h.get("cols", 80)
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            raise ValueError(f"{name} must be between 1 and 65535, got {value!r}")
    return rows, cols


def _take_terminal() -> None:
    """In the child, after setsid: make its stdin (the pty slave) the controlling terminal of its new session."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Workers:
    """Daemon threads that are reused: starting a thread costs about 1.5 ms under gVisor's ptrace platform.

    At most MAX_WORKERS run; further jobs wait for one (every thread counts against the sandbox's pids limit).
    """

    MAX_WORKERS = 64

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.SimpleQueue()
        self.idle = 0  # threads waiting for a job
        self.queued = 0  # jobs no thread has taken yet
        self.threads = 0
        self.lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self.lock:
            self.queued += 1
            if self.queued > self.idle and self.threads < self.MAX_WORKERS:
                self.threads += 1
                threading.Thread(target=self.run, daemon=True).start()
        self.jobs.put((fn, args))

    def run(self) -> None:
        while True:
            with self.lock:
                self.idle += 1
            fn, args = self.jobs.get()
            with self.lock:
                self.idle -= 1
                self.queued -= 1
            fn(*args)  # guarded: never raises


def file_info(
    path: str, dir_fd: int | None = None, name: str | None = None, names: dict[str, dict[int, str]] | None = None
) -> Header:
    """lstat of ``path``, or of ``name`` in the directory ``dir_fd`` (reported as ``path``).

    ``names`` caches the user and group tables for the entries of one listing; each request reads them afresh, so
    users added meanwhile are seen.
    """
    at = path if name is None else name
    st = os.stat(at, dir_fd=dir_fd, follow_symlinks=False)
    cache = {} if names is None else names
    mode = st.st_mode
    if statlib.S_ISREG(mode):
        kind = "file"
    elif statlib.S_ISDIR(mode):
        kind = "dir"
    elif statlib.S_ISLNK(mode):
        kind = "symlink"
    else:
        kind = "other"
    return {
        "path": path,
        "name": os.path.basename(path.rstrip("/")) or "/",
        "type": kind,
        "size": st.st_size,
        "mode": statlib.S_IMODE(mode),
        "mtime": st.st_mtime,
        "symlink_target": os.readlink(at, dir_fd=dir_fd) if kind == "symlink" else None,
        "owner": _id_name(cache, "/etc/passwd", st.st_uid),
        "group": _id_name(cache, "/etc/group", st.st_gid),
    }


def _id_name(cache: dict[str, dict[int, str]], table: str, number: int) -> str:
    """The name of a uid (``table`` /etc/passwd) or gid (/etc/group), or the number in digits, as envd reports it.

    The tables are read as text, never through NSS (``pwd``/``grp``): NSS loads the modules /etc/nsswitch.conf names
    from the image's library directories, which would run a library the workspace controls inside the agent.
    """
    if table not in cache:
        cache[table] = {}
        with contextlib.suppress(OSError):
            fd = os.open(table, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)  # a FIFO must not block us
            try:
                data = os.read(fd, 1 << 20) if statlib.S_ISREG(os.fstat(fd).st_mode) else b""
            finally:
                os.close(fd)
            for line in data.decode(errors="replace").splitlines():
                fields = line.split(":")
                if len(fields) > 2 and fields[2].isascii() and fields[2].isdigit() and not line.startswith("#"):
                    cache[table].setdefault(int(fields[2]), fields[0])  # the first entry wins, as in getpwuid
    return cache[table].get(number, str(number))


# --- paths confined beneath a root ---------------------------------------------------------------------------------
#
# A file request carrying ``beneath`` (the host sends "/workspace") has its path resolved by a walk, one component at
# a time, from a descriptor of the root: every open names a single component relative to the directory descriptor
# reached so far and uses O_NOFOLLOW, so the kernel never follows a symlink. Symlinks on the way are read and
# followed by the walk itself (at most MAX_SYMLINK_HOPS): a relative target goes on from the symlink's directory, an
# absolute one from the root, and only when it lies under the root; ``..`` pops a descriptor, never the root's. The
# operation itself is then done relative to the descriptor of the last directory (openat, unlinkat, renameat,
# fstatat, fchmodat without following). Walked directories are held by descriptor, so a process in the sandbox that
# swaps one for a symlink while we work changes nothing. Linux's openat2(RESOLVE_BENEATH) would do this in the
# kernel, but gVisor answers ENOSYS. What no walk sees is a held directory renamed out of the root meanwhile; the
# root is a mount point, so such a rename fails with EXDEV.

MAX_SYMLINK_HOPS = 40
_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)  # O_PATH needs no read permission on the directory
_STEP = _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RACE_RETRIES = 5  # walks started again when the last component turned into a symlink under our feet
_GLOB_MAGIC = re.compile(r"[*?[]")
T = TypeVar("T")


class EscapeError(Exception):
    """A confined path, a symlink on its way or a ``..`` leads outside the root it must stay beneath."""


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """OSErrors raised inside name ``path``, as requested, rather than the one component the failing call saw."""
    try:
        yield
    except OSError as exc:
        exc.filename = path
        raise


class Beneath:
    """One walk of ``path`` beneath ``root``; a context manager that closes the descriptors it opened."""

    def __init__(self, root: str, path: str) -> None:
        if not isinstance(root, str) or not root.startswith("/"):
            raise ValueError(f"beneath: must be an absolute directory, got {root!r}")
        self.root = "/" + os.path.normpath(root).lstrip("/")
        self.path = path
        self.fds: list[int] = []  # the root's descriptor, then one per directory walked into
        self.names: list[str] = []  # the names of the directories walked into, below the root
        self.tail: list[str] = []  # components kept as text from the first missing one on (realpath)
        self.via = ""  # the last symlink followed, for the message of an escape

    def __enter__(self) -> Beneath:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close_from(0)

    def _close_from(self, depth: int) -> None:
        while len(self.fds) > depth:
            os.close(self.fds.pop())
        del self.names[max(depth - 1, 0) :]

    @property
    def dir_fd(self) -> int:
        """The directory the walk has reached."""
        return self.fds[-1]

    def real(self, name: str = ".") -> str:
        """The absolute path of ``name`` in the directory reached, symlinks resolved."""
        parts = [*self.names, *self.tail, *([] if name == "." else [name])]
        return "/".join([self.root.rstrip("/"), *parts]) or "/"

    def escape(self, why: str) -> EscapeError:
        return EscapeError(f"{self.path!r} leads outside {self.root}{why}; paths must stay inside {self.root}")

    def _inside(self, path: str) -> list[str] | None:
        """The components of ``path`` below the root, or None when it does not lie under the root."""
        if path == self.root:
            return []
        if self.root == "/" or path.startswith(self.root + "/"):
            return [p for p in path[len(self.root) :].split("/") if p not in ("", ".")]
        return None

    def resolve(self, *, follow: bool, create: bool = False, lexical_tail: bool = False) -> str:
        """Walk to the directory holding the path's last component and return that component's name.

        The name is ``"."`` when the path is the directory reached itself: the root, a path ending in ``..``, or with
        ``follow`` one naming a directory. ``follow`` follows a final symlink too; ``create`` makes missing
        directories on the way; ``lexical_tail`` (realpath) keeps the components from the first missing one on as
        text in ``tail`` instead of failing.

        Raises:
            EscapeError: the path, a symlink on its way or a ``..`` leads outside the root.
        """
        self._close_from(0)
        self.tail, self.via = [], ""
        self.fds.append(os.open(self.root, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))  # the root itself is trusted
        if self.path.startswith("/"):
            inside = self._inside(self.path)
            if inside is None:
                raise self.escape("")
            todo = inside[::-1]
        else:
            todo = [p for p in self.path.split("/") if p not in ("", ".")][::-1]
        steps = 0
        while todo:
            part = todo.pop()
            if part == "..":
                if self.tail:
                    self.tail.pop()
                elif self.names:
                    self._close_from(len(self.fds) - 1)
                else:
                    raise self.escape(self.via or " through '..'")
                continue
            last = not todo
            if self.tail:
                self.tail.append(part)
                continue
            if last and not follow:
                return part
            try:
                fd = os.open(part, _STEP, dir_fd=self.dir_fd)
            except FileNotFoundError:
                if last:
                    return part  # the caller creates it, or reports it missing
                if create and steps < MAX_SYMLINK_HOPS:
                    steps += 1
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=self.dir_fd)
                    todo.append(part)
                    continue
                if lexical_tail:
                    self.tail.append(part)
                    continue
                raise
            mode = os.fstat(fd).st_mode
            if statlib.S_ISDIR(mode):
                self.fds.append(fd)
                self.names.append(part)
                continue
            if statlib.S_ISLNK(mode):
                try:
                    target = os.readlink("", dir_fd=fd)  # the link the open found, not whatever the name is now
                finally:
                    os.close(fd)
                steps += 1
                if steps > MAX_SYMLINK_HOPS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), self.path)
                self.via = f" through the symlink {self.real(part)} -> {target}"
                if target.startswith("/"):
                    inside = self._inside(target)  # its ``..`` are walked like any other, never above the root
                    if inside is None:
                        raise self.escape(self.via)
                    self._close_from(1)
                    todo.extend(inside[::-1])
                elif target:
                    todo.extend([p for p in target.split("/") if p not in ("", ".")][::-1])
                else:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), self.path)
                continue
            os.close(fd)
            if last:
                return part
            if lexical_tail:
                self.tail.append(part)
                continue
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), self.path)
        return "."


def _at(root: str, path: str, act: Callable[[int, str], T], *, follow: bool, create: bool = False) -> T:
    """Resolve ``path`` beneath ``root`` and return ``act(dir_fd, name)`` for its last component.

    Every final call opens with O_NOFOLLOW; when it fails with ELOOP the last component became a symlink after the
    walk looked at it, and the walk starts again (that symlink is then followed, or refused, by the walk).
    """
    for attempt in range(_RACE_RETRIES):
        with Beneath(root, path) as walk, _naming(path):
            name = walk.resolve(follow=follow, create=create)
            try:
                return act(walk.dir_fd, name)
            except OSError as exc:
                if exc.errno != errno.ELOOP or attempt + 1 == _RACE_RETRIES:
                    raise
    raise AssertionError("unreachable")


def open_beneath(h: Header) -> BinaryIO:
    """``read``: the file at ``path``, opened for reading beneath ``beneath``."""

    def act(dir_fd: int, name: str) -> BinaryIO:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        if statlib.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), h["path"])
        return os.fdopen(fd, "rb")

    return _at(h["beneath"], h["path"], act, follow=True)


def writable_file(fd: int, path: str, owner: Account | None) -> None:
    """Check that ``fd`` (opened without truncating, non-blocking: a FIFO that nobody reads would block the agent)
    is a regular file, and, when it is to be given to ``owner``, not a hard link of some other file (which a user of
    the workspace could plant to be handed, say, /etc/shadow); then truncate it and make its writes blocking.
    Closes ``fd`` and raises ValueError otherwise."""
    try:
        info = os.fstat(fd)
        if not statlib.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a regular file (a FIFO, device or socket); remove it first")
        if owner is not None and info.st_nlink > 1 and info.st_uid != owner.uid:
            raise ValueError(f"{path}: has other hard links and another owner; remove it first")
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise


def create_beneath(h: Header) -> int:
    """``write``: a descriptor of the file at ``path``, created (parents too) or truncated, beneath ``beneath``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # truncated by writable_file
    mode = h.get("mode") or 0o644
    return _at(h["beneath"], h["path"], lambda d, n: os.open(n, flags, mode, dir_fd=d), follow=True, create=True)


def stat_beneath(h: Header) -> Header:
    """``stat`` of ``path`` beneath ``beneath`` (a final symlink is reported, not followed)."""
    return _at(h["beneath"], h["path"], lambda d, n: file_info(h["path"], d, n), follow=False)


def list_beneath(h: Header) -> Header:
    """``list`` of the directory at ``path`` beneath ``beneath``."""
    path = h["path"]

    def act(dir_fd: int, name: str) -> Header:
        fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
        try:
            out: list[Header] = []
            owners: dict[str, dict[int, str]] = {}
            for entry in sorted(os.listdir(fd)):
                try:
                    out.append(file_info(os.path.join(path, entry), fd, entry, owners))
                except FileNotFoundError:
                    continue  # removed while we listed
            return {"entries": out}
        finally:
            os.close(fd)

    return _at(h["beneath"], path, act, follow=True)


def delete_beneath(h: Header) -> Header:
    """``delete`` of ``path`` beneath ``beneath``; a final symlink is removed, not followed."""

    def act(dir_fd: int, name: str) -> Header:
        if name == ".":
            raise OSError(errno.EBUSY, "refusing to delete the directory the path ends in", h["path"])
        if statlib.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            if h.get("recursive"):
                import shutil  # noqa: PLC0415 - lazy: see the imports

                shutil.rmtree(name, dir_fd=dir_fd)  # fd-based: it never follows a symlink either
            else:
                os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
        return {}

    return _at(h["beneath"], h["path"], act, follow=False)


def move_beneath(h: Header) -> Header:
    """``move`` of ``src`` to ``dst`` (parents created), both beneath ``beneath``; symlinks are moved, not followed."""
    with Beneath(h["beneath"], h["src"]) as src, Beneath(h["beneath"], h["dst"]) as dst:
        with _naming(h["src"]):
            src_name = src.resolve(follow=False)
        with _naming(h["dst"]):
            dst_name = dst.resolve(follow=False, create=True)
        with _naming(h["src"]):
            os.rename(src_name, dst_name, src_dir_fd=src.dir_fd, dst_dir_fd=dst.dir_fd)
    return {}


def chmod_beneath(h: Header) -> Header:
    """``chmod`` of ``path`` beneath ``beneath``; a final symlink inside the root is followed by the walk."""

    def act(dir_fd: int, name: str) -> Header:
        os.chmod(name, h["mode"], dir_fd=dir_fd, follow_symlinks=False)
        return {}

    return _at(h["beneath"], h["path"], act, follow=True)


def mkdir_beneath(h: Header) -> Header:
    """``mkdir`` of ``path`` and its parents beneath ``beneath``."""
    exist_ok = h.get("exist_ok", True)

    def act(dir_fd: int, name: str) -> Header:
        if name != ".":
            try:
                os.mkdir(name, 0o777, dir_fd=dir_fd)
                return {}
            except FileExistsError:
                if not statlib.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    raise
        if not exist_ok:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), h["path"])
        return {}

    return _at(h["beneath"], h["path"], act, follow=True, create=True)


def realpath_beneath(h: Header) -> Header:
    """``realpath`` of ``path`` beneath ``beneath``; missing trailing components are kept as they are."""
    with Beneath(h["beneath"], h["path"]) as walk, _naming(h["path"]):
        return {"path": walk.real(walk.resolve(follow=True, lexical_tail=True))}


def glob_beneath(h: Header) -> Header:
    """``glob`` under ``root`` beneath ``beneath``: symlinks are matched as entries but never walked into."""
    root, pattern, limit = h.get("root") or h["beneath"], h["pattern"], h.get("limit") or 10000
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    if pattern.startswith("/") or ".." in parts or not parts:
        raise EscapeError(f"pattern {pattern!r} must be relative to {root} and must not contain '..'")
    dirs_only, hidden = pattern.endswith("/"), bool(h.get("hidden", False))

    def act(dir_fd: int, name: str) -> Header:
        fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
        found: set[str] = set()
        matches = _glob_walk(fd, "", parts, hidden=hidden, dirs_only=dirs_only)
        try:
            for rel in matches:
                found.add(rel)
                if len(found) > limit:
                    break
        finally:
            matches.close()
            os.close(fd)
        paths = sorted(os.path.normpath(os.path.join(root, rel)) for rel in found)
        return {"paths": paths[:limit], "truncated": len(paths) > limit}

    try:
        return _at(h["beneath"], root, act, follow=True)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(errno.ENOENT, "no such directory", root) from None


def _scan(fd: int) -> list[tuple[str, bool]]:
    """The entries of the directory ``fd`` as (name, is a real directory), sorted; nothing if it cannot be read."""
    try:
        with os.scandir(fd) as entries:
            return sorted((e.name, e.is_dir(follow_symlinks=False)) for e in entries)
    except OSError:
        return []


def _glob_walk(fd: int, prefix: str, parts: list[str], *, hidden: bool, dirs_only: bool) -> Generator[str]:
    """Relative paths under the directory ``fd`` matching ``parts`` by glob's rules (``**`` spans directories,
    hidden names need ``hidden`` or a pattern that spells the dot), walking into real directories only."""
    head, rest = parts[0], parts[1:]
    if head == "**":
        if rest:
            yield from _glob_walk(fd, prefix, rest, hidden=hidden, dirs_only=dirs_only)
        for name, is_dir in _scan(fd):
            if name.startswith(".") and not hidden:
                continue
            if not rest and (is_dir or not dirs_only):
                yield prefix + name
            if is_dir:
                yield from _glob_into(fd, name, prefix, parts, hidden=hidden, dirs_only=dirs_only)
        return
    if _GLOB_MAGIC.search(head):
        import fnmatch  # noqa: PLC0415 - lazy: see the imports

        show_hidden = hidden or head.startswith(".")
        candidates = [
            (n, d) for n, d in _scan(fd) if fnmatch.fnmatchcase(n, head) and (show_hidden or not n.startswith("."))
        ]
    else:
        try:
            candidates = [(head, statlib.S_ISDIR(os.stat(head, dir_fd=fd, follow_symlinks=False).st_mode))]
        except OSError:
            return
    for name, is_dir in candidates:
        if not rest:
            if is_dir or not dirs_only:
                yield prefix + name
        elif is_dir:
            yield from _glob_into(fd, name, prefix, rest, hidden=hidden, dirs_only=dirs_only)


def _glob_into(fd: int, name: str, prefix: str, parts: list[str], *, hidden: bool, dirs_only: bool) -> Iterator[str]:
    try:
        sub = os.open(name, _OPEN_DIR, dir_fd=fd)
    except OSError:
        return  # gone, or swapped for a symlink meanwhile: not walked into
    try:
        yield from _glob_walk(sub, f"{prefix}{name}/", parts, hidden=hidden, dirs_only=dirs_only)
    finally:
        os.close(sub)


def usage_beneath(h: Header) -> Header:
    """``usage``: bytes allocated under ``path`` beneath ``beneath``, counted without following any symlink."""

    def act(dir_fd: int, name: str) -> Header:
        fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
        total = 0
        try:
            for _, dirnames, filenames, walked in os.fwalk(".", dir_fd=fd):
                for entry in dirnames + filenames:
                    with contextlib.suppress(OSError):
                        total += os.stat(entry, dir_fd=walked, follow_symlinks=False).st_blocks * 512
        finally:
            os.close(fd)
        return {"bytes": total}

    return _at(h["beneath"], h["path"], act, follow=True)


def output_turn(
    proc: Process, deadline: float | None, timed_out: bool, exited_at: float | None
) -> tuple[bool, float | None, float | None]:
    """One turn of the loop reading a command's output (pipes or a terminal): kill its group at the deadline and
    note when it exited. Returns ``(timed_out, exited_at, wait)``: how long to wait for output before the next turn,
    or None once it is time to stop reading (a background child may keep the output open after the command exits:
    it is read for 0.25 s more)."""
    now = time.monotonic()
    if deadline is not None and not timed_out and now >= deadline:
        timed_out = True
        kill_group(proc)
    if exited_at is None and proc.poll() is not None:
        exited_at = now
    if exited_at is not None and now - exited_at > 0.25:
        return timed_out, exited_at, None
    wait = 0.05 if exited_at is None else 0.25 - (now - exited_at)
    if deadline is not None and not timed_out:
        wait = min(wait, deadline - now)
    return timed_out, exited_at, wait


def kill_group(proc: Process) -> None:
    """SIGKILL every process in the command's process group, again until none is left (a forking group can add
    members while the first signal is delivered). Up to a second: a command the spawner started is reaped by the
    spawner, so its leader's zombie can keep the group alive a little longer than our own child's would."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        proc.poll()  # reap the leader (or hear that the spawner did), so its zombie does not keep the group alive
        if time.monotonic() >= deadline:
            return
        time.sleep(0.001)


_ERRNO_KINDS = {
    errno.ENOENT: "not_found",
    errno.EEXIST: "exists",
    errno.ENOTDIR: "not_a_directory",
    errno.EISDIR: "is_a_directory",
    errno.ENOTEMPTY: "not_empty",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.ECONNREFUSED: "refused",
}


def describe_error(exc: BaseException) -> tuple[str, str | None]:
    if isinstance(exc, EscapeError):
        return "escape", str(exc)
    if isinstance(exc, OSError) and exc.errno in _ERRNO_KINDS:
        where = exc.filename if exc.filename is not None else ""
        return _ERRNO_KINDS[exc.errno], f"{where}: {exc.strerror}" if where else exc.strerror
    if isinstance(exc, (KeyError, TypeError, ValueError)):
        return "invalid", f"bad request: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):
        return "os", f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc)
    return "os", f"{type(exc).__name__}: {exc}"


def not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: processes without CAP_SYS_PTRACE (everything in a workspace) can no longer ptrace the agent
    or open its /proc/<pid>/fd, mem and maps, so they cannot write into its frame stream or read the host's requests.
    Enforced by Linux under runc; gVisor release 20221219 does not enforce it (the host's checks still hold)."""
    with contextlib.suppress(Exception):  # without libc's prctl the agent just stays dumpable
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


# --- the spawner ---------------------------------------------------------------------------------------------------
#
# gVisor restores only the container's own process tree after a checkpoint: processes started by `docker exec` (the
# agent) and everything they start are gone. So the container's main process is a spawner (spawner.c, a static
# binary in the same read-only runtime), and the agent asks it to start every command: commands, and the daemons they
# leave behind, are the spawner's children and come back after a restore. Its protocol is in spawner.c.

SPAWNER_SOCKET = "/run/corral/spawner.sock"


class Account:
    """A user of the workspace, as its /etc/passwd names it."""

    __slots__ = ("gid", "home", "name", "shell", "uid")

    def __init__(self, name: str, uid: int, gid: int, home: str, shell: str) -> None:
        self.name, self.uid, self.gid, self.home, self.shell = name, uid, gid, home, shell

    def env(self) -> dict[str, str]:
        """What login sets for this user (E2B sets the same for a command's user)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell}


def makedirs_owned(path: str, owner: Account | None) -> None:
    """``os.makedirs(path, exist_ok=True)``, the directories it creates given to ``owner`` (envd creates a user's
    parent directories as that user). ``lchown``: a directory swapped for a symlink meanwhile changes nothing else."""
    missing: list[str] = []
    head = path
    while head and head != os.path.dirname(head) and not os.path.isdir(head):
        missing.append(head)
        head = os.path.dirname(head)
    os.makedirs(path, exist_ok=True)
    if owner is not None:
        for directory in reversed(missing):
            os.chown(directory, owner.uid, owner.gid, follow_symlinks=False)


def lookup_account(name: str, passwd: str = "/etc/passwd") -> Account:
    """The account ``name`` from the workspace's ``passwd`` file, read as text.

    Not Python's ``pwd``: it goes through NSS, which loads shared libraries from the workspace's image into the
    agent. Raises ValueError naming the user when there is no such account.
    """
    try:
        with open(passwd, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.rstrip("\n").split(":")
                if len(fields) >= 7 and fields[0] == name and fields[2].isdigit() and fields[3].isdigit():
                    return Account(name, int(fields[2]), int(fields[3]), fields[5] or "/", fields[6] or "/bin/sh")
    except FileNotFoundError:
        pass
    raise ValueError(f"user {name!r} does not exist in this workspace (no such entry in {passwd})")


SPAWNER_BOOT_S = 10.0
SPAWNER_REPLY_S = 10.0
SPAWNER_MESSAGE_MAX = 64 * 1024
_SPAWN_ERRORS = {errno.ENOENT: FileNotFoundError, errno.EACCES: PermissionError}


_null_fd: int | None = None


def _devnull() -> int:
    """A descriptor of /dev/null, opened once: every command's stdin."""
    global _null_fd  # noqa: PLW0603 - one descriptor for the agent's lifetime
    if _null_fd is None:
        _null_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return _null_fd


class Spawned:
    """A command the spawner started: ``pid``, ``stdout``/``stderr`` (pipes to the agent), and Popen's ``poll`` and
    ``wait``, answered by the spawner's connection (it sends the exit status when the command ends)."""

    def __init__(self, sock: socket.socket, pid: int, stdout: BinaryIO | None, stderr: BinaryIO | None) -> None:
        self.sock = sock
        self.pid = pid
        self.stdout: BinaryIO | None = stdout
        self.stderr: BinaryIO | None = stderr
        self.returncode: int | None = None
        self.buffer = b""

    @classmethod
    def start(
        cls,
        sock: socket.socket,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        *,
        uid: int = -1,
        gid: int = -1,
        terminal: int | None = None,
        stdin: int | None = None,
    ) -> Spawned:
        """Ask the spawner to start ``argv``, as ``uid``/``gid`` unless -1; raises FileNotFoundError,
        PermissionError or OSError as Popen would.

        Without ``terminal`` the command's stdin is /dev/null (or the descriptor ``stdin``) and its stdout and stderr
        are pipes (``stdout``, ``stderr``). With it (the slave side of a pty, which the caller keeps open until this
        returns), that is the command's stdin, stdout, stderr and controlling terminal, and ``stdout``/``stderr`` are
        None: the caller reads the pty's master.
        """
        head = [str(len(argv)), str(len(env)), cwd, str(uid), str(gid), "0" if terminal is None else "1"]
        strings = [*head, *argv, *(f"{k}={v}" for k, v in env.items())]
        if any("\0" in item for item in strings):
            raise ValueError("embedded null byte")  # what Popen raises for one
        if terminal is None:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            given, ours, closed = [_devnull() if stdin is None else stdin, out_w, err_w], [out_r, err_r], [out_w, err_w]
        else:
            given, ours, closed = [terminal] * 3, [], []
        try:
            request = b"".join(item.encode("utf-8", "surrogateescape") + b"\0" for item in strings)
            # One message: every system call costs tens of microseconds under gVisor's ptrace platform.
            sent = socket.send_fds(sock, [struct.pack(">I", len(request)), request], given)
            if sent < len(request) + 4:
                sock.sendall((struct.pack(">I", len(request)) + request)[sent:])
        except OSError:
            for fd in ours:
                os.close(fd)
            sock.close()
            raise
        finally:
            for fd in closed:
                os.close(fd)
        if terminal is None:
            spawned = cls(sock, 0, os.fdopen(out_r, "rb", 0), os.fdopen(err_r, "rb", 0))
        else:
            spawned = cls(sock, 0, None, None)
        try:
            kind, value = spawned.message(SPAWNER_REPLY_S)  # a spawner that never answers must not hold a worker
        except subprocess.TimeoutExpired:
            kind, value = "error fork", errno.ETIMEDOUT
        if kind == "pid":
            spawned.pid = value
            return spawned
        spawned.close()
        if kind in {"error exec", "error cwd"}:
            filename = argv[0] if kind == "error exec" else cwd
            raise _SPAWN_ERRORS.get(value, OSError)(value, os.strerror(value), filename)
        raise OSError(value or errno.EIO, "the spawner could not start the command")

    def message(self, timeout: float | None) -> tuple[str, int]:
        """The spawner's next message (``("pid", 42)``, ``("exit", 0)``...); ``("", 0)`` when the connection ended
        or said something else (the spawner died: the command is lost)."""
        self.sock.settimeout(timeout)
        while b"\n" not in self.buffer:
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, BlockingIOError):
                raise subprocess.TimeoutExpired("spawned", timeout or 0) from None
            except OSError:
                data = b""
            if not data or len(self.buffer) + len(data) > SPAWNER_MESSAGE_MAX:
                return "", 0
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        kind, _, value = line.decode("ascii", "replace").rpartition(" ")
        try:
            return kind, int(value)
        except ValueError:
            return "", 0

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.finish(self.message(0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        while self.returncode is None:
            self.finish(self.message(timeout))
        return self.returncode

    def finish(self, message: tuple[str, int]) -> None:
        kind, code = message
        self.returncode = code if kind == "exit" else -signal.SIGKILL
        self.sock.close()

    def close(self) -> None:
        self.sock.close()
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()


Process = subprocess.Popen[bytes] | Spawned


def main() -> None:
    not_dumpable()
    # stdout carries frames only; anything the agent prints by mistake goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = os.fdopen(os.dup(0), "rb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    Agent(inp, out).serve()
    # The host closed the stream and our commands are ended: leave at once. Interpreter teardown (joining workers,
    # freeing modules) costs tens of milliseconds under gVisor, and a pause waits for this process to be gone.
    os._exit(0)


if __name__ == "__main__":
    main()
