"""The reference backend of Corral's HTTP provider contract (``docs/http-provider.md``), over ANY provider.

``create_backend_app(provider, token=...)`` returns a FastAPI app that serves ``/v1`` on top of a
:class:`~corral.providers.base.WorkspaceProvider`. It proves the contract (the conformance suite runs
:class:`~corral.providers.http.HttpProvider` against it, backed by the fake and by gVisor) and lets anyone put a
Python provider behind HTTP::

    uvicorn.run(create_backend_app(MyProvider(), token="secret"), host="127.0.0.1", port=9000)

The app never closes the provider: whoever built it owns it.
"""

from __future__ import annotations

import base64
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Annotated, Any, ClassVar, Literal

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from corral.errors import CorralError, InvalidRequestError
from corral.providers.base import (
    WORKSPACE_ROOT,
    ExecExit,
    ExecMode,
    ExecOutput,
    ExecRequest,
    FileInfo,
    ResourceLimits,
    WorkspaceProvider,
    WorkspaceSpec,
)
from corral.streams import relay

__all__ = ["create_backend_app", "file_info_to_json", "parse_mode"]

NDJSON = "application/x-ndjson"


class _Unauthorized(CorralError):
    """The request carried no bearer token, or the wrong one."""

    code: ClassVar[str] = "unauthorized"
    http_status: ClassVar[int] = 401


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Limits(_Model):
    cpu: float = Field(gt=0)
    memory_bytes: int = Field(gt=0)
    disk_bytes: int = Field(gt=0)


class _Spec(_Model):
    image: str
    limits: _Limits | None = None
    network: Literal["isolated", "default"] = "isolated"
    container_type: Literal["agent_workspace", "mcp_server"] = "agent_workspace"
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)


class _Exec(_Model):
    argv: list[str] = Field(min_length=1)
    cwd: str = WORKSPACE_ROOT
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float | None = None


class _Move(_Model):
    src: str
    dst: str


class _Chmod(_Model):
    path: str
    mode: str


def parse_mode(text: str, *, field_name: str = "mode") -> int:
    """Parse permission bits written in octal (``"644"``, ``"0755"``)."""
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise InvalidRequestError(
            f"{field_name}: {text!r} is not octal permission bits such as 644", details={"field": field_name}
        )
    return mode


def file_info_to_json(info: FileInfo) -> dict[str, Any]:
    """The contract's spelling of a :class:`FileInfo` (``mode`` as an octal string)."""
    return {**asdict(info), "mode": f"{info.mode:04o}"}


def _json_safe(value: object) -> Any:
    """``value`` made JSON-serialisable (unknown objects become their ``str``)."""
    return json.loads(json.dumps(value, default=str))


def _line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode() + b"\n"


def create_backend_app(provider: WorkspaceProvider, *, token: str) -> FastAPI:  # noqa: PLR0915
    """A FastAPI app serving Corral's HTTP provider contract ``/v1`` on top of ``provider``.

    Every route needs ``Authorization: Bearer <token>``.
    """
    if not token:
        raise ValueError("token must not be empty: the HTTP provider contract always requires a bearer token")
    expected = f"Bearer {token}".encode()

    async def check_token(request: Request) -> None:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise _Unauthorized("missing or wrong bearer token")

    app = FastAPI(title="Corral HTTP provider backend", version="1", dependencies=[Depends(check_token)])

    @app.exception_handler(CorralError)
    async def corral_error(request: Request, exc: CorralError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, _Unauthorized) else None
        return JSONResponse(_json_safe(exc.to_json()), status_code=exc.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return await corral_error(request, InvalidRequestError("; ".join(problems), details={"problems": problems}))

    ws = "/v1/workspaces/{workspace_id}"

    # -- provider -------------------------------------------------------------------------------------------------

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        result = await provider.health()
        return {
            "healthy": result.healthy,
            "error": result.error,
            "latency_ms": result.latency_ms,
            "details": _json_safe(dict(result.details)),
        }

    @app.get("/v1/capabilities")
    async def capabilities() -> dict[str, Any]:
        caps = await provider.capabilities()
        return {**asdict(caps), "requirements": list(caps.requirements), "resources": _json_safe(dict(caps.resources))}

    # -- lifecycle ------------------------------------------------------------------------------------------------

    @app.get("/v1/workspaces")
    async def list_workspaces() -> dict[str, list[str]]:
        return {"ids": await provider.list_workspaces()}

    @app.put(ws, status_code=201)
    async def create(workspace_id: str, body: _Spec) -> dict[str, str]:
        limits = ResourceLimits(**body.limits.model_dump()) if body.limits else ResourceLimits()
        spec = WorkspaceSpec(
            id=workspace_id,
            image=body.image,
            limits=limits,
            network=body.network,
            container_type=body.container_type,
            env=body.env,
            labels=body.labels,
        )
        await provider.create(spec)
        return {"id": workspace_id}

    @app.delete(ws, status_code=204)
    async def destroy(workspace_id: str) -> Response:
        await provider.destroy(workspace_id)
        return Response(status_code=204)

    @app.post(ws + "/stop", status_code=204)
    async def stop(workspace_id: str) -> Response:
        await provider.stop(workspace_id)
        return Response(status_code=204)

    @app.post(ws + "/resume", status_code=204)
    async def resume(workspace_id: str) -> Response:
        await provider.resume(workspace_id)
        return Response(status_code=204)

    @app.get(ws)
    async def state(workspace_id: str) -> dict[str, str]:
        return {"state": (await provider.state(workspace_id)).value}

    # -- exec -----------------------------------------------------------------------------------------------------

    @app.post(ws + "/exec")
    async def exec_(workspace_id: str, body: _Exec) -> StreamingResponse:
        request = ExecRequest(body.argv[0], tuple(body.argv[1:]), ExecMode.ARGV, body.cwd, body.env, body.timeout_s)
        request.validate()
        return StreamingResponse(_exec_lines(workspace_id, request), media_type=NDJSON)

    async def _exec_lines(workspace_id: str, request: ExecRequest) -> AsyncIterator[bytes]:
        events = provider.exec_stream(workspace_id, request)
        try:
            async for event in events:
                if isinstance(event, ExecOutput):
                    yield _line({"stream": event.stream, "data_b64": base64.b64encode(event.data).decode()})
                elif isinstance(event, ExecExit):
                    yield _line({"exit_code": event.exit_code, "duration_ms": event.duration_ms})
        except CorralError as exc:
            yield _line(_json_safe(exc.to_json()))
        except Exception as exc:  # the status line is sent: the error must travel in the stream
            yield _line({"error": {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}})
        finally:
            await events.aclose()  # closing early (client gone) kills the command

    # -- files ----------------------------------------------------------------------------------------------------

    # ``beneath`` (optional on every file route) is handed to the provider, which then keeps the call inside it.

    @app.get(ws + "/files")
    async def read_file(workspace_id: str, path: str, beneath: str | None = None) -> StreamingResponse:
        chunks = await provider.read_file(workspace_id, path, beneath=beneath)
        return StreamingResponse(relay(chunks), media_type="application/octet-stream")

    @app.put(ws + "/files")
    async def write_file(
        workspace_id: str,
        path: str,
        request: Request,
        mode: Annotated[str | None, Query()] = None,
        beneath: str | None = None,
    ) -> dict[str, int]:
        bits = None if mode is None else parse_mode(mode)

        async def body() -> AsyncIterator[bytes]:
            async for chunk in request.stream():
                if chunk:
                    yield chunk

        return {"bytes_written": await provider.write_file(workspace_id, path, body(), mode=bits, beneath=beneath)}

    @app.delete(ws + "/files", status_code=204)
    async def delete(workspace_id: str, path: str, recursive: bool = False, beneath: str | None = None) -> Response:
        await provider.delete(workspace_id, path, recursive=recursive, beneath=beneath)
        return Response(status_code=204)

    @app.get(ws + "/files/stat")
    async def stat(workspace_id: str, path: str, beneath: str | None = None) -> dict[str, Any]:
        return file_info_to_json(await provider.stat(workspace_id, path, beneath=beneath))

    @app.get(ws + "/files/list")
    async def list_dir(workspace_id: str, path: str, beneath: str | None = None) -> dict[str, Any]:
        entries = await provider.list_dir(workspace_id, path, beneath=beneath)
        return {"entries": [file_info_to_json(e) for e in entries]}

    @app.post(ws + "/files/move", status_code=204)
    async def move(workspace_id: str, body: _Move, beneath: str | None = None) -> Response:
        await provider.move(workspace_id, body.src, body.dst, beneath=beneath)
        return Response(status_code=204)

    @app.post(ws + "/files/chmod", status_code=204)
    async def chmod(workspace_id: str, body: _Chmod, beneath: str | None = None) -> Response:
        await provider.chmod(workspace_id, body.path, parse_mode(body.mode), beneath=beneath)
        return Response(status_code=204)

    @app.get(ws + "/files/glob")
    async def glob(
        workspace_id: str,
        pattern: str,
        root: str = WORKSPACE_ROOT,
        limit: Annotated[int, Query(gt=0)] = 10_000,
        beneath: str | None = None,
    ) -> dict[str, list[str]]:
        return {"paths": await provider.glob(workspace_id, pattern, root=root, limit=limit, beneath=beneath)}

    @app.get(ws + "/files/realpath")
    async def realpath(workspace_id: str, path: str, beneath: str | None = None) -> dict[str, str]:
        return {"path": await provider.realpath(workspace_id, path, beneath=beneath)}

    return app
