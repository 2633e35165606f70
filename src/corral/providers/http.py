"""The ``http`` provider: a custom backend reached through Corral's HTTP provider contract (``docs/http-provider.md``).

:class:`HttpProvider` is a thin client of ``/v1``: one request per contract method, bearer-token auth, exec output
streamed as NDJSON lines and file contents streamed both ways. Errors are translated at this boundary with one table
(:data:`ERROR_CODES`): the backend's error codes become the matching :mod:`corral.errors` classes, while transport
failures, refused tokens and answers outside the contract become :class:`~corral.errors.ProviderUnavailableError`,
so auto selection falls back to the next provider. :mod:`corral.providers.http_backend` is the reference backend.

``beneath`` on file calls is sent to the backend as a query parameter (the reference backend hands it to its
provider, which may enforce it race-free), and is also checked here first with ``realpath``
(:func:`~corral.providers.base.check_beneath`), because a backend that predates the parameter ignores it. That check
is best effort: a process in the sandbox that swaps a directory for a symlink right after it wins the race.
"""

from __future__ import annotations

import asyncio
import base64
import json
import posixpath
import time
from collections.abc import AsyncIterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from corral.errors import (
    CorralError,
    ExecTimeoutError,
    FileOperationError,
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    WorkspaceDestroyedError,
    WorkspaceFileNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.providers.base import (
    WORKSPACE_ROOT,
    ByteStream,
    Capabilities,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecRequest,
    ExecResult,
    ExecStream,
    FileInfo,
    Health,
    Persistence,
    WorkspaceSpec,
    WorkspaceState,
    check_beneath,
    check_path,
    collect_exec,
    escape_error,
    lies_beneath,
)

if TYPE_CHECKING:
    from corral.settings import Settings

__all__ = ["ERROR_CODES", "NOT_CONFIGURED", "HttpProvider", "from_settings"]

NOT_CONFIGURED = "CORRAL_HTTP_PROVIDER_URL is not set"

ERROR_CODES: dict[str, type[CorralError]] = {
    "invalid_request": InvalidRequestError,
    "workspace_not_found": WorkspaceNotFoundError,
    "workspace_destroyed": WorkspaceDestroyedError,
    "workspace_state_conflict": WorkspaceStateError,
    "exec_timeout": ExecTimeoutError,
    "resource_limit": ResourceLimitError,
    "file_not_found": WorkspaceFileNotFoundError,
    "file_operation_failed": FileOperationError,
}
"""Backend error code -> the error raised here. Any other code (``provider_unavailable`` included), a refused token
and an answer without a contract error body raise :class:`ProviderUnavailableError`."""

_STATES = {s.value: s for s in WorkspaceState}


class HttpProvider:
    """Workspaces held by a custom backend that speaks Corral's HTTP provider contract at ``base_url``."""

    def __init__(
        self,
        base_url: str | None,
        *,
        token: str | None,
        name: str = "http",
        transport: httpx.AsyncBaseTransport | None = None,
        request_timeout_s: float = 120.0,
        health_timeout_s: float = 5.0,
        output_limit: int = 16 * 1024 * 1024,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/") if base_url else None
        self.health_timeout_s = health_timeout_s
        self.output_limit = output_limit
        self._client: httpx.AsyncClient | None = None
        if self.base_url:
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                headers={"Authorization": f"Bearer {token or ''}"},
                timeout=httpx.Timeout(request_timeout_s, connect=min(request_timeout_s, 10.0)),
                transport=transport,
            )

    # --- plumbing ---------------------------------------------------------------------------------------------------

    def _require_client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise ProviderUnavailableError(self.name, NOT_CONFIGURED)
        return self._client

    def _unavailable(self, exc: httpx.HTTPError) -> ProviderUnavailableError:
        return ProviderUnavailableError(self.name, f"backend unreachable: {type(exc).__name__}: {exc}")

    def _error(self, status: int, payload: object) -> CorralError:
        """The error for a backend answer: a contract error body mapped through ERROR_CODES, else unavailable."""
        error = payload.get("error") if isinstance(payload, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("code"), str):
            return ProviderUnavailableError(self.name, f"backend answered HTTP {status} outside the contract")
        code, message = error["code"], str(error.get("message", ""))
        details = error.get("details") if isinstance(error.get("details"), dict) else {}
        if status == 401 or code == "unauthorized":
            return ProviderUnavailableError(self.name, f"backend refused the token (HTTP 401): {message}")
        cls = ERROR_CODES.get(code)
        if cls is None:
            return ProviderUnavailableError(self.name, f"backend error {code} (HTTP {status}): {message}")
        if cls is ExecTimeoutError:
            return ExecTimeoutError(message)
        return cls(message, details=details)

    async def _raise_for(self, response: httpx.Response) -> None:
        """Raise the mapped error when ``response`` is not a success (reads the body of a streamed response)."""
        if response.is_success:
            return
        body = await response.aread()
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        raise self._error(response.status_code, payload)

    async def _call(
        self,
        method: str,
        url: str,
        *,
        stream: bool = False,
        timeout: httpx.Timeout | float | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send one request; mapped errors for failures. A streamed response must be closed by the caller."""
        client = self._require_client()
        request = client.build_request(
            method, url, timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT, **kwargs
        )
        try:
            response = await client.send(request, stream=stream)
            if not response.is_success:
                try:
                    await self._raise_for(response)
                finally:
                    await response.aclose()
        except httpx.HTTPError as exc:
            raise self._unavailable(exc) from exc
        return response

    async def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        response = await self._call(method, url, **kwargs)
        try:
            return response.json()
        except ValueError as exc:
            raise ProviderUnavailableError(self.name, f"backend sent invalid JSON for {method} {url}") from exc

    @staticmethod
    def _ws(workspace_id: str) -> str:
        return f"/v1/workspaces/{quote(workspace_id, safe='')}"

    # --- lifecycle --------------------------------------------------------------------------------------------------

    async def create(self, spec: WorkspaceSpec) -> None:
        """PUT the spec; returns once the backend says the workspace runs commands."""
        body = {
            "image": spec.image,
            "limits": {
                "cpu": spec.limits.cpu,
                "memory_bytes": spec.limits.memory_bytes,
                "disk_bytes": spec.limits.disk_bytes,
            },
            "network": spec.network,
            "container_type": spec.container_type,
            "env": dict(spec.env),
            "labels": dict(spec.labels),
        }
        await self._call("PUT", self._ws(spec.id), json=body)

    async def destroy(self, workspace_id: str) -> None:
        """DELETE the workspace (idempotent on the backend)."""
        await self._call("DELETE", self._ws(workspace_id))

    async def stop(self, workspace_id: str) -> None:
        """Stop the workspace, keeping /workspace."""
        await self._call("POST", f"{self._ws(workspace_id)}/stop")

    async def resume(self, workspace_id: str) -> None:
        """Resume a stopped workspace; a no-op for a running one."""
        await self._call("POST", f"{self._ws(workspace_id)}/resume")

    async def state(self, workspace_id: str) -> WorkspaceState:
        """Running, stopped or missing, as the backend says."""
        payload = await self._json("GET", self._ws(workspace_id))
        state = _STATES.get(str(payload.get("state"))) if isinstance(payload, dict) else None
        if state is None:
            raise ProviderUnavailableError(self.name, f"backend sent an unknown workspace state: {payload!r}")
        return state

    async def list_workspaces(self) -> list[str]:
        """Ids of every workspace the backend holds."""
        payload = await self._json("GET", "/v1/workspaces")
        return [str(i) for i in payload["ids"]]

    # --- exec -------------------------------------------------------------------------------------------------------

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """Run to completion by collecting the stream; a timeout error carries the output received so far."""
        return await collect_exec(
            self.exec_stream(workspace_id, request), output_limit=self.output_limit, provider=self.name
        )

    async def exec_stream(self, workspace_id: str, request: ExecRequest) -> ExecStream:
        """POST the argv and yield the NDJSON lines as they arrive; closing early closes the connection."""
        request.validate()
        _refuse_user(request.user, "user")
        body = {"argv": request.argv(), "cwd": request.cwd, "env": dict(request.env), "timeout_s": request.timeout_s}
        # The backend enforces the deadline; the read timeout only guards against a backend that went silent.
        read_timeout = None if request.timeout_s is None else request.timeout_s + 30.0
        timeout = httpx.Timeout(10.0, read=read_timeout, write=None, pool=None)
        response = await self._call("POST", f"{self._ws(workspace_id)}/exec", stream=True, json=body, timeout=timeout)
        try:
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = self._exec_event(line)
                yield event
                if isinstance(event, ExecExit):
                    return
        except httpx.HTTPError as exc:
            raise self._unavailable(exc) from exc
        finally:
            await response.aclose()
        raise ProviderUnavailableError(self.name, "exec stream ended without an exit line")

    def _exec_event(self, line: str) -> ExecEvent:
        """One NDJSON line of an exec answer as an event; an error line raises its mapped error."""
        try:
            message = json.loads(line)
            if "stream" in message:
                return ExecOutput(message["stream"], base64.b64decode(message["data_b64"]))
            if "exit_code" in message:
                return ExecExit(int(message["exit_code"]), float(message.get("duration_ms", 0.0)))
        except (ValueError, TypeError, KeyError) as exc:
            raise ProviderUnavailableError(self.name, f"backend sent an invalid exec line: {line[:200]!r}") from exc
        raise self._error(200, message)

    # --- files ------------------------------------------------------------------------------------------------------

    async def _beneath(
        self, workspace_id: str, path: str, beneath: str | None, *, follow: bool = True
    ) -> dict[str, str]:
        """The query parameter that confines a file call, after the best-effort check (see the module docstring)."""
        if beneath is None:
            return {}
        await check_beneath(self, workspace_id, path, beneath, follow=follow)
        return {"beneath": beneath}

    async def read_file(self, workspace_id: str, path: str, *, beneath: str | None = None) -> ByteStream:
        """Open the file (errors are raised here) and return an iterator over its streamed content."""
        params = {"path": path, **await self._beneath(workspace_id, path, beneath)}
        response = await self._call("GET", f"{self._ws(workspace_id)}/files", params=params, stream=True)
        return self._body(response)

    async def _body(self, response: httpx.Response) -> ByteStream:
        try:
            async for chunk in response.aiter_bytes():
                yield chunk
        except httpx.HTTPError as exc:
            raise self._unavailable(exc) from exc
        finally:
            await response.aclose()

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
        """PUT the content as a streamed body; return the byte count the backend wrote."""
        _refuse_user(owner, "owner")
        params = {"path": path} if mode is None else {"path": path, "mode": f"{mode:04o}"}
        params.update(await self._beneath(workspace_id, path, beneath))
        payload = await self._json("PUT", f"{self._ws(workspace_id)}/files", params=params, content=data)
        return int(payload["bytes_written"])

    async def list_dir(self, workspace_id: str, path: str, *, beneath: str | None = None) -> list[FileInfo]:
        """Directory entries, sorted by name."""
        params = {"path": path, **await self._beneath(workspace_id, path, beneath)}
        payload = await self._json("GET", f"{self._ws(workspace_id)}/files/list", params=params)
        return [_file_info(e) for e in payload["entries"]]

    async def delete(
        self, workspace_id: str, path: str, *, recursive: bool = False, beneath: str | None = None
    ) -> None:
        """Remove a file or directory."""
        params = {"path": path, "recursive": "true" if recursive else "false"}
        params.update(await self._beneath(workspace_id, path, beneath, follow=False))
        await self._call("DELETE", f"{self._ws(workspace_id)}/files", params=params)

    async def move(self, workspace_id: str, src: str, dst: str, *, beneath: str | None = None) -> None:
        """Rename src to dst."""
        params = await self._beneath(workspace_id, src, beneath, follow=False)
        params.update(await self._beneath(workspace_id, dst, beneath, follow=False))
        body = {"src": src, "dst": dst}
        await self._call("POST", f"{self._ws(workspace_id)}/files/move", json=body, params=params)

    async def chmod(self, workspace_id: str, path: str, mode: int, *, beneath: str | None = None) -> None:
        """Set permission bits."""
        params = await self._beneath(workspace_id, path, beneath)
        body = {"path": path, "mode": f"{mode:04o}"}
        await self._call("POST", f"{self._ws(workspace_id)}/files/chmod", json=body, params=params)

    async def stat(self, workspace_id: str, path: str, *, beneath: str | None = None) -> FileInfo:
        """Information about one path."""
        params = {"path": path, **await self._beneath(workspace_id, path, beneath, follow=False)}
        return _file_info(await self._json("GET", f"{self._ws(workspace_id)}/files/stat", params=params))

    async def glob(
        self,
        workspace_id: str,
        pattern: str,
        *,
        root: str = WORKSPACE_ROOT,
        limit: int = 10_000,
        beneath: str | None = None,
    ) -> list[str]:
        """Sorted absolute paths under root matching pattern, at most limit.

        With ``beneath``, matches whose directory resolves outside it are dropped here too (best effort, for backends
        that predate the parameter).
        """
        params = {"pattern": pattern, "root": root, "limit": str(limit)}
        params.update(await self._beneath(workspace_id, root, beneath))
        payload = await self._json("GET", f"{self._ws(workspace_id)}/files/glob", params=params)
        paths = [str(p) for p in payload["paths"]]
        if beneath is None:
            return paths
        fence = posixpath.normpath(check_path(beneath, field_name="beneath"))
        gate = asyncio.Semaphore(16)

        async def leads_out(directory: str) -> bool:
            async with gate:
                return not lies_beneath(await self.realpath(workspace_id, directory), fence)

        parents = sorted({posixpath.dirname(p) for p in paths} - {posixpath.normpath(root)})
        flags = await asyncio.gather(*(leads_out(d) for d in parents))
        out = {d for d, flag in zip(parents, flags, strict=True) if flag}
        return [p for p in paths if posixpath.dirname(p) not in out]

    async def realpath(self, workspace_id: str, path: str, *, beneath: str | None = None) -> str:
        """The path with symlinks, `.` and `..` resolved."""
        params = {"path": path} if beneath is None else {"path": path, "beneath": beneath}
        payload = await self._json("GET", f"{self._ws(workspace_id)}/files/realpath", params=params)
        real = str(payload["path"])
        if beneath is not None:
            fence = posixpath.normpath(check_path(beneath, field_name="beneath"))
            if not (lies_beneath(posixpath.normpath(check_path(path)), fence) and lies_beneath(real, fence)):
                raise escape_error(path, fence, f" (it resolves to {real})")
        return real

    # --- health -----------------------------------------------------------------------------------------------------

    async def health(self) -> Health:
        """GET /v1/health within ``health_timeout_s``; unreachable, refused or unconfigured backends are unhealthy."""
        started = time.monotonic()
        try:
            payload = await self._json("GET", "/v1/health", timeout=self.health_timeout_s)
        except ProviderUnavailableError as exc:
            return Health(healthy=False, error=exc.reason, latency_ms=(time.monotonic() - started) * 1000)
        latency = (time.monotonic() - started) * 1000
        healthy = bool(payload.get("healthy"))
        error = None if healthy else str(payload.get("error") or "backend reports unhealthy")
        return Health(healthy=healthy, error=error, latency_ms=latency, details={"backend": payload.get("details", {})})

    async def capabilities(self) -> Capabilities:
        """The backend's capabilities; a generic remote description when it cannot be asked."""
        try:
            payload = await self._json("GET", "/v1/capabilities")
        except ProviderUnavailableError:
            return Capabilities(
                isolation="remote",
                persistence="none",
                snapshots="none",
                warm_pool=False,
                streaming=True,
                disk_limit="none",
                requirements=("CORRAL_HTTP_PROVIDER_URL", "a reachable backend"),
                startup_latency_ms=0.0,
            )
        return Capabilities(
            isolation=payload["isolation"],
            persistence=_persistence(payload["persistence"]),
            snapshots="none",  # the HTTP provider protocol has no snapshot routes
            warm_pool=bool(payload["warm_pool"]),
            streaming=bool(payload["streaming"]),
            disk_limit=payload["disk_limit"],
            requirements=tuple(payload.get("requirements", ())),
            startup_latency_ms=float(payload.get("startup_latency_ms", 0.0)),
            resources=dict(payload.get("resources", {})),
        )

    async def aclose(self) -> None:
        """Close the HTTP connections; the backend's workspaces are left as they are."""
        if self._client is not None:
            await self._client.aclose()


def _file_info(payload: dict[str, Any]) -> FileInfo:
    return FileInfo(
        path=payload["path"],
        name=payload["name"],
        type=payload["type"],
        size=int(payload["size"]),
        mode=int(payload["mode"], 8),
        mtime=float(payload["mtime"]),
        symlink_target=payload.get("symlink_target"),
    )


def from_settings(settings: Settings) -> HttpProvider:
    """Build from ``CORRAL_HTTP_PROVIDER_URL`` and ``CORRAL_HTTP_PROVIDER_TOKEN`` (read with ``getattr``)."""
    return HttpProvider(
        getattr(settings, "http_provider_url", None), token=getattr(settings, "http_provider_token", None)
    )


def _persistence(value: object) -> Persistence:
    """The backend's ``persistence``: protocol v1 sends a bool (True: /workspace survives a stop)."""
    if value == "full":
        return "full"
    return "workspace" if value in (True, "workspace") else "none"


def _refuse_user(user: str | None, field_name: str) -> None:
    """The backend protocol has no user: refuse rather than run as the backend's default."""
    if user is not None:
        raise InvalidRequestError(
            f"{field_name}: the http provider's backend protocol cannot act as a workspace user ({user!r}); "
            "leave it unset to use the backend's default user",
            details={"field": field_name},
        )
