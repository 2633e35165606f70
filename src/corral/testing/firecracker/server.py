"""The double as a program: the API served over HTTP on the Unix socket, and ``serve``/``main``, which run it like
``firecracker --api-sock PATH --id ID``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler
from typing import Any

from corral.testing.firecracker.api import VMM_VERSION, ApiDouble
from corral.testing.firecracker.guest import ChrootGuest, Guest, NoGuest, enter_private_mount_namespace

__all__ = ["main", "serve", "start_api_server"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ApiServer

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        with self.server.lock:
            try:
                status, body = self.server.api.handle(self.command, self.path, raw)
            except Exception as exc:  # a bug of the double: answer like Firecracker's "Internal Server Error"
                status, body = 500, {"fault_message": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    do_GET = do_PUT = do_PATCH = do_POST = do_DELETE = _serve

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("fake-firecracker: " + (format % args) + "\n")


class _ApiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, api: ApiDouble) -> None:
        self.api = api
        self.lock = threading.Lock()
        super().__init__(path, _Handler)


def start_api_server(path: str, api: ApiDouble) -> tuple[_ApiServer, threading.Thread]:
    """Serve ``api`` on the Unix socket ``path`` from a background thread (for in-process tests)."""
    server = _ApiServer(path, api)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server, thread


def serve(api_sock: str, instance_id: str, guest_mode: str, *, keyboard: bool = True) -> int:
    """Run like ``firecracker --api-sock PATH --id ID`` until the guest halts, a snapshot load fails, or a signal
    arrives. ``keyboard=False`` models a guest kernel without an i8042 driver (Ctrl-Alt-Del is lost)."""
    main_jobs: queue.Queue[tuple[Callable[[], None], Future[None]]] = queue.Queue()

    def run_on_main(fn: Callable[[], None]) -> None:
        done: Future[None] = Future()
        main_jobs.put((fn, done))
        done.result()

    guest: Guest
    if guest_mode == "chroot":
        enter_private_mount_namespace()
        guest = ChrootGuest(os.path.abspath(api_sock) + ".root", keyboard=keyboard)
    else:
        guest = NoGuest(keyboard=keyboard)
    api = ApiDouble(instance_id=instance_id, guest=guest, run_on_main=run_on_main)
    server, thread = start_api_server(api_sock, api)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.is_set():
            try:
                fn, done = main_jobs.get(timeout=0.05)
            except queue.Empty:
                if api.fatal or (api.guest_booted and guest.exited()):
                    break
                continue
            try:
                fn()
                done.set_result(None)
            except BaseException as exc:
                done.set_exception(exc)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=2)
        api.close()
        guest.cleanup()
        with contextlib.suppress(OSError):
            os.unlink(api_sock)
    return 1 if api.fatal else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m corral.testing.firecracker --api-sock PATH [--id ID] [--guest chroot|none]``."""
    parser = argparse.ArgumentParser(description="Test double of the firecracker binary (no KVM needed).")
    parser.add_argument("--api-sock", required=True)
    parser.add_argument("--id", default="anonymous-instance")
    parser.add_argument("--guest", choices=("chroot", "none"), default=os.environ.get("CORRAL_FAKE_GUEST", "chroot"))
    parser.add_argument(
        "--no-keyboard", action="store_true", help="the guest has no i8042 driver: SendCtrlAltDel is accepted and lost"
    )
    parser.add_argument("--version", action="version", version=f"Firecracker v{VMM_VERSION}")
    args = parser.parse_args(argv)
    if os.path.exists(args.api_sock):
        sys.stderr.write(f"fake-firecracker: API socket {args.api_sock} already exists\n")
        return 1
    started = time.monotonic()
    code = serve(args.api_sock, args.id, args.guest, keyboard=not args.no_keyboard)
    sys.stderr.write(f"fake-firecracker: {args.id} exited after {time.monotonic() - started:.2f} s\n")
    return code
