"""A real ``corral serve`` subprocess on a free loopback port, with its own SQLite database, and a client for it.

Each server gets a fresh data directory and database, so its ``corral.owner`` label is its own: it never adopts or
drains another server's workspaces, and the final sweep can find whatever it leaves behind by that label.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from corral.client._lean import LeanClient
from corral.settings import Settings

__all__ = ["CorralServer", "ServerError"]

STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 60.0


class ServerError(RuntimeError):
    """The server did not start, or answered a call with an error."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CorralServer:
    """``corral serve`` with environment overrides (``CORRAL_WARM_POOL_SIZE`` and friends)."""

    def __init__(self, name: str, data_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.data_dir = data_dir
        self.database_url = f"sqlite:///{(data_dir / 'corral.db').resolve()}"
        self.token = secrets.token_urlsafe(16)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "CORRAL_DATA_DIR": str(data_dir),
            "CORRAL_DATABASE_URL": self.database_url,  # never the operator's database, whatever the shell says
            "CORRAL_API_TOKEN": self.token,
            "CORRAL_PROVIDERS": "gvisor,docker",
            "CORRAL_ALLOW_DOCKER_FALLBACK": "true",  # the latency bench measures plain docker over HTTP too
            "CORRAL_WARM_POOL_SIZE": "0",
            "CORRAL_E2B_WARM_POOL_SIZE": "0",  # only the e2b scenario measures with E2B's pool
            "CORRAL_WARM_POOLS": "[]",
            **env,
        }
        self.log_path = data_dir / "server.log"
        self.process: asyncio.subprocess.Process | None = None
        auth = {"Authorization": f"Bearer {self.token}"}
        self.client = httpx.AsyncClient(base_url=self.url, headers=auth, timeout=300.0)
        """For setup, clean-up and concurrent requests."""
        self.lean = LeanClient("127.0.0.1", self.port, auth)
        """For everything timed (see :mod:`corral.client._lean`)."""
        self.sessions: set[str] = set()
        self.workspaces: set[str] = set()

    @property
    def owner(self) -> str:
        """The ``corral.owner`` label on this server's containers and volumes."""
        return Settings(data_dir=self.data_dir, database_url=self.database_url).owner_id()

    # --- process -------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the process and wait until ``/healthz`` answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            # A session of its own: Ctrl-C in the terminal reaches only the bench, which then shuts this down cleanly.
            self.process = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "corral.cli", "serve", "--port", str(self.port), "--log-level", "warning"),
                env=self.env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.returncode is not None:
                raise ServerError(
                    f"{self.name}: corral serve exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                if (await self.client.get("/healthz", timeout=1.0)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        raise ServerError(
            f"{self.name}: corral serve did not answer within {STARTUP_TIMEOUT_S:g} s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        """The end of what the server printed."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def stop(self) -> None:
        """End the sessions and destroy the workspaces this client made, then shut the server down (SIGTERM; the
        server drains its warm pool on the way out). Whatever survives is left to the caller's label sweep."""
        try:
            if self.process is not None and self.process.returncode is None:
                for session_id in list(self.sessions):
                    await self._quietly("DELETE", f"/api/v1/agent/sessions/{session_id}")
                for workspace_id in list(self.workspaces):
                    await self._quietly("DELETE", f"/api/v1/agent/workspaces/{workspace_id}")
        finally:
            await self.client.aclose()
            await self.lean.aclose()
            if self.process is not None and self.process.returncode is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(self.process.wait(), SHUTDOWN_TIMEOUT_S)
                except TimeoutError:
                    self.process.kill()
                    await self.process.wait()

    async def _quietly(self, method: str, path: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.client.request(method, path, timeout=60.0)

    # --- API -----------------------------------------------------------------------------------------------------

    async def call(
        self,
        method: str,
        path: str,
        *,
        expect: int = 200,
        json: Any = None,
        params: dict[str, str] | None = None,
        content: bytes = b"",
    ) -> Any:
        """One call over the lean keep-alive connection; raises ServerError unless the status is ``expect``.
        Returns the decoded JSON body (or the raw bytes when it is not JSON)."""
        resp = await self.lean.request(method, path, params=params, json_body=json, content=content)
        if resp.status != expect:
            raise ServerError(f"{self.name}: {method} {path} -> {resp.status}: {resp.body[:500]!r}")
        try:
            return resp.json()
        except ValueError:
            return resp.body

    async def create_workspace(self, **body: Any) -> dict[str, Any]:
        """``POST /api/v1/agent/workspaces``; returns the workspace (status ``ready``)."""
        workspace: dict[str, Any] = await self.call("POST", "/api/v1/agent/workspaces", json=body, expect=201)
        self.workspaces.add(workspace["id"])
        return workspace

    async def delete_workspace(self, workspace_id: str) -> None:
        """``DELETE /api/v1/agent/workspaces/{id}``: container and volume removed."""
        await self.call("DELETE", f"/api/v1/agent/workspaces/{workspace_id}")
        self.workspaces.discard(workspace_id)

    async def exec_true(self, workspace_id: str) -> None:
        """``POST .../exec`` of ``true`` in argv mode; raises unless it exited 0."""
        result = await self.call(
            "POST", f"/api/v1/agent/workspaces/{workspace_id}/exec", json={"command": "true", "mode": "argv"}
        )
        if result["exit_code"] != 0:
            raise ServerError(f"{self.name}: exec true exited with {result['exit_code']}: {result['stderr']}")

    async def put_file(self, workspace_id: str, path: str, data: bytes) -> None:
        """``PUT .../files?path=`` with the raw bytes."""
        await self.call("PUT", f"/api/v1/agent/workspaces/{workspace_id}/files", params={"path": path}, content=data)

    async def get_file(self, workspace_id: str, path: str) -> bytes:
        """``GET .../files?path=``: the raw bytes."""
        resp = await self.lean.request("GET", f"/api/v1/agent/workspaces/{workspace_id}/files", params={"path": path})
        if resp.status != 200:
            raise ServerError(f"{self.name}: GET file {path} -> {resp.status}: {resp.body[:500]!r}")
        return resp.body

    async def create_agent_type(self, name: str, workspace: dict[str, Any]) -> str:
        """``POST /api/v1/agent-types``; returns the id."""
        created = await self.call(
            "POST", "/api/v1/agent-types", json={"name": name, "workspace": workspace}, expect=201
        )
        return str(created["id"])

    async def start_session(self, agent_type_id: str) -> str:
        """``POST /api/v1/agent/sessions``; returns the id (the session is ``provisioning``, or already ``active``
        when a warm workspace served it)."""
        return str((await self.post_session(agent_type_id))["id"])

    async def post_session(self, agent_type_id: str) -> dict[str, Any]:
        """``POST /api/v1/agent/sessions``; returns the session as the answer shows it."""
        session: dict[str, Any] = await self.call(
            "POST", "/api/v1/agent/sessions", json={"agent_type_id": agent_type_id}, expect=201
        )
        self.sessions.add(session["id"])
        return session

    async def start_sessions(self, agent_type_id: str, count: int) -> list[str | BaseException]:
        """``count`` POST session requests in flight at once (httpx, one connection each); the ids or the errors."""

        async def start() -> str:
            resp = await self.client.post("/api/v1/agent/sessions", json={"agent_type_id": agent_type_id})
            if resp.status_code != 201:
                raise ServerError(f"{self.name}: POST session -> {resp.status_code}: {resp.text[:300]}")
            session_id = str(resp.json()["id"])
            self.sessions.add(session_id)
            return session_id

        return await asyncio.gather(*(start() for _ in range(count)), return_exceptions=True)

    async def get_session(self, session_id: str) -> dict[str, Any]:
        """``GET /api/v1/agent/sessions/{id}``."""
        session: dict[str, Any] = await self.call("GET", f"/api/v1/agent/sessions/{session_id}")
        return session

    async def end_session(self, session_id: str) -> None:
        """``DELETE /api/v1/agent/sessions/{id}``: the session ends and its workspace is destroyed."""
        await self.call("DELETE", f"/api/v1/agent/sessions/{session_id}")
        self.sessions.discard(session_id)

    async def end_sessions(self, session_ids: list[str], concurrency: int) -> None:
        """End many sessions, ``concurrency`` at a time (httpx)."""
        slots = asyncio.Semaphore(concurrency)

        async def end(session_id: str) -> None:
            async with slots:
                resp = await self.client.delete(f"/api/v1/agent/sessions/{session_id}")
                if resp.status_code != 200:
                    raise ServerError(f"{self.name}: DELETE session -> {resp.status_code}: {resp.text[:300]}")
                self.sessions.discard(session_id)

        await asyncio.gather(*(end(s) for s in session_ids))

    async def wait_pool_full(self, timeout_s: float = 120.0) -> None:
        """Wait until every warm pool holds its target and nothing is being created (so no refill runs while a
        measurement does)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pools = (await self.call("GET", "/api/v1/agent/workspaces/pool"))["pools"]
            if all(p["size"] >= p["target"] and p["creating"] == 0 for p in pools):
                return
            await asyncio.sleep(0.05)
        raise ServerError(f"{self.name}: warm pool not full after {timeout_s:g} s: {pools}")
