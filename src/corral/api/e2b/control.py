"""E2B's control plane (``https://api.e2b.app``) under ``/e2b``: create, list, inspect, time out, pause, resume, kill,
fork, and snapshots.

Authentication is E2B's: ``X-API-KEY: <CORRAL_API_TOKEN>`` (``Authorization: Bearer`` works too). Errors have E2B's
shape, ``{"code": <http status>, "message": ...}``, which the SDK turns into its own exceptions.

How E2B concepts map onto Corral:

* ``templateID`` picks the image: ``base`` (the SDK's default) is ``CORRAL_BASE_IMAGE``; any other template is a
  snapshot's id or name when one matches (see below), else the name of an image that must already exist on the host
  (nothing is ever pulled).
* ``allow_internet_access: false`` (or ``network.denyOut`` holding ``0.0.0.0/0``) gives an ``isolated`` workspace;
  otherwise the workspace has the ``default`` network, as E2B sandboxes have internet access unless told otherwise.
* ``timeout`` is enforced: a sweeper kills the sandbox when it passes (or pauses it, with ``autoPause``), and
  ``set_timeout``, ``connect`` and ``resume`` move the deadline. ``metadata`` and ``envVars`` are kept with the
  workspace (see :mod:`corral.api.e2b._state`); the variables reach every command.
* ``pause`` is Corral's pause: processes, memory and open files are kept where the provider can (gVisor), and
  ``connect`` (or ``resume``) brings them back; with ``memory: false`` it is a stop, and the sandbox cold-boots from
  its disk when resumed. Both show as E2B's ``paused``. With ``autoResume`` a request to a sandbox paused with its
  memory resumes it (see :mod:`corral.api.e2b.envd`). Commands the SDK is tracking end at a pause; a process that
  should survive it must leave the command's process group (``setsid``).
* Snapshots are Corral snapshots and ``fork`` is Corral's fork (see :mod:`corral.api.e2b._snapshots` for ids and
  names); a ``templateID`` naming a snapshot creates the sandbox from it.
* CPU, memory and disk come from ``WORKSPACE_DEFAULT_*``; provider selection is Corral's ``auto``.
"""

from __future__ import annotations

import math
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from corral.api.e2b._snapshots import FILESYSTEM_ONLY, filesystem_only, lookup, snapshot_json
from corral.api.e2b._state import DEFAULT_TIMEOUT_S, E2BState, SandboxExtras, clamp_timeout
from corral.errors import (
    CorralError,
    InvalidRequestError,
    ProviderNotFoundError,
    ResourceLimitError,
    WorkspaceDestroyedError,
    WorkspaceNotFoundError,
)
from corral.orchestrator.service import CreateWorkspace
from corral.providers.base import parse_cpu, parse_size
from corral.store import SnapshotRecord, WorkspaceRecord

__all__ = ["ENVD_VERSION", "E2BApiError", "control_router", "get_state"]

ENVD_VERSION = "0.5.7"
"""The envd version sandboxes report. It tells the SDK which envd features to use: default user (0.4.0), closing
stdin (0.5.2) and octet-stream uploads (0.5.7) are served; file metadata (0.6.2) is not, so the SDK refuses it."""

CLIENT_ID = "corral"
DEFAULT_TEMPLATE = "base"
NO_END = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
"""``endAt`` of a workspace created through Corral's own API: it has no E2B timeout."""
_T = TypeVar("_T")
FORK_TIMEOUT_S = 15
"""The lifetime of forks when the request names none (E2B's ``SandboxForkRequest`` default)."""


class E2BApiError(Exception):
    """An answer in E2B's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def get_state(request: Request) -> E2BState:
    """The app's E2B state, created by the router's lifespan."""
    state: E2BState = request.app.state.e2b
    return state


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _status_of(exc: CorralError) -> int:
    if isinstance(exc, WorkspaceNotFoundError | WorkspaceDestroyedError):
        return 404
    if isinstance(exc, InvalidRequestError | ProviderNotFoundError):
        return 400
    if isinstance(exc, ResourceLimitError):
        return 422
    # 500 rather than E2B's 503: the SDK retries 503s with backoff, which only delays a real provider failure.
    return 500 if exc.http_status >= 500 else exc.http_status


class _ControlRoute(APIRoute):
    """Checks the API key and turns every failure into E2B's error shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            key = request.headers.get("x-api-key")
            if key is None:
                scheme, _, token = request.headers.get("authorization", "").partition(" ")
                key = token.strip() if scheme.lower() == "bearer" else None
            if key is None or not get_state(request).api_key_matches(key):
                return _error(401, "Invalid API key: send X-API-KEY: <CORRAL_API_TOKEN>")
            try:
                return await handler(request)
            except E2BApiError as exc:
                return _error(exc.status, exc.message)
            except CorralError as exc:
                return _error(_status_of(exc), exc.message)

        return route


# --- request bodies ---------------------------------------------------------------------------------------------


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise E2BApiError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise E2BApiError(400, "request body must be a JSON object")
    return body


def _str_map(body: Mapping[str, Any], key: str) -> dict[str, str]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise E2BApiError(400, f"{key}: must be an object of string values")
    return dict(value)


def _int(body: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise E2BApiError(400, f"{key}: must be a non-negative number of seconds")
    return int(value)


def _bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise E2BApiError(400, f"{key}: must be true or false")
    return value


def _isolated(body: Mapping[str, Any]) -> bool:
    if body.get("allow_internet_access") is False:
        return True
    network = body.get("network")
    if isinstance(network, dict):
        deny = network.get("denyOut") or network.get("deny_out") or []
        return isinstance(deny, list) and "0.0.0.0/0" in deny
    return False


# --- responses --------------------------------------------------------------------------------------------------


def _iso(moment: datetime | float) -> str:
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _limits(record: WorkspaceRecord) -> dict[str, int]:
    limits = record.resource_limits
    out = {"cpuCount": 1, "memoryMB": 0, "diskSizeMB": 0}
    try:
        out["cpuCount"] = max(1, math.ceil(parse_cpu(limits.get("cpu", "1"))))
        out["memoryMB"] = parse_size(limits.get("memory", "0") or "1", field_name="memory") // (1024 * 1024)
        out["diskSizeMB"] = parse_size(limits.get("disk", "0") or "1", field_name="disk") // (1024 * 1024)
    except InvalidRequestError:
        pass
    return out


def _state_of(record: WorkspaceRecord) -> Literal["running", "paused"]:
    return "running" if record.status == "ready" else "paused"


def sandbox_json(state: E2BState, record: WorkspaceRecord) -> dict[str, Any]:
    """``Sandbox``: the answer to create, connect and resume."""
    extras = SandboxExtras.of(record)
    return {
        "templateID": extras.template,
        "sandboxID": record.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": state.access_token(record.id),
        "trafficAccessToken": None,
        "domain": None,
    }


def listed_json(record: WorkspaceRecord) -> dict[str, Any]:
    """``ListedSandbox``."""
    extras = SandboxExtras.of(record)
    return {
        "templateID": extras.template,
        "sandboxID": record.id,
        "clientID": CLIENT_ID,
        "startedAt": _iso(extras.started_at if extras.started_at is not None else record.created_at),
        "endAt": _iso(extras.end_at if extras.end_at is not None else NO_END),
        "envdVersion": ENVD_VERSION,
        "state": _state_of(record),
        "metadata": extras.metadata,
        **_limits(record),
    }


def detail_json(state: E2BState, record: WorkspaceRecord) -> dict[str, Any]:
    """``SandboxDetail``: the answer to ``GET /sandboxes/{id}``."""
    extras = SandboxExtras.of(record)
    return {
        **listed_json(record),
        "envdAccessToken": state.access_token(record.id),
        "allowInternetAccess": record.network == "default",
        "domain": None,
        "lifecycle": {"autoResume": extras.auto_resume, "onTimeout": "pause" if extras.auto_pause else "kill"},
    }


# --- the router ---------------------------------------------------------------------------------------------------


async def _visible(state: E2BState, sandbox_id: str) -> WorkspaceRecord:
    """A running or paused sandbox, or 404 as E2B says it."""
    try:
        record = await state.service.get(sandbox_id)
    except WorkspaceNotFoundError:
        record = None
    if record is None or record.status not in ("ready", "paused", "stopped") or record.pool_key is not None:
        raise E2BApiError(404, f"sandbox {sandbox_id!r} doesn't exist or you don't have access to it")
    return record


def _metadata_filter(raw: str | None) -> dict[str, str]:
    # The SDK percent-encodes each key and value, then urlencodes the pairs into one query parameter.
    if not raw:
        return {}
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in urllib.parse.parse_qsl(raw)}


async def _create(request: Request, default_timeout: int) -> JSONResponse:
    state = get_state(request)
    body = await _body(request)
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise E2BApiError(400, "templateID: a template name is required")
    if body.get("mcp"):
        raise E2BApiError(400, "mcp: MCP gateways are not supported by Corral")
    if body.get("volumeMounts"):
        raise E2BApiError(400, "volumeMounts: volumes are not supported by Corral")
    timeout = clamp_timeout(_int(body, "timeout", default_timeout) or default_timeout)
    auto_resume = body.get("autoResume")
    extras = SandboxExtras(
        template=template,
        metadata=_str_map(body, "metadata"),
        envs=_str_map(body, "envVars"),
        auto_pause=_bool(body, "autoPause", False),
        auto_pause_memory=_bool(body, "autoPauseMemory", True),
        auto_resume=_bool(auto_resume, "enabled", False) if isinstance(auto_resume, dict) else False,
        timeout_s=timeout,
        allow_internet_access=not _isolated(body),
    )
    # Whether the request chose the network, or leaves it to the snapshot it may be created from.
    network_given = body.get("allow_internet_access") is not None or body.get("network") is not None
    key = request.headers.get("idempotency-key")
    if not key:
        return JSONResponse(sandbox_json(state, await _new_sandbox(state, extras, network_given)), status_code=201)
    async with state.idempotency_lock(key):  # the SDK retries a create with the same key
        known = state.remembered(key)
        if known is not None:
            record = await _visible(state, known)
        else:
            record = await _new_sandbox(state, extras, network_given)
        state.remember(key, record.id)
    return JSONResponse(sandbox_json(state, record), status_code=201)


async def _snapshot_for(state: E2BState, template: str) -> SnapshotRecord | None:
    """The snapshot a ``templateID`` names, or None when it names an image (the default template never does)."""
    if template == DEFAULT_TEMPLATE:
        return None
    named = await lookup(state.snapshots, template)
    ready = [r for r in named if r.status == "ready"]
    if named and not ready:
        raise E2BApiError(
            409,
            f"snapshot {template!r} is {named[0].status}{': ' + named[0].error if named[0].error else ''}; only a "
            "ready snapshot can start a sandbox",
        )
    return ready[0] if ready else None


async def _new_sandbox(state: E2BState, extras: SandboxExtras, network_given: bool) -> WorkspaceRecord:
    service = state.service
    snapshot = await _snapshot_for(state, extras.template)
    if snapshot is None:
        record = await service.create(
            CreateWorkspace(
                limits=service.default_limits(),
                base_image=None if extras.template == DEFAULT_TEMPLATE else extras.template,
                network="default" if extras.allow_internet_access else "isolated",
                metadata={"e2b": extras.to_json()},
            )
        )
    else:
        record = await _restore(state, snapshot, extras, network_given)
        extras = replace(extras, allow_internet_access=record.network == "default")
    now = time.time()  # the timeout counts from when the sandbox is ready, not from the request
    return await state.save(record, replace(extras, started_at=now, end_at=now + extras.timeout_s))


async def _restore(
    state: E2BState, snapshot: SnapshotRecord, extras: SandboxExtras, network_given: bool
) -> WorkspaceRecord:
    """A new workspace from a snapshot; cold-booted from its disk when the snapshot was taken without memory."""
    if network_given and extras.allow_internet_access != (snapshot.network == "default"):
        raise E2BApiError(
            400,
            f"allow_internet_access: a sandbox from snapshot {snapshot.id} has the snapshot's network "
            f"({snapshot.network}); leave allow_internet_access and network unset, or match it",
        )
    record = await state.snapshots.restore(snapshot.id)
    if filesystem_only(snapshot):
        await state.service.stop(record.id)  # drops the restored processes; the disk stays
        record = await state.service.resume(record.id)
    return record


async def create_v2(request: Request) -> JSONResponse:
    """Create a sandbox (the SDK's ``Sandbox.create``); the timeout defaults to 300 s."""
    return await _create(request, DEFAULT_TIMEOUT_S)


async def create_v1(request: Request) -> JSONResponse:
    """Create a sandbox (API v1); the timeout defaults to 15 s as in E2B's v1 API."""
    return await _create(request, 15)


async def _listing(request: Request, states: set[str]) -> list[WorkspaceRecord]:
    state = get_state(request)
    wanted = _metadata_filter(request.query_params.get("metadata"))
    template = request.query_params.get("template")
    records = []
    for record in await state.service.list_workspaces():
        if record.status not in ("ready", "paused", "stopped") or _state_of(record) not in states:
            continue
        extras = SandboxExtras.of(record)
        if any(extras.metadata.get(k) != v for k, v in wanted.items()):
            continue
        if template and extras.template != template:
            continue
        records.append(record)
    if request.query_params.get("order") == "desc":
        records.reverse()
    return records


async def list_v2(request: Request) -> JSONResponse:
    """Running and paused sandboxes, filtered by ``state``, ``metadata`` and ``template``, paginated."""
    raw_states = request.query_params.get("state")
    states = {s.strip() for s in raw_states.split(",")} if raw_states else {"running", "paused"}
    page, headers = _page(request, await _listing(request, states))
    return JSONResponse([listed_json(r) for r in page], headers=headers)


def _page(request: Request, items: list[_T]) -> tuple[list[_T], dict[str, str]]:
    """One page of ``items`` (``limit``, and ``nextToken`` from the previous page's ``x-next-token`` header)."""
    try:
        limit = max(1, min(int(request.query_params.get("limit", "100")), 1000))
        offset = int(request.query_params.get("nextToken") or 0)
    except ValueError:
        raise E2BApiError(400, "limit and nextToken must be integers") from None
    headers = {"x-next-token": str(offset + limit)} if offset + limit < len(items) else {}
    return items[offset : offset + limit], headers


async def list_v1(request: Request) -> JSONResponse:
    """Running sandboxes (API v1), filtered by ``metadata``."""
    return JSONResponse([listed_json(r) for r in await _listing(request, {"running"})])


async def get_sandbox(sandbox_id: str, request: Request) -> JSONResponse:
    """One sandbox's details, including its envd access token."""
    state = get_state(request)
    return JSONResponse(detail_json(state, await _visible(state, sandbox_id)))


async def metrics(sandbox_id: str, request: Request) -> JSONResponse:
    """No metrics are collected: an empty list."""
    await _visible(get_state(request), sandbox_id)
    return JSONResponse([])


async def kill(sandbox_id: str, request: Request) -> Response:
    """Kill the sandbox: its workspace is destroyed."""
    state = get_state(request)
    await _visible(state, sandbox_id)
    await state.processes.forget(sandbox_id)
    await state.service.destroy(sandbox_id)
    state.forget(sandbox_id)
    return Response(status_code=204)


async def set_timeout(sandbox_id: str, request: Request) -> Response:
    """The sandbox now times out ``timeout`` seconds from now."""
    state = get_state(request)
    timeout = _int(await _body(request), "timeout", None)
    if timeout is None:
        raise E2BApiError(400, "timeout: required")
    await state.set_timeout(await _visible(state, sandbox_id), timeout)
    return Response(status_code=204)


async def refresh(sandbox_id: str, request: Request) -> Response:
    """Keep the sandbox alive ``duration`` more seconds (never shortens its life)."""
    state = get_state(request)
    duration = _int(await _body(request), "duration", None) or DEFAULT_TIMEOUT_S
    await state.set_timeout(await _visible(state, sandbox_id), duration, only_extend=True)
    return Response(status_code=204)


async def pause(sandbox_id: str, request: Request) -> Response:
    """Pause, keeping processes and memory (with ``memory: false``, only the disk). 409 when already paused."""
    state = get_state(request)
    memory = _bool(await _body(request), "memory", True)
    async with state.lifecycle_lock(sandbox_id):
        record = await _visible(state, sandbox_id)
        if record.status != "ready":
            raise E2BApiError(409, f"sandbox {sandbox_id!r} is already paused")
        await state.pause(sandbox_id, memory=memory)
    return Response(status_code=204)


async def resume(sandbox_id: str, request: Request) -> JSONResponse:
    """Resume a paused sandbox (API v1), with its memory unless ``memory: false``; 409 when it is running."""
    state = get_state(request)
    body = await _body(request)
    timeout, memory = _int(body, "timeout", None), _bool(body, "memory", True)
    async with state.lifecycle_lock(sandbox_id):
        record = await _visible(state, sandbox_id)
        if record.status == "ready":
            raise E2BApiError(409, f"sandbox {sandbox_id!r} is already running")
        if body.get("autoPause") is not None:
            extras = replace(SandboxExtras.of(record), auto_pause=_bool(body, "autoPause", False))
            await state.save(record, extras)
        record = await state.wake(sandbox_id, timeout, memory=memory)
    return JSONResponse(sandbox_json(state, record), status_code=201)


async def connect(sandbox_id: str, request: Request) -> JSONResponse:
    """Connect: 200 for a running sandbox (its timeout only extended), 201 after resuming a paused one (with its
    processes and memory, or from its disk with ``memory: false``)."""
    state = get_state(request)
    body = await _body(request)
    timeout, memory = _int(body, "timeout", None), _bool(body, "memory", True)
    async with state.lifecycle_lock(sandbox_id):
        record = await _visible(state, sandbox_id)
        if record.status == "ready":
            if timeout is not None:
                await state.set_timeout(record, timeout, only_extend=True)
            return JSONResponse(sandbox_json(state, record), status_code=200)
        record = await state.wake(sandbox_id, timeout, memory=memory)
    return JSONResponse(sandbox_json(state, record), status_code=201)


async def fork(sandbox_id: str, request: Request) -> JSONResponse:
    """``count`` new sandboxes with the running sandbox's files and processes; it carries on. All or nothing: a
    failure answers one error and leaves no fork, so every entry of a 201 holds a sandbox."""
    state = get_state(request)
    body = await _body(request)
    timeout = clamp_timeout(_int(body, "timeout", FORK_TIMEOUT_S) or FORK_TIMEOUT_S)
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int):
        raise E2BApiError(400, f"count: must be an integer, not {count!r}")
    async with state.lifecycle_lock(sandbox_id):
        source = await _visible(state, sandbox_id)
        if source.status != "ready":
            raise E2BApiError(409, f"sandbox {sandbox_id!r} is paused; connect to it before forking it")
        records = await state.snapshots.fork(sandbox_id, count)
    extras = SandboxExtras.of(source)
    now = time.time()
    forks = []
    for record in records:
        saved = await state.save(record, replace(extras, started_at=now, end_at=now + timeout, timeout_s=timeout))
        forks.append({"sandbox": sandbox_json(state, saved)})
    return JSONResponse(forks, status_code=201)


# --- snapshots ----------------------------------------------------------------------------------------------------


async def create_snapshot(sandbox_id: str, request: Request) -> JSONResponse:
    """Snapshot a running sandbox (files, processes and memory; files only with ``memory: false``)."""
    state = get_state(request)
    body = await _body(request)
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise E2BApiError(400, "name: must be a string")
    memory = _bool(body, "memory", True)
    async with state.lifecycle_lock(sandbox_id):
        record = await _visible(state, sandbox_id)
        if record.status != "ready":
            raise E2BApiError(409, f"sandbox {sandbox_id!r} is paused; connect to it before taking a snapshot")
        snapshot = await state.snapshots.create(
            sandbox_id, name=name or None, metadata=None if memory else FILESYSTEM_ONLY
        )
    return JSONResponse(snapshot_json(snapshot), status_code=201)


async def list_snapshots(request: Request) -> JSONResponse:
    """Ready snapshots, newest first, optionally of one sandbox (``sandboxID``) or by name or id (``name``)."""
    state = get_state(request)
    sandbox_id = request.query_params.get("sandboxID") or None
    name = request.query_params.get("name")
    if name:
        found = [r for r in await lookup(state.snapshots, name) if sandbox_id is None or r.workspace_id == sandbox_id]
    else:
        found = await state.snapshots.find(workspace_id=sandbox_id)
    page, headers = _page(request, [r for r in found if r.status == "ready"])
    return JSONResponse([snapshot_json(r) for r in page], headers=headers)


async def delete_template(template_id: str, request: Request) -> Response:
    """Delete a snapshot by id, or every snapshot with a name (E2B deletes a snapshot as a template); 404 for a
    name no snapshot has (Corral's images are not E2B templates to delete)."""
    state = get_state(request)
    named = await lookup(state.snapshots, template_id)
    if not named:
        raise E2BApiError(404, f"snapshot {template_id!r} doesn't exist or you don't have access to it")
    if all(r.status == "creating" for r in named):
        raise E2BApiError(409, f"snapshot {template_id!r} is still being taken; delete it once it is ready")
    for record in named:
        if record.status != "creating":
            await state.snapshots.delete(record.id)
    return Response(status_code=204)


def control_router() -> APIRouter:
    """The control-plane routes (mounted under ``/e2b`` by :func:`corral.api.e2b.e2b_routers`)."""
    router = APIRouter(route_class=_ControlRoute, tags=["e2b"])
    routes: list[tuple[str, str, Callable[..., Awaitable[Response]], int]] = [
        ("POST", "/v2/sandboxes", create_v2, 201),
        ("POST", "/sandboxes", create_v1, 201),
        ("GET", "/v2/sandboxes", list_v2, 200),
        ("GET", "/sandboxes", list_v1, 200),
        ("GET", "/sandboxes/{sandbox_id}", get_sandbox, 200),
        ("GET", "/sandboxes/{sandbox_id}/metrics", metrics, 200),
        ("DELETE", "/sandboxes/{sandbox_id}", kill, 204),
        ("POST", "/sandboxes/{sandbox_id}/timeout", set_timeout, 204),
        ("POST", "/sandboxes/{sandbox_id}/refreshes", refresh, 204),
        ("POST", "/sandboxes/{sandbox_id}/pause", pause, 204),
        ("POST", "/sandboxes/{sandbox_id}/resume", resume, 201),
        ("POST", "/sandboxes/{sandbox_id}/connect", connect, 200),
        ("POST", "/v2/sandboxes/{sandbox_id}/connect", connect, 200),
        ("POST", "/sandboxes/{sandbox_id}/fork", fork, 201),
        ("POST", "/sandboxes/{sandbox_id}/snapshots", create_snapshot, 201),
        ("GET", "/snapshots", list_snapshots, 200),
        # The SDK percent-encodes the id as one segment; a name may hold "/" once decoded, hence ":path".
        ("DELETE", "/templates/{template_id:path}", delete_template, 204),
    ]
    for method, path, endpoint, status in routes:
        router.add_api_route(path, endpoint, methods=[method], status_code=status, name=f"e2b_{endpoint.__name__}")
    return router
