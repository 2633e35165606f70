"""tour.py with the E2B SDK's async client (``AsyncSandbox``, ``AsyncTemplate``): the same steps, the same report.

Set E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY to your Corral server (and start the server with
CORRAL_SANDBOX_DOMAIN for preview hosts), then ``python tour_async.py``. It creates a sandbox, types into a PTY,
watches a directory, serves HTTP on port 3000 and fetches it through ``get_host``, denies one address and allows
another, builds a template from the local base image, snapshots, forks and reads metrics. It prints one JSON line of
what it saw and removes everything it made.

Without wildcard DNS for the preview domain, the fetch goes to the E2B API's host with the preview host in the
``Host`` header, which is what a wildcard DNS name pointing at Corral would do.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from e2b import AsyncSandbox, AsyncTemplate, CommandExitException
from e2b.sandbox.commands.command_handle import PtySize


async def until(what: str, check: Callable[[], Awaitable[Any]], seconds: float = 60) -> Any:
    """Poll ``check`` until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not (value := await check()):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{what}: not seen within {seconds} s")
        await asyncio.sleep(0.05)
    return value


async def fetch_inside(sandbox: AsyncSandbox, url: str) -> str:
    """GET ``url`` from inside the sandbox: the body, or how it failed."""
    try:
        return (await sandbox.commands.run(f"curl -sS --max-time 5 {url}", timeout=30)).stdout.strip()
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


async def web_servers(count: int, made: list[AsyncSandbox]) -> tuple[list[AsyncSandbox], list[str]]:
    """Sandboxes serving who-they-are on port 8080, and their addresses: somewhere for the network rules to point."""
    servers, addresses = [], []
    for index in range(count):
        server = await AsyncSandbox.create()
        servers.append(server)
        made.append(server)  # killed at the end even if a later one fails
        await server.files.write("/home/user/who/who", f"server-{index}\n")
        await server.commands.run("python3 -m http.server 8080 --bind 0.0.0.0", background=True, cwd="/home/user/who")
        addresses.append((await server.commands.run("hostname -I")).stdout.split()[0])
    for server, address in zip(servers, addresses, strict=True):

        async def serving(s: AsyncSandbox = server) -> str:
            return (await s.commands.run("curl -s localhost:8080/who || true")).stdout

        await until(f"the web server at {address}", serving)
    return servers, addresses


async def main() -> dict[str, Any]:
    report: dict[str, Any] = {}
    made: list[AsyncSandbox] = []
    template_name = f"tour-{uuid.uuid4().hex[:8]}"
    try:
        _, (denied, allowed) = await web_servers(2, made)
        sandbox = await AsyncSandbox.create(network={"deny_out": [denied], "allow_out": [allowed]})
        made.append(sandbox)

        # Network rules: the denied server is unreachable, the allowed one answers.
        report["network"] = {
            "denied": await fetch_inside(sandbox, f"http://{denied}:8080/who"),
            "allowed": await fetch_inside(sandbox, f"http://{allowed}:8080/who"),
        }

        # A PTY: type a command, read the terminal (the async client hands output to a callback).
        screen = bytearray()
        terminal = await sandbox.pty.create(PtySize(rows=24, cols=80), on_data=screen.extend, timeout=0)
        await sandbox.pty.send_stdin(terminal.pid, b"echo typed-$((6*7))\n")
        await until("the PTY's answer", _now(lambda: b"typed-42" in screen))
        await sandbox.pty.kill(terminal.pid)
        report["pty"] = "typed-42" in screen.decode(errors="replace")

        # A directory watch (events arrive through a callback too).
        await sandbox.files.make_dir("/home/user/watched")
        events: list[tuple[str, str]] = []
        watch = await sandbox.files.watch_dir("/home/user/watched", lambda e: events.append((e.name, e.type.value)))
        await sandbox.files.write("/home/user/watched/note.txt", "hello")
        await until("the watch's events", _now(lambda: ("note.txt", "write") in events))
        await watch.stop()
        report["watch"] = sorted(set(events))

        # HTTP on port 3000, reached through get_host.
        await sandbox.files.write("/home/user/site/index.html", "hello from port 3000")
        await sandbox.commands.run("python3 -m http.server 3000", background=True, cwd="/home/user/site")
        host = sandbox.get_host(3000)
        report["preview"] = await until(
            "the preview host", lambda: _try(lambda: asyncio.to_thread(fetch_preview, host, "/index.html"))
        )

        # A template built from the local base image, and a sandbox from it.
        template = AsyncTemplate().from_template("base").run_cmd("echo built-by-tour > /home/user/tour.txt")
        await AsyncTemplate.build(template, template_name)
        templated = await AsyncSandbox.create(template_name)
        made.append(templated)
        report["template"] = (await templated.files.read("/home/user/tour.txt")).strip()

        # Snapshot, a sandbox from the snapshot, and a fork.
        await sandbox.files.write("/home/user/state.txt", "before the snapshot")
        snapshot = await sandbox.create_snapshot()
        restored = await AsyncSandbox.create(snapshot.snapshot_id)
        made.append(restored)
        (fork,) = await sandbox.fork(count=1)
        if isinstance(fork, Exception):
            raise fork
        made.append(fork)
        await fork.files.write("/home/user/state.txt", "changed in the fork")
        report["snapshot"] = await restored.files.read("/home/user/state.txt")
        report["fork"] = [
            await fork.files.read("/home/user/state.txt"),
            await sandbox.files.read("/home/user/state.txt"),
        ]
        await AsyncSandbox.delete_snapshot(snapshot.snapshot_id)

        # Metrics: CPU, memory and disk samples.
        metrics = await until("a metrics sample", sandbox.get_metrics, seconds=30)
        report["metrics"] = {"samples": len(metrics), "memory_total": metrics[-1].mem_total > 0}
    finally:
        for sandbox in made:
            await _try(sandbox.kill)
        # The SDK deletes a template (and a snapshot, which E2B keeps as one) with DELETE /templates/{id}.
        await _try(lambda: AsyncSandbox.delete_snapshot(template_name))
    return report


def _now(check: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    """A plain check as an awaitable one, for ``until``."""

    async def checked() -> Any:
        return check()

    return checked


async def _try(call: Callable[[], Awaitable[Any]]) -> Any:
    """The call's result, or None when it raised (retried by ``until``, or best-effort cleanup)."""
    try:
        return await call()
    except Exception:
        return None


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
