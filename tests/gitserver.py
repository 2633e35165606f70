"""A real git repository served over smart HTTP on loopback, behind Basic auth, for checkout tests.

``git http-backend`` (shipped with git) does the protocol; a small threaded HTTP server in front checks the
credentials and speaks CGI to it. Tests get URLs with and without credentials.
"""

from __future__ import annotations

import base64
import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

USER = "x-access-token"


@dataclass(frozen=True)
class GitServer:
    """Where the served repositories are and how to reach them."""

    port: int
    secret: str
    root: Path

    def url(self, name: str, *, credentials: bool = True) -> str:
        """``http://x-access-token:SECRET@127.0.0.1:PORT/NAME.git`` (or without the credentials)."""
        auth = f"{USER}:{self.secret}@" if credentials else ""
        return f"http://{auth}127.0.0.1:{self.port}/{name}.git"


def _git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_repository(root: Path, name: str, branches: dict[str, dict[str, str]]) -> Path:
    """A bare repository ``root/NAME.git`` whose branches hold the given files (branch -> {path: content})."""
    work = root / f"{name}-work"
    work.mkdir(parents=True)
    _git("init", "-q", "-b", "main", cwd=work)
    _git("config", "user.email", "test@example.invalid", cwd=work)
    _git("config", "user.name", "Test", cwd=work)
    for index, (branch, files) in enumerate(branches.items()):
        if index:
            _git("checkout", "-q", "-b", branch, "main", cwd=work)
        for path, content in files.items():
            (work / path).parent.mkdir(parents=True, exist_ok=True)
            (work / path).write_text(content)
        _git("add", "-A", cwd=work)
        _git("commit", "-q", "-m", f"{branch}: add files", cwd=work)
    bare = root / f"{name}.git"
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=root)
    return bare


def _handler(root: Path, secret: str) -> type[http.server.BaseHTTPRequestHandler]:
    expected = "Basic " + base64.b64encode(f"{USER}:{secret}".encode()).decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _serve(self) -> None:
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "GIT_PROJECT_ROOT": str(root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "REMOTE_USER": USER,
            }
            proc = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False)
            head, _, payload = proc.stdout.partition(b"\r\n\r\n")
            status = 200
            headers = []
            for line in head.decode().split("\r\n"):
                key, _, value = line.partition(": ")
                if key.lower() == "status":
                    status = int(value.split()[0])
                elif key:
                    headers.append((key, value))
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = _serve
        do_POST = _serve

    return Handler


@contextmanager
def serve_git(root: Path, secret: str) -> Iterator[GitServer]:
    """Serve every bare repository under ``root`` on a free loopback port until the block ends."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(root, secret))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield GitServer(server.server_address[1], secret, root)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
