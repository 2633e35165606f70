"""The in-sandbox agent: one long-lived process per workspace that serves exec and file operations.

It runs INSIDE the sandbox (a gVisor or runc container, or a Firecracker VM), so it uses the standard library only
and must run on the Python of the base image (3.11, Debian bookworm). The host starts it once (``docker exec -i``,
or the VM's init, reached over vsock) and then speaks frames over the agent's stdin/stdout, many requests at once,
each tagged with an ``id``:

    frame := u32 header_len | header (UTF-8 JSON object) | u32 payload_len | payload (raw bytes)

Requests carry ``{"id": n, "op": ...}``; replies carry the same ``id`` and an ``ev``:

* ``exec {argv, cwd, env, timeout_s}`` -> ``out`` frames (``fd`` 1 or 2, payload = bytes as produced), then
  ``exit {code, timed_out, duration_ms}``. ``kill {target}`` kills a running exec's process group.
* ``read {path}`` -> ``open {size}``, ``data`` frames, ``end``. ``write {path, mode}`` -> the host then sends
  ``data`` frames and ``end`` with the same id -> ``result {bytes_written}``.
* ``stat``, ``list``, ``delete``, ``move``, ``chmod``, ``mkdir``, ``glob``, ``realpath``, ``usage``, ``ping`` ->
  ``result {...}``.
* Any failure -> ``error {kind, message}`` where kind is ``not_found``, ``exists``, ``not_a_directory``,
  ``is_a_directory``, ``not_empty``, ``permission``, ``invalid`` or ``os``.

Every exec runs in its own session (process group) so a deadline kills the command and all its children.
Diagnostics go to stderr, which the host logs; stdout carries frames only.
"""

from __future__ import annotations

import contextlib
import errno
import glob as globlib
import json
import os
import queue
import select
import shutil
import signal
import stat as statlib
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

PROTOCOL_VERSION = 1
CHUNK = 256 * 1024
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
    """Read one frame from a blocking binary stream; None at end of stream."""
    raw = _read_exact(stream, 4)
    if raw is None:
        return None
    head = _read_exact(stream, _LEN.unpack(raw)[0])
    if head is None:
        return None
    raw = _read_exact(stream, 4)
    if raw is None:
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
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # exec id -> Popen, for kill
        self.writes: dict[int, BinaryIO] = {}  # write id -> open file
        self.base_env = dict(os.environ)
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

    def result(self, rid: int, value: Header) -> None:
        self.send({"id": rid, "ev": "result", "result": value})

    def error(self, rid: int, exc: BaseException) -> None:
        kind, message = describe_error(exc)
        self.send({"id": rid, "ev": "error", "kind": kind, "message": message})

    # main loop ----------------------------------------------------------------------------------------------------
    def serve(self) -> None:
        self.send({"id": 0, "ev": "hello", "version": PROTOCOL_VERSION, "pid": os.getpid()})
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

    def dispatch(self, h: Header, payload: bytes) -> None:
        op, rid = h.get("op"), h.get("id", 0)
        if op == "data":  # a chunk of an open write: written inline, so writes stay ordered
            f = self.writes.get(rid)
            if f is not None:
                try:
                    f.write(payload)
                except Exception as exc:
                    self.writes.pop(rid, None)
                    f.close()
                    self.error(rid, exc)
            return
        if op == "end":
            f = self.writes.pop(rid, None)
            if f is not None:
                size = f.tell()
                f.close()
                self.result(rid, {"bytes_written": size})
            return
        if op == "write":
            path = h["path"]
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, h.get("mode") or 0o644)
            if h.get("mode") is not None:
                os.fchmod(fd, h["mode"])
            self.writes[rid] = os.fdopen(fd, "wb")
            self.send({"id": rid, "ev": "ready"})
            return
        if op == "kill":
            proc = self.procs.get(h["target"])
            if proc is not None:
                kill_group(proc)
            self.result(rid, {})
            return
        handler = getattr(self, "op_" + str(op), None)
        if handler is None:
            self.send({"id": rid, "ev": "error", "kind": "invalid", "message": f"unknown operation {op!r}"})
            return
        if op in ("exec", "read", "glob", "usage"):
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

    # operations ---------------------------------------------------------------------------------------------------
    def op_ping(self, h: Header) -> Header:
        return {"pid": os.getpid(), "version": PROTOCOL_VERSION}

    def op_exec(self, h: Header) -> None:
        rid = h["id"]
        env = dict(self.base_env)
        env.update(h.get("env") or {})
        started = time.monotonic()
        timeout = h.get("timeout_s")
        deadline: float | None = started + timeout if timeout else None
        try:
            proc = subprocess.Popen(
                h["argv"],
                cwd=h.get("cwd") or "/",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
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
                now = time.monotonic()
                if deadline is not None and not timed_out and now >= deadline:
                    timed_out = True
                    kill_group(proc)
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                # A background child may keep the pipes open after the command exits; stop reading soon after.
                if exited_at is not None and now - exited_at > 0.25:
                    break
                waits = [0.05 if exited_at is None else 0.25 - (now - exited_at)]
                if deadline is not None and not timed_out:
                    waits.append(deadline - now)
                for fd, _ in poller.poll(max(0, min(waits)) * 1000):
                    data = os.read(fd, CHUNK)
                    if data:
                        self.send({"id": rid, "ev": "out", "fd": fds[fd]}, data)
                    else:
                        poller.unregister(fd)
                        del fds[fd]
            code = proc.wait()
        finally:
            self.procs.pop(rid, None)
            stdout.close()
            stderr.close()
        if timed_out:
            kill_group(proc)  # children that outlived the leader
        self.send(
            {
                "id": rid,
                "ev": "exit",
                "code": 128 - code if code < 0 else code,
                "timed_out": timed_out,
                "duration_ms": (time.monotonic() - started) * 1000,
            }
        )
        return

    def op_read(self, h: Header) -> None:
        rid = h["id"]
        with open(h["path"], "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.send({"id": rid, "ev": "open", "size": size})
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                self.send({"id": rid, "ev": "data"}, chunk)
        self.send({"id": rid, "ev": "end"})
        return

    def op_stat(self, h: Header) -> Header:
        return file_info(h["path"])

    def op_list(self, h: Header) -> Header:
        path = h["path"]
        names = sorted(os.listdir(path))
        out: list[Header] = []
        for name in names:
            try:
                out.append(file_info(os.path.join(path, name)))
            except FileNotFoundError:
                continue  # removed while we listed
        return {"entries": out}

    def op_delete(self, h: Header) -> Header:
        path = h["path"]
        st = os.lstat(path)
        if statlib.S_ISDIR(st.st_mode):
            if h.get("recursive"):
                shutil.rmtree(path)
            else:
                os.rmdir(path)
        else:
            os.unlink(path)
        return {}

    def op_move(self, h: Header) -> Header:
        parent = os.path.dirname(h["dst"])
        if parent:
            os.makedirs(parent, exist_ok=True)
        os.rename(h["src"], h["dst"])
        return {}

    def op_chmod(self, h: Header) -> Header:
        os.chmod(h["path"], h["mode"])
        return {}

    def op_mkdir(self, h: Header) -> Header:
        os.makedirs(h["path"], exist_ok=h.get("exist_ok", True))
        return {}

    def op_realpath(self, h: Header) -> Header:
        return {"path": os.path.realpath(h["path"])}

    def op_glob(self, h: Header) -> Header:
        root, pattern, limit = h.get("root") or "/workspace", h["pattern"], h.get("limit") or 10000
        if not os.path.isdir(root):
            raise FileNotFoundError(errno.ENOENT, "no such directory", root)
        paths: list[str] = []
        for rel in globlib.iglob(pattern, root_dir=root, recursive=True, include_hidden=h.get("hidden", False)):
            paths.append(os.path.normpath(os.path.join(root, rel)))
            if len(paths) > limit:
                break
        paths.sort()
        return {"paths": paths[:limit], "truncated": len(paths) > limit}

    def op_usage(self, h: Header) -> Header:
        total = 0
        for dirpath, dirnames, filenames in os.walk(h["path"]):
            for name in dirnames + filenames:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
        return {"bytes": total}


class Workers:
    """Daemon threads that are reused: starting a thread costs about 1.5 ms under gVisor's ptrace platform."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.SimpleQueue()
        self.idle = 0
        self.lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self.lock:
            if self.idle:
                self.idle -= 1
            else:
                threading.Thread(target=self.run, daemon=True).start()
        self.jobs.put((fn, args))

    def run(self) -> None:
        while True:
            fn, args = self.jobs.get()
            fn(*args)  # guarded: never raises
            with self.lock:
                self.idle += 1


def file_info(path: str) -> Header:
    st = os.lstat(path)
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
        "symlink_target": os.readlink(path) if kind == "symlink" else None,
    }


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


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
}


def describe_error(exc: BaseException) -> tuple[str, str | None]:
    if isinstance(exc, OSError) and exc.errno in _ERRNO_KINDS:
        where = exc.filename if exc.filename is not None else ""
        return _ERRNO_KINDS[exc.errno], f"{where}: {exc.strerror}" if where else exc.strerror
    if isinstance(exc, (KeyError, TypeError, ValueError)):
        return "invalid", f"bad request: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):
        return "os", f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc)
    return "os", f"{type(exc).__name__}: {exc}"


def main() -> None:
    # stdout carries frames only; anything the agent prints by mistake goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = os.fdopen(os.dup(0), "rb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    Agent(inp, out).serve()


if __name__ == "__main__":
    main()
