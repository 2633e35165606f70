"""A tour of the E2B SDK against Corral: one unmodified E2B program, nothing of Corral imported.

Set E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY to your Corral server (and start the server with
CORRAL_SANDBOX_DOMAIN for preview hosts), then ``python tour.py``. It creates a sandbox, types into a PTY, watches a
directory, serves HTTP on port 3000 and fetches it through ``get_host``, denies one address and allows another,
builds a template from the local base image, snapshots, forks and reads metrics. It prints one JSON line of what it
saw and removes everything it made.

Without wildcard DNS for the preview domain, the fetch goes to the E2B API's host with the preview host in the
``Host`` header, which is what a wildcard DNS name pointing at Corral would do.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from e2b import CommandExitException, Sandbox, Template
from e2b.sandbox.commands.command_handle import PtySize


def until(what: str, check: Callable[[], Any], seconds: float = 60) -> Any:
    """Poll ``check`` until it returns something truthy."""
    deadline = time.monotonic() + seconds
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not seen within {seconds} s")
        time.sleep(0.05)
    return value


def fetch_inside(sandbox: Sandbox, url: str) -> str:
    """GET ``url`` from inside the sandbox: the body, or how it failed."""
    try:
        return sandbox.commands.run(f"curl -sS --max-time 5 {url}", timeout=30).stdout.strip()
    except CommandExitException as exc:
        return f"failed ({exc.exit_code})"


def fetch_preview(host: str, path: str) -> str:
    """GET ``path`` on a preview host, sent to the E2B API's own address."""
    api = urllib.parse.urlsplit(os.environ["E2B_API_URL"])
    if api.scheme not in ("http", "https"):
        raise ValueError(f"E2B_API_URL must be an http(s) URL, got {api.scheme!r}")
    url = f"{api.scheme}://{api.netloc}{path}"
    request = urllib.request.Request(url, headers={"Host": host})  # noqa: S310 (scheme checked above)
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
        return answer.read().decode()


def web_servers(count: int, made: list[Sandbox]) -> tuple[list[Sandbox], list[str]]:
    """Sandboxes serving who-they-are on port 8080, and their addresses: somewhere for the network rules to point."""
    servers, addresses = [], []
    for index in range(count):
        server = Sandbox.create()
        servers.append(server)
        made.append(server)  # killed at the end even if a later one fails
        server.files.write("/home/user/who/who", f"server-{index}\n")
        server.commands.run("python3 -m http.server 8080 --bind 0.0.0.0", background=True, cwd="/home/user/who")
        addresses.append(server.commands.run("hostname -I").stdout.split()[0])
    for server, address in zip(servers, addresses, strict=True):
        until(f"the server at {address}", lambda s=server: s.commands.run("curl -s localhost:8080/who || true").stdout)
    return servers, addresses


def main() -> dict[str, Any]:
    report: dict[str, Any] = {}
    made: list[Sandbox] = []
    template_name = f"tour-{uuid.uuid4().hex[:8]}"
    try:
        _, (denied, allowed) = web_servers(2, made)
        sandbox = Sandbox.create(network={"deny_out": [denied], "allow_out": [allowed]})
        made.append(sandbox)

        # Network rules: the denied server is unreachable, the allowed one answers.
        report["network"] = {
            "denied": fetch_inside(sandbox, f"http://{denied}:8080/who"),
            "allowed": fetch_inside(sandbox, f"http://{allowed}:8080/who"),
        }

        # A PTY: type a command, read the terminal.
        screen = bytearray()
        terminal = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
        reader = threading.Thread(target=lambda: terminal.wait(on_pty=screen.extend), daemon=True)
        reader.start()
        sandbox.pty.send_stdin(terminal.pid, b"echo typed-$((6*7))\n")
        until("the PTY's answer", lambda: b"typed-42" in screen)
        sandbox.pty.kill(terminal.pid)
        report["pty"] = "typed-42" in screen.decode(errors="replace")

        # A directory watch.
        sandbox.files.make_dir("/home/user/watched")
        watch = sandbox.files.watch_dir("/home/user/watched")
        sandbox.files.write("/home/user/watched/note.txt", "hello")
        events: list[tuple[str, str]] = []
        until("the watch's events", lambda: events.extend((e.name, e.type.value) for e in watch.get_new_events()) or
              ("note.txt", "write") in events)  # fmt: skip
        watch.stop()
        report["watch"] = sorted(set(events))

        # HTTP on port 3000, reached through get_host.
        sandbox.files.write("/home/user/site/index.html", "hello from port 3000")
        sandbox.commands.run("python3 -m http.server 3000", background=True, cwd="/home/user/site")
        host = sandbox.get_host(3000)
        report["preview"] = until("the preview host", lambda: _try(lambda: fetch_preview(host, "/index.html")))

        # A template built from the local base image, and a sandbox from it.
        Template.build(Template().from_template("base").run_cmd("echo built-by-tour > /home/user/tour.txt"),
                       template_name)  # fmt: skip
        templated = Sandbox.create(template_name)
        made.append(templated)
        report["template"] = templated.files.read("/home/user/tour.txt").strip()

        # Snapshot, a sandbox from the snapshot, and a fork.
        sandbox.files.write("/home/user/state.txt", "before the snapshot")
        snapshot = sandbox.create_snapshot()
        restored = Sandbox.create(snapshot.snapshot_id)
        made.append(restored)
        (fork,) = sandbox.fork(count=1)
        made.append(fork)
        fork.files.write("/home/user/state.txt", "changed in the fork")
        report["snapshot"] = restored.files.read("/home/user/state.txt")
        report["fork"] = [fork.files.read("/home/user/state.txt"), sandbox.files.read("/home/user/state.txt")]
        Sandbox.delete_snapshot(snapshot.snapshot_id)

        # Metrics: CPU, memory and disk samples.
        metrics = until("a metrics sample", sandbox.get_metrics, seconds=30)
        report["metrics"] = {"samples": len(metrics), "memory_total": metrics[-1].mem_total > 0}
    finally:
        for sandbox in made:
            _try(sandbox.kill)
        # The SDK deletes a template (and a snapshot, which E2B keeps as one) with DELETE /templates/{id}.
        _try(lambda: Sandbox.delete_snapshot(template_name))
    return report


def _try(call: Callable[[], Any]) -> Any:
    """The call's result, or None when it raised (retried by ``until``, or best-effort cleanup)."""
    try:
        return call()
    except Exception:
        return None


if __name__ == "__main__":
    print(json.dumps(main()))
