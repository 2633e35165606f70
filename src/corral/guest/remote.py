"""Exec and file operations of the provider contract, served by the guest agent over a :class:`GuestConnection`.

Every provider whose workspaces run :mod:`corral.guest.agent` (Docker and gVisor through ``docker exec -i``,
Firecracker through vsock) implements the same twelve contract methods the same way: get the workspace's agent
connection, send one request, turn the answer into contract values, and turn a lost connection into the
workspace's real state. :class:`AgentBackedProvider` holds that code once. A provider mixes it in and supplies

* ``name`` and ``output_limit`` (bytes kept per stream by :meth:`exec`);
* ``async _agent(workspace_id) -> GuestConnection``: a live connection (connecting, or reconnecting, as needed);
  it raises SandboxNotFoundError / WorkspaceStateError for missing or stopped workspaces;
* ``async _require_running(workspace_id)``: raise SandboxNotFoundError / WorkspaceStateError unless running;
* optionally ``_exec_env(workspace_id, request)``: the environment of a command (default: the request's), for
  providers that must add the workspace spec's variables themselves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import Any

from corral.errors import ExecTimeoutError, InvalidRequestError, ProviderUnavailableError
from corral.guest.client import GuestConnection, GuestConnectionLost
from corral.providers.base import (
    WORKSPACE_ROOT,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecRequest,
    ExecResult,
    FileInfo,
    check_path,
    collect_exec,
)

__all__ = ["EXEC_GRACE_S", "AgentBackedProvider", "file_info_from_json"]

EXEC_GRACE_S = 15.0
"""How long past a command's own deadline the host waits for the agent to report the kill, before giving up."""
LOST = "lost the connection to the workspace agent"
LOST_STATE_GRACE_S = 2.0


def file_info_from_json(raw: dict[str, Any]) -> FileInfo:
    """The agent's ``stat``/``list`` entry as a :class:`FileInfo`."""
    return FileInfo(
        path=raw["path"],
        name=raw["name"],
        type=raw["type"],
        size=int(raw["size"]),
        mode=int(raw["mode"]),
        mtime=float(raw["mtime"]),
        symlink_target=raw.get("symlink_target"),
    )


class AgentBackedProvider:
    """Mixin: the exec and file half of :class:`~corral.providers.base.WorkspaceProvider` over the guest agent."""

    name: str
    output_limit: int = 16 * 1024 * 1024

    # --- what the provider supplies -------------------------------------------------------------------------------

    async def _agent(self, workspace_id: str) -> GuestConnection:
        """A live agent connection for the workspace."""
        raise NotImplementedError

    async def _require_running(self, workspace_id: str) -> None:
        """Raise SandboxNotFoundError or WorkspaceStateError unless the workspace runs."""
        raise NotImplementedError

    def _exec_env(self, workspace_id: str, request: ExecRequest) -> dict[str, str]:
        """The environment a command gets on top of the agent's own (default: the request's variables)."""
        del workspace_id
        return dict(request.env)

    # --- plumbing ---------------------------------------------------------------------------------------------------

    async def _lost(self, workspace_id: str) -> ProviderUnavailableError:
        """After a lost connection: raise the workspace's real state if it is not running, else the error to raise.

        The runtime may report a dying sandbox as running for a moment after its agent stream broke, so the state is
        polled briefly before the loss is blamed on the agent alone.
        """
        deadline = time.monotonic() + LOST_STATE_GRACE_S
        while True:
            await self._require_running(workspace_id)
            if time.monotonic() >= deadline:
                return ProviderUnavailableError(self.name, LOST)
            await asyncio.sleep(0.1)

    async def _with_agent(self, workspace_id: str, op: str, **args: Any) -> dict[str, Any]:
        """One request to the agent; a lost connection becomes the workspace's real state, or one retry."""
        for attempt in (1, 2):
            conn = await self._agent(workspace_id)
            try:
                return await conn.call(op, **args)
            except GuestConnectionLost:
                error = await self._lost(workspace_id)
                if attempt == 2:
                    raise error from None
        raise AssertionError("unreachable")

    # --- exec -------------------------------------------------------------------------------------------------------

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """Run to completion, keeping at most ``output_limit`` bytes of each stream."""
        return await collect_exec(
            self.exec_stream(workspace_id, request), output_limit=self.output_limit, provider=self.name
        )

    async def exec_stream(self, workspace_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        """Yield output as the agent forwards it; the agent kills the process group at the deadline."""
        request.validate()
        conn = await self._agent(workspace_id)
        frames: AsyncGenerator[tuple[dict[str, Any], bytes]] = conn.exec(
            request.argv(), cwd=request.cwd, env=self._exec_env(workspace_id, request), timeout_s=request.timeout_s
        )
        deadline = None if request.timeout_s is None else time.monotonic() + request.timeout_s + EXEC_GRACE_S
        try:
            while True:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                try:
                    header, payload = await asyncio.wait_for(anext(frames), remaining)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise ExecTimeoutError(
                        f"command did not finish within {request.timeout_s:g} s and the workspace did not confirm "
                        "the kill"
                    ) from None
                except GuestConnectionLost:
                    raise await self._lost(workspace_id) from None
                if header.get("ev") == "out":
                    yield ExecOutput("stdout" if header.get("fd") == 1 else "stderr", payload)
                elif header.get("ev") == "exit":
                    if header.get("timed_out"):
                        raise ExecTimeoutError(
                            f"command did not finish within {request.timeout_s:g} s; it was killed",
                            duration_ms=float(header.get("duration_ms", 0.0)),
                        )
                    yield ExecExit(int(header["code"]), float(header.get("duration_ms", 0.0)))
        finally:
            await frames.aclose()

    # --- files ------------------------------------------------------------------------------------------------------

    async def read_file(self, workspace_id: str, path: str) -> AsyncIterator[bytes]:
        """Open for streaming; missing files raise WorkspaceFileNotFoundError before the first chunk."""
        path = check_path(path)
        conn = await self._agent(workspace_id)
        try:
            return await conn.open_read(path)
        except GuestConnectionLost:
            raise await self._lost(workspace_id) from None

    async def write_file(
        self, workspace_id: str, path: str, data: bytes | AsyncIterable[bytes], *, mode: int | None = None
    ) -> int:
        """Stream into the file, creating parents."""
        path = check_path(path)
        conn = await self._agent(workspace_id)
        try:
            return await conn.write(path, data, mode=mode)
        except GuestConnectionLost:
            raise await self._lost(workspace_id) from None

    async def list_dir(self, workspace_id: str, path: str) -> list[FileInfo]:
        """Directory entries, sorted by name."""
        result = await self._with_agent(workspace_id, "list", path=check_path(path))
        return [file_info_from_json(e) for e in result["entries"]]

    async def delete(self, workspace_id: str, path: str, *, recursive: bool = False) -> None:
        """Remove a file or directory."""
        await self._with_agent(workspace_id, "delete", path=check_path(path), recursive=recursive)

    async def move(self, workspace_id: str, src: str, dst: str) -> None:
        """Rename, creating the destination's parents."""
        await self._with_agent(
            workspace_id, "move", src=check_path(src, field_name="src"), dst=check_path(dst, field_name="dst")
        )

    async def chmod(self, workspace_id: str, path: str, mode: int) -> None:
        """Set permission bits."""
        await self._with_agent(workspace_id, "chmod", path=check_path(path), mode=mode)

    async def stat(self, workspace_id: str, path: str) -> FileInfo:
        """lstat of one path."""
        return file_info_from_json(await self._with_agent(workspace_id, "stat", path=check_path(path)))

    async def glob(
        self, workspace_id: str, pattern: str, *, root: str = WORKSPACE_ROOT, limit: int = 10_000
    ) -> list[str]:
        """Matching absolute paths, sorted."""
        if not pattern or "\x00" in pattern:
            raise InvalidRequestError("pattern: must be a non-empty glob pattern", details={"field": "pattern"})
        result = await self._with_agent(workspace_id, "glob", pattern=pattern, root=check_path(root), limit=limit)
        return list(result["paths"])

    async def realpath(self, workspace_id: str, path: str) -> str:
        """Symlinks resolved inside the workspace."""
        return str((await self._with_agent(workspace_id, "realpath", path=check_path(path)))["path"])

    async def disk_usage(self, workspace_id: str) -> int:
        """Bytes used under /workspace."""
        return int((await self._with_agent(workspace_id, "usage", path=WORKSPACE_ROOT))["bytes"])
