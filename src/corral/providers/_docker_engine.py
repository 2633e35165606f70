"""A small async client for the Docker Engine API over its Unix socket.

Only what the docker and gvisor providers need: containers, volumes, images, and ``exec`` with a hijacked stdin/stdout
stream (how the guest agent is reached). JSON calls go through httpx; the hijacked exec stream is a raw asyncio
connection, because an HTTP client cannot hand over the socket after ``101 Switching Protocols``.

API version 1.41 (Docker 20.10, Debian bookworm's docker.io) is pinned; newer engines still serve it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import httpx

__all__ = ["DockerAPIError", "DockerEngine", "ExecStream"]

log = logging.getLogger(__name__)
API_VERSION = "v1.41"
STREAM_BUFFER = 256 * 1024


class DockerAPIError(Exception):
    """A non-2xx answer from the engine, or the engine could not be reached (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{message} (HTTP {status})" if status else message)
        self.status = status
        self.message = message


class ExecStream:
    """A running ``docker exec`` with stdin attached: write to ``writer``, read its stdout with :meth:`readexactly`.

    Docker multiplexes stdout and stderr on one socket (8-byte headers). Reading is pull-based: nothing is read from
    the socket until the consumer asks for bytes, so a process that writes faster than Corral reads is held back by
    the socket (backpressure) instead of filling the server's memory. stderr is handed to ``on_stderr`` in pieces
    as it passes by.
    """

    MAX_FRAME = 1024 * 1024
    """Docker's own frames are 32 KiB; anything much larger means the stream is not what it claims to be."""

    def __init__(
        self,
        sock_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_stderr: Callable[[bytes], None],
    ) -> None:
        self.writer = writer
        self.exec_id = ""
        self._sock = sock_reader
        self._on_stderr = on_stderr
        self._buffer = bytearray()

    @property
    def reader(self) -> ExecStream:
        """The stream itself reads (kept so callers can treat it like a reader/writer pair)."""
        return self

    async def readexactly(self, n: int) -> bytes:
        """The next ``n`` bytes of the process's stdout; ``asyncio.IncompleteReadError`` at its end."""
        while len(self._buffer) < n:
            try:
                header = await self._sock.readexactly(8)
            except asyncio.IncompleteReadError as exc:
                raise asyncio.IncompleteReadError(bytes(self._buffer), n) from exc
            size = struct.unpack(">I", header[4:])[0]
            if size > self.MAX_FRAME:
                raise ConnectionError(f"docker sent a {size}-byte stream frame; closing the exec stream")
            data = await self._sock.readexactly(size)
            if header[0] == 2:
                self._on_stderr(data)
            else:
                self._buffer += data
        chunk = bytes(self._buffer[:n])
        del self._buffer[:n]
        return chunk


class DockerEngine:
    """Async Docker Engine API client bound to one Unix socket."""

    def __init__(self, socket_path: str, *, timeout_s: float = 60.0) -> None:
        self.socket_path = socket_path
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=socket_path),
            base_url=f"http://docker/{API_VERSION}",
            timeout=httpx.Timeout(timeout_s, connect=5.0),
        )

    @classmethod
    def from_url(cls, url: str) -> DockerEngine:
        """Build from ``unix:///var/run/docker.sock`` (the only scheme Corral supports)."""
        if not url.startswith("unix://"):
            raise ValueError(f"CORRAL_DOCKER_HOST must be a unix:// socket URL, got {url!r}")
        return cls(url.removeprefix("unix://"))

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """One JSON call; returns the decoded body (or None) and raises DockerAPIError for failures."""
        try:
            resp = await self._http.request(
                method,
                path,
                params=params,
                json=body,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise DockerAPIError(0, f"Docker engine at {self.socket_path} is unreachable: {exc}") from exc
        if resp.status_code >= 400:
            try:
                message = resp.json().get("message", resp.text)
            except ValueError:
                message = resp.text
            raise DockerAPIError(resp.status_code, str(message).strip())
        if not resp.content:
            return None
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.text

    # --- engine --------------------------------------------------------------------------------------------------

    async def ping(self, timeout: float = 2.0) -> None:
        """Raise DockerAPIError unless the engine answers ``/_ping``."""
        await self.request("GET", "/_ping", timeout=timeout)

    async def info(self) -> dict[str, Any]:
        """``docker info`` as JSON."""
        result: dict[str, Any] = await self.request("GET", "/info", timeout=10.0)
        return result

    # --- images --------------------------------------------------------------------------------------------------

    async def image_exists(self, name: str) -> bool:
        """True when the image is present locally (never pulls)."""
        try:
            await self.request("GET", f"/images/{quote(name, safe='')}/json")
        except DockerAPIError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def inspect_image(self, name: str) -> dict[str, Any] | None:
        """The image's description, or None when it is not present locally (never pulls)."""
        try:
            result: dict[str, Any] = await self.request("GET", f"/images/{quote(name, safe='')}/json")
        except DockerAPIError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    # --- volumes -------------------------------------------------------------------------------------------------

    async def create_volume(self, name: str, labels: dict[str, str]) -> None:
        """Create a named volume with the local driver."""
        await self.request("POST", "/volumes/create", body={"Name": name, "Labels": labels, "Driver": "local"})

    async def inspect_volume(self, name: str) -> dict[str, Any] | None:
        """The volume's description, or None when it does not exist."""
        try:
            result: dict[str, Any] = await self.request("GET", f"/volumes/{quote(name, safe='')}")
        except DockerAPIError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def remove_volume(self, name: str) -> None:
        """Remove a volume; a missing one is fine."""
        try:
            await self.request("DELETE", f"/volumes/{quote(name, safe='')}", params={"force": "true"})
        except DockerAPIError as exc:
            if exc.status != 404:
                raise

    async def list_volumes(self, labels: list[str]) -> list[dict[str, Any]]:
        """Volumes carrying every one of ``labels`` (``key`` or ``key=value``)."""
        result = await self.request("GET", "/volumes", params={"filters": json.dumps({"label": labels})})
        volumes: list[dict[str, Any]] = (result or {}).get("Volumes") or []
        return volumes

    # --- containers ----------------------------------------------------------------------------------------------

    async def create_container(self, name: str, config: dict[str, Any]) -> str:
        """Create (not start) a container; returns its id."""
        result = await self.request("POST", "/containers/create", params={"name": name}, body=config)
        return str(result["Id"])

    async def start_container(self, ref: str, *, checkpoint: str | None = None) -> None:
        """Start a created or stopped container; with ``checkpoint``, restore it from that checkpoint (experimental
        API: processes and memory come back)."""
        params = {"checkpoint": checkpoint} if checkpoint else None
        await self.request("POST", f"/containers/{quote(ref, safe='')}/start", params=params, timeout=120.0)

    async def stop_container(self, ref: str, *, timeout_s: int = 5) -> None:
        """Stop a running container (SIGTERM, then SIGKILL after ``timeout_s``); a stopped one is fine."""
        try:
            await self.request(
                "POST", f"/containers/{quote(ref, safe='')}/stop", params={"t": timeout_s}, timeout=timeout_s + 30.0
            )
        except DockerAPIError as exc:
            if exc.status != 304:  # already stopped
                raise

    async def create_checkpoint(self, ref: str, name: str, *, exit: bool) -> None:
        """Checkpoint a running container's processes and memory (Docker's experimental API; gVisor supports it).
        ``exit``: stop the container once checkpointed, else leave it running."""
        await self.request(
            "POST",
            f"/containers/{quote(ref, safe='')}/checkpoints",
            body={"CheckpointID": name, "Exit": exit},
            timeout=300.0,
        )

    async def list_checkpoints(self, ref: str) -> list[str]:
        """Names of the container's checkpoints."""
        result = await self.request("GET", f"/containers/{quote(ref, safe='')}/checkpoints")
        return [str(c.get("Name")) for c in result or []]

    async def remove_checkpoint(self, ref: str, name: str) -> None:
        """Remove a checkpoint; a missing one is fine."""
        try:
            await self.request("DELETE", f"/containers/{quote(ref, safe='')}/checkpoints/{quote(name, safe='')}")
        except DockerAPIError as exc:
            if exc.status != 404 and not any(m in exc.message.lower() for m in ("does not exist", "no such file")):
                raise

    async def commit(self, ref: str, repo: str, tag: str, *, labels: dict[str, str]) -> str:
        """``docker commit``: the container's filesystem as a new image ``repo:tag``; returns the image id."""
        result = await self.request(
            "POST",
            "/commit",
            params={"container": ref, "repo": repo, "tag": tag, "pause": "true"},
            body={"Labels": labels},
            timeout=300.0,
        )
        return str(result["Id"])

    async def remove_image(self, ref: str, *, force: bool = False) -> None:
        """Remove an image (``force``: even when containers still use it: the tag goes, the layers stay until they
        do not); a missing one is fine."""
        try:
            await self.request("DELETE", f"/images/{quote(ref, safe='')}", params={"force": str(force).lower()})
        except DockerAPIError as exc:
            if exc.status != 404:
                raise

    async def list_images(self, labels: list[str]) -> list[dict[str, Any]]:
        """Images carrying every one of ``labels``."""
        result: list[dict[str, Any]] = await self.request(
            "GET", "/images/json", params={"filters": json.dumps({"label": labels})}
        )
        return result

    async def exec_running(self, exec_id: str) -> bool:
        """Whether an exec's process still runs (a missing exec does not)."""
        try:
            result = await self.request("GET", f"/exec/{quote(exec_id, safe='')}/json")
        except DockerAPIError as exc:
            if exc.status == 404:
                return False
            raise
        return bool(result.get("Running"))

    async def exec_privileged(self, container: str, cmd: list[str], *, env: list[str] | None = None) -> None:
        """Run ``cmd`` with every capability, detached, for Corral's own maintenance inside a sandbox (setting a
        restored fork's hostname). ``cmd`` must be a trusted binary: nothing the workspace can write."""
        created = await self.request(
            "POST",
            f"/containers/{quote(container, safe='')}/exec",
            body={"Cmd": cmd, "Privileged": True, "Env": env or [], "AttachStdout": False, "AttachStderr": False},
        )
        await self.request("POST", f"/exec/{created['Id']}/start", body={"Detach": True, "Tty": False})
        for _ in range(500):
            if not await self.exec_running(created["Id"]):
                break
            await asyncio.sleep(0.01)
        else:  # stopped from inside (SIGSTOP) or hanging: an all-capabilities process must not be left running
            raise DockerAPIError(500, f"{cmd[-2:]} did not finish within 5 s")
        result = await self.request("GET", f"/exec/{created['Id']}/json")
        if result.get("ExitCode") != 0:
            raise DockerAPIError(500, f"{cmd[-2:]} exited with {result.get('ExitCode')}")

    async def inspect_container(self, ref: str) -> dict[str, Any] | None:
        """The container's description, or None when it does not exist."""
        try:
            result: dict[str, Any] = await self.request("GET", f"/containers/{quote(ref, safe='')}/json")
        except DockerAPIError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def container_size(self, ref: str) -> int:
        """Bytes in the container's writable layer (``SizeRw``: what ``docker commit`` would write), 0 if gone."""
        try:
            result = await self.request("GET", f"/containers/{quote(ref, safe='')}/json", params={"size": "true"})
        except DockerAPIError as exc:
            if exc.status == 404:
                return 0
            raise
        return int(result.get("SizeRw") or 0)

    async def remove_container(self, ref: str) -> None:
        """Kill and remove a container (anonymous volumes too); a missing one is fine."""
        try:
            await self.request("DELETE", f"/containers/{quote(ref, safe='')}", params={"force": "true", "v": "true"})
        except DockerAPIError as exc:
            if exc.status == 404:
                return
            if exc.status == 409 and "already in progress" in exc.message:
                return  # a concurrent destroy got there first
            raise

    async def wait_container(self, ref: str, *, timeout: float) -> int:
        """Wait until a container exits; returns its exit code."""
        result = await self.request("POST", f"/containers/{quote(ref, safe='')}/wait", timeout=timeout)
        return int(result.get("StatusCode", -1))

    async def container_logs(self, ref: str, *, tail: int = 50) -> str:
        """The last lines a (json-file logged) container wrote to stdout and stderr, demultiplexed."""
        try:
            resp = await self._http.get(
                f"/containers/{quote(ref, safe='')}/logs", params={"stdout": 1, "stderr": 1, "tail": tail}
            )
        except httpx.TransportError as exc:
            raise DockerAPIError(0, f"Docker engine at {self.socket_path} is unreachable: {exc}") from exc
        raw, out = resp.content, bytearray()
        while len(raw) >= 8:  # 8-byte stream headers, as in an attached exec
            size = struct.unpack(">I", raw[4:8])[0]
            out += raw[8 : 8 + size]
            raw = raw[8 + size :]
        return out.decode(errors="replace")

    async def list_containers(self, labels: list[str]) -> list[dict[str, Any]]:
        """Containers (running or not) carrying every one of ``labels``."""
        params = {"all": "true", "filters": json.dumps({"label": labels})}
        result: list[dict[str, Any]] = await self.request("GET", "/containers/json", params=params)
        return result

    async def container_stats(self, ref: str) -> dict[str, Any]:
        """One stats sample (no streaming)."""
        result: dict[str, Any] = await self.request(
            "GET", f"/containers/{quote(ref, safe='')}/stats", params={"stream": "false", "one-shot": "true"}
        )
        return result

    async def events(self, filters: dict[str, list[str]]) -> AsyncIterator[dict[str, Any]]:
        """Stream engine events matching ``filters`` until the connection ends."""
        params = {"filters": json.dumps(filters)}
        try:
            async with self._http.stream("GET", "/events", params=params, timeout=httpx.Timeout(None)) as resp:
                async for line in resp.aiter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.TransportError as exc:
            raise DockerAPIError(0, f"event stream from {self.socket_path} ended: {exc}") from exc

    # --- exec ----------------------------------------------------------------------------------------------------

    async def exec_attached(
        self,
        container: str,
        cmd: list[str],
        *,
        on_stderr: Callable[[bytes], None],
        user: str = "",
        env: list[str] | None = None,
        working_dir: str = "",
    ) -> ExecStream:
        """Start ``cmd`` in a running container with stdin, stdout and stderr attached over a hijacked socket."""
        created = await self.request(
            "POST",
            f"/containers/{quote(container, safe='')}/exec",
            body={
                "AttachStdin": True,
                "AttachStdout": True,
                "AttachStderr": True,
                "Tty": False,
                "Cmd": cmd,
                "User": user,
                "Env": env or [],
                "WorkingDir": working_dir,
            },
        )
        exec_id = created["Id"]
        # A small buffer limit: asyncio stops reading the socket once this much is waiting, so a process that
        # writes faster than Corral consumes is held back by the socket instead of by the server's memory.
        reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=STREAM_BUFFER)
        try:
            body = json.dumps({"Detach": False, "Tty": False}).encode()
            writer.write(
                (
                    f"POST /{API_VERSION}/exec/{exec_id}/start HTTP/1.1\r\n"
                    "Host: docker\r\nContent-Type: application/json\r\n"
                    "Connection: Upgrade\r\nUpgrade: tcp\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status_line = head.split(b"\r\n", 1)[0]
            parts = status_line.split(b" ", 2)
            status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            if status not in (101, 200):
                rest = await asyncio.wait_for(reader.read(65536), 5)
                text = rest.decode(errors="replace")
                with contextlib.suppress(ValueError):
                    text = json.loads(text[text.index("{") :]).get("message", text)
                raise DockerAPIError(status, f"exec start failed: {text.strip() or status_line.decode().strip()}")  # noqa: TRY301 - the except below must close the socket
        except BaseException:
            writer.close()
            raise
        stream = ExecStream(reader, writer, on_stderr)
        stream.exec_id = str(exec_id)
        return stream
