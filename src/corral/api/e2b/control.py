"""E2B's control plane (``https://api.e2b.app``) under ``/e2b``: create, list, inspect, time out, pause, resume, kill,
fork, and snapshots.

Authentication is E2B's: ``X-API-KEY: <CORRAL_API_TOKEN>`` (``Authorization: Bearer`` works too). Errors have E2B's
shape, ``{"code": <http status>, "message": ...}``, with E2B's statuses and, where E2B's handlers word them, E2B's
messages, which the SDK turns into its own exceptions (see :mod:`corral.api.e2b._errors` for the errors no handler
answers: unknown routes, validation, oversized bodies).

How E2B concepts map onto Corral:

* ``templateID`` picks the image: ``base`` (the SDK's default) is ``CORRAL_BASE_IMAGE``; any other template is a
  snapshot's id or name when one matches (see below), else a template built here (``name`` or ``name:tag``, see
  :mod:`corral.api.e2b.templates`), else the name of an image that must already exist on the host (nothing is ever
  pulled).
* ``allow_internet_access: false`` (or ``network.denyOut`` holding ``0.0.0.0/0``) gives an ``isolated`` workspace;
  otherwise the workspace has the ``default`` network, as E2B sandboxes have internet access unless told otherwise.
* ``timeout`` is enforced on time: from the deadline on the sandbox is refused, and its timer kills it (or pauses
  it, with ``autoPause``); ``set_timeout`` moves the deadline either way, ``connect`` and ``refreshes`` only extend
  it, all within 24 h of the start (see :mod:`corral.api.e2b._state`). A kill refuses the sandbox at once, before
  its commands end. ``metadata`` and ``envVars`` are kept with the workspace; the variables reach every command.
* ``GET /v2/sandboxes`` lists newest first (``order=asc``: oldest first), filtered by ``state``, ``metadata``,
  ``template`` and ``startedAfter``, in pages of ``limit`` (default and at most 100) continued by E2B's cursor in
  ``X-Next-Token``. A sandbox being paused lists as ``paused``; one being killed is gone at once.
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

import asyncio
import base64
import binascii
import contextlib
import math
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from corral.api.e2b._errors import E2BApiError, e2b_error, json_body, status_of
from corral.api.e2b._network import egress_of_create, egress_of_update, isolated, network_json
from corral.api.e2b._snapshots import FILESYSTEM_ONLY, filesystem_only, lookup, snapshot_json
from corral.api.e2b._state import (
    DEFAULT_TIMEOUT_S,
    MAX_TIMEOUT_S,
    E2BState,
    SandboxExtras,
    clamp_timeout,
)
from corral.api.e2b.templates import resolve_template, run_start_command
from corral.egress import EgressPolicy
from corral.errors import CorralError, InvalidRequestError, WorkspaceNotFoundError
from corral.orchestrator.service import CreateWorkspace
from corral.providers.base import parse_cpu, parse_size
from corral.store import SnapshotRecord, WorkspaceRecord

__all__ = ["ENVD_VERSION", "E2BApiError", "control_router", "get_state"]

ENVD_VERSION = "0.6.4"
"""The envd version sandboxes report; the SDK (2.x) gates features on it. 0.6.4 is the first that enables all of them:
default user (0.4.0), closing stdin (0.5.2), octet-stream uploads (0.5.7), file metadata (0.6.2), watch events with
their entry (0.6.3) and watching network mounts (0.6.4). See :mod:`corral.api.e2b.envd` for what is served."""

CLIENT_ID = "corral"
DEFAULT_TEMPLATE = "base"
NO_END = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
"""``endAt`` of a workspace created through Corral's own API: it has no E2B timeout."""
FORK_TIMEOUT_S = 15
"""The lifetime of forks when the request names none (E2B's ``SandboxForkRequest`` default)."""
V1_TIMEOUT_S = 15
"""The default timeout of API v1's create and resume, and the shortest a refresh extends (E2B's
``SandboxTimeoutDefault``)."""
LIST_LIMIT = 100
"""The default and the largest page of a list (E2B's ``paginationLimit``: a larger ``limit`` is cut to it)."""
V1_LIST_MAX = 5000
"""API v1's list answers 400 past this many running sandboxes (E2B's bound; v2 pages through them)."""
_TOO_LONG = f"Timeout cannot be greater than {MAX_TIMEOUT_S // 3600} hours"
_STATES = ("running", "paused")
View = Literal["running", "paused"]


def get_state(request: Request) -> E2BState:
    """The app's E2B state, created by the router's lifespan."""
    state: E2BState = request.app.state.e2b
    return state


def _not_found(sandbox_id: str) -> E2BApiError:
    return E2BApiError(404, f"Sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")


def _invalid_body(detail: str) -> E2BApiError:
    """400 as E2B's OpenAPI validator words a request body that does not match the schema."""
    return E2BApiError(
        400, f"validation error: error in openapi3filter.RequestError: request body has an error: {detail}"
    )


def _invalid_param(name: str, detail: str) -> E2BApiError:
    """400 as E2B's OpenAPI validator words a query parameter that does not match the schema."""
    prefix = "validation error: error in openapi3filter.RequestError"
    return E2BApiError(400, f'{prefix}: parameter "{name}" in query has an error: {detail}')


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
                return e2b_error(401, "Invalid API key: send X-API-KEY: <CORRAL_API_TOKEN>")
            try:
                return await handler(request)
            except E2BApiError as exc:
                return e2b_error(exc.status, exc.message)
            except CorralError as exc:
                return e2b_error(status_of(exc), exc.message)

        return route


# --- request bodies ---------------------------------------------------------------------------------------------


def _str_map(body: Mapping[str, Any], key: str) -> dict[str, str]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _invalid_body(f'doesn\'t match schema: property "{key}": must be an object of string values')
    return dict(value)


def _int(body: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _invalid_body(f'doesn\'t match schema: property "{key}": must be a non-negative integer of seconds')
    return int(value)


def _bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _invalid_body(f'doesn\'t match schema: property "{key}": must be true or false')
    return value


def _timeout(body: Mapping[str, Any], default: int) -> int:
    """A sandbox timeout from a create, connect or resume body; over 24 h is refused, as E2B refuses it."""
    timeout = _int(body, "timeout", default)
    assert timeout is not None
    if timeout > MAX_TIMEOUT_S:
        raise E2BApiError(400, _TOO_LONG)
    return timeout


def _public_traffic(body: Mapping[str, Any]) -> bool:
    network = body.get("network")
    if not isinstance(network, dict):
        return True
    return _bool(network, "allowPublicTraffic", True)


# --- responses --------------------------------------------------------------------------------------------------


def _iso(moment: datetime | float) -> str:
    if isinstance(moment, datetime):
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # Through the same microseconds as list cursors and startedAfter compare, so a time read back filters exactly.
    seconds, fraction = divmod(_micros(moment), 1_000_000)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{fraction:06d}Z"


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


def _view(state: E2BState, record: WorkspaceRecord) -> View | None:
    """What E2B would show of a workspace: ``running``; ``paused`` (also while it is being paused, or is past its
    deadline with ``onTimeout: pause``, as E2B shows ``pausing``); None when it is no sandbox (destroyed, warm, in
    error) or is being killed, as E2B hides ``killing``."""
    if record.status not in ("ready", "paused", "stopped") or record.pool_key is not None:
        return None
    transition = state.transition(record.id)
    if transition is not None and transition.action == "kill":
        return None
    return "running" if record.status == "ready" and transition is None else "paused"


def _started_at(record: WorkspaceRecord) -> float:
    extras = SandboxExtras.of(record)
    return extras.started_at if extras.started_at is not None else record.created_at.timestamp()


def sandbox_json(state: E2BState, record: WorkspaceRecord) -> dict[str, Any]:
    """``Sandbox``: the answer to create, connect and resume."""
    extras = SandboxExtras.of(record)
    return {
        "templateID": extras.template,
        "sandboxID": record.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": state.access_token(record.id),
        # Only a private sandbox has one, as on E2B: its ports then need it (see corral.api.ports).
        "trafficAccessToken": None if extras.allow_public_traffic else state.traffic_token(record.id),
        "domain": state.service.settings.sandbox_domain,
    }


def listed_json(record: WorkspaceRecord, view: View) -> dict[str, Any]:
    """``ListedSandbox``; ``endAt`` is when a running sandbox times out, or when a paused one was paused."""
    extras = SandboxExtras.of(record)
    return {
        "templateID": extras.template,
        "sandboxID": record.id,
        "clientID": CLIENT_ID,
        "startedAt": _iso(_started_at(record)),
        "endAt": _iso(extras.end_at if extras.end_at is not None else NO_END),
        "envdVersion": ENVD_VERSION,
        "state": view,
        "metadata": extras.metadata,
        **_limits(record),
    }


def detail_json(state: E2BState, record: WorkspaceRecord, view: View) -> dict[str, Any]:
    """``SandboxDetail``: the answer to ``GET /sandboxes/{id}``; ``pauseMode`` once a pause has finished."""
    extras = SandboxExtras.of(record)
    detail = {
        **listed_json(record, view),
        "envdAccessToken": state.access_token(record.id),
        "allowInternetAccess": record.network == "default",
        "network": network_json(record, allow_public_traffic=extras.allow_public_traffic),
        "domain": state.service.settings.sandbox_domain,
        "lifecycle": {"autoResume": extras.auto_resume, "onTimeout": "pause" if extras.auto_pause else "kill"},
    }
    if record.status in ("paused", "stopped") and state.transition(record.id) is None:
        detail["pauseMode"] = "full" if record.status == "paused" else "filesystem"
    return detail


# --- the router ---------------------------------------------------------------------------------------------------


async def _record(state: E2BState, sandbox_id: str) -> tuple[WorkspaceRecord, View] | None:
    """The sandbox and what E2B would show of it, or None when E2B would not know it."""
    try:
        record = await state.service.get(sandbox_id)
    except WorkspaceNotFoundError:
        return None
    view = _view(state, record)
    return None if view is None else (record, view)


async def _visible(state: E2BState, sandbox_id: str) -> tuple[WorkspaceRecord, View]:
    """A running or paused sandbox, or 404 as E2B says it."""
    found = await _record(state, sandbox_id)
    if found is None:
        raise _not_found(sandbox_id)
    return found


async def _running(state: E2BState, sandbox_id: str) -> WorkspaceRecord:
    """A running sandbox (call it holding the sandbox's lifecycle lock): 409 while it is being paused, and 404 when
    it is paused, killed or unknown, as E2B answers a sandbox it has no running instance of."""
    record, view = await _visible(state, sandbox_id)
    transition = state.transition(sandbox_id)
    if transition is not None:
        raise E2BApiError(409, transition.message(sandbox_id))
    if view != "running":
        raise _not_found(sandbox_id)
    return record


MCP_GATEWAY_TEMPLATE = "mcp-gateway"
"""The template the SDK picks for ``Sandbox.create(mcp=...)``."""
MCP_GATEWAY_REFUSED = (
    "mcp: the MCP gateway is not supported by Corral: it pulls each MCP server's image from a registry, and Corral "
    "never pulls from registries. Run the MCP servers inside the sandbox yourself (commands.run), or serve tools "
    "through a Corral agent type (`corral mcp --agent-type ID`)"
)


async def _create(request: Request, default_timeout: int) -> JSONResponse:
    state = get_state(request)
    body = await json_body(request)
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise _invalid_body('doesn\'t match schema: property "templateID" is missing')
    if body.get("mcp") or template == MCP_GATEWAY_TEMPLATE:
        raise E2BApiError(400, MCP_GATEWAY_REFUSED)
    if body.get("volumeMounts"):
        raise E2BApiError(400, "volumeMounts: volumes are not supported by Corral")
    timeout = _timeout(body, default_timeout)
    auto_resume_body = body.get("autoResume")
    auto_pause = _bool(body, "autoPause", False)
    auto_pause_memory = _bool(body, "autoPauseMemory", True)
    auto_resume = _bool(auto_resume_body, "enabled", False) if isinstance(auto_resume_body, dict) else False
    if auto_resume and not auto_pause:
        raise E2BApiError(400, "autoResume can only be enabled when autoPause is true (onTimeout: pause)")
    if auto_resume and not auto_pause_memory:
        raise E2BApiError(
            400,
            "autoResume cannot be combined with autoPauseMemory: false: a filesystem-only pause must be resumed "
            "with an explicit connect",
        )
    extras = SandboxExtras(
        template=template,
        metadata=_str_map(body, "metadata"),
        envs=_str_map(body, "envVars"),
        auto_pause=auto_pause,
        auto_pause_memory=auto_pause_memory,
        auto_resume=auto_resume,
        timeout_s=timeout,
        allow_internet_access=not isolated(body),
        allow_public_traffic=_public_traffic(body),
    )
    egress = egress_of_create(body)
    # Whether the request chose the network, or leaves it to the snapshot it may be created from.
    network_given = body.get("allow_internet_access") is not None or body.get("network") is not None
    key = request.headers.get("idempotency-key")
    if not key:
        record = await _new_sandbox(state, extras, network_given, egress)
        return JSONResponse(sandbox_json(state, record), status_code=201)
    async with state.idempotency_lock(key):  # the SDK retries a create with the same key
        known = state.remembered(key)
        if known is not None:
            record, _ = await _visible(state, known)
        else:
            record = await _new_sandbox(state, extras, network_given, egress)
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


async def _new_sandbox(
    state: E2BState, extras: SandboxExtras, network_given: bool, egress: EgressPolicy | None = None
) -> WorkspaceRecord:
    service = state.service
    snapshot = await _snapshot_for(state, extras.template)
    template = None
    if snapshot is None:
        if extras.template != DEFAULT_TEMPLATE:
            template = await resolve_template(service.settings.docker_host, extras.template)
        record = await service.create(
            CreateWorkspace(
                limits=service.default_limits(),
                base_image=None if template is None else template.image,
                network="default" if extras.allow_internet_access else "isolated",
                metadata={"e2b": extras.to_json()},
            )
        )
    else:
        record = await _restore(state, snapshot, extras, network_given)
        extras = replace(extras, allow_internet_access=record.network == "default")
    if egress is not None:
        # In force before the create answers: nothing of the caller's has run in the sandbox yet.
        try:
            record = await service.set_egress(record.id, egress)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(service.destroy(record.id))
            raise
    if template is not None and template.start is not None:  # after the egress rules: it is the caller's code
        await run_start_command(service, record.id, template.start, extras.envs)
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
    return await _create(request, V1_TIMEOUT_S)


# --- listing ------------------------------------------------------------------------------------------------------
#
# E2B lists newest first (by start time, ties by id) in pages of ``limit``; ``X-Next-Token`` carries the cursor of
# the last item of a page (absent on the last page): base64url of "<RFC 3339 start>__<id>", so a page follows from
# where the previous one ended even when sandboxes start or end meanwhile.

_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True, slots=True)
class _Keyed:
    """A listed item with its place in the order: microseconds since the epoch, then id."""

    micros: int
    id: str
    item: Any


def _micros(moment: float) -> int:
    return round(moment * 1_000_000)


def _rfc3339(micros: int) -> str:
    """Go's RFC 3339 with nanoseconds, as E2B's cursors carry it (trailing zeros of the fraction dropped)."""
    seconds, fraction = divmod(micros, 1_000_000)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{fraction:06d}".rstrip("0")
    return f"{text}.{digits}Z" if digits else f"{text}Z"


def _parse_rfc3339(text: str) -> int:
    """Microseconds since the epoch of an RFC 3339 date-time.

    Raises:
        ValueError: ``text`` is not one.
    """
    match = _RFC3339.match(text.strip())
    if match is None:
        raise ValueError(text)
    day, clock, fraction, zone = match.groups()
    offset = timedelta(0)
    if zone not in ("Z", "z"):
        sign = -1 if zone[0] == "-" else 1
        offset = sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    moment = datetime.strptime(f"{day}T{clock}", "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone(offset))
    return int(moment.timestamp()) * 1_000_000 + int((fraction or "").ljust(6, "0")[:6])


def cursor_token(micros: int, item_id: str) -> str:
    """The ``nextToken`` that continues a list after the item started at ``micros`` with id ``item_id``."""
    return base64.urlsafe_b64encode(f"{_rfc3339(micros)}__{item_id}".encode()).decode("ascii")


def _parse_cursor(token: str) -> tuple[int, str]:
    try:
        decoded = base64.urlsafe_b64decode(token.encode("ascii")).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise ValueError(token) from None
    parts = decoded.split("__")
    if len(parts) != 2:
        raise ValueError(token)
    return _parse_rfc3339(parts[0]), parts[1]


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return LIST_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise _invalid_param("limit", f"value {raw} is not an integer") from None
    if limit < 1:
        raise _invalid_param("limit", "number must be at least 1")
    return min(limit, LIST_LIMIT)


def _page(request: Request, items: Sequence[_Keyed], *, ascending: bool = False) -> tuple[list[Any], dict[str, str]]:
    """One page of ``items`` in E2B's order (newest first unless ``ascending``) after the ``nextToken`` cursor,
    with ``X-Next-Token`` when more follow."""
    limit = _limit(request)
    ordered = sorted(items, key=lambda k: (k.micros if ascending else -k.micros, k.id))
    token = request.query_params.get("nextToken")
    if token:
        try:
            micros, last_id = _parse_cursor(token)
        except ValueError:
            raise E2BApiError(400, "Invalid next token") from None
        if ascending:
            ordered = [k for k in ordered if k.micros > micros or (k.micros == micros and k.id > last_id)]
        else:
            ordered = [k for k in ordered if k.micros < micros or (k.micros == micros and k.id > last_id)]
    page = ordered[:limit]
    headers = {"X-Next-Token": cursor_token(page[-1].micros, page[-1].id)} if len(ordered) > limit else {}
    return [k.item for k in page], headers


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """E2B's ``metadata`` query: ``k=v&k2=v2``, each key and value percent-encoded, the whole encoded once more
    (the SDK quotes each, then urlencodes the pairs). Decoded as E2B does: the whole, then each key and value."""
    if not raw:
        return {}
    wanted = {}
    for pair in _unescape(raw).split("&"):
        parts = pair.split("=")
        if len(parts) != 2:
            raise E2BApiError(400, "Error parsing metadata")
        wanted[_unescape(parts[0])] = _unescape(parts[1])
    return wanted


def _unescape(text: str) -> str:
    """Go's ``url.QueryUnescape``: "+" is a space, and a malformed escape is an error."""
    if _BAD_ESCAPE.search(text):
        raise E2BApiError(400, "Error parsing metadata")
    try:
        return urllib.parse.unquote_plus(text, errors="strict")
    except UnicodeDecodeError:
        raise E2BApiError(400, "Error parsing metadata") from None


def _states(raw: str | None) -> set[str]:
    if not raw:
        return set(_STATES)
    states = {s.strip() for s in raw.split(",")}
    for value in states - set(_STATES):
        raise _invalid_param("state", f'value "{value}" is not one of the allowed values ["running","paused"]')
    return states


def _started_after(raw: str | None) -> int | None:
    if not raw:
        return None
    try:
        return _parse_rfc3339(raw.replace(" ", "+"))  # an unencoded "+" of the offset arrives as a space
    except ValueError:
        raise _invalid_param("startedAfter", f'value "{raw}" is not an RFC 3339 date-time') from None


async def _sandboxes(state: E2BState, wanted: Mapping[str, str]) -> list[tuple[WorkspaceRecord, View]]:
    found = []
    for record in await state.service.list_workspaces():
        view = _view(state, record)
        metadata = SandboxExtras.of(record).metadata
        if view is not None and all(metadata.get(k) == v for k, v in wanted.items()):
            found.append((record, view))
    return found


async def list_v2(request: Request) -> JSONResponse:
    """Running and paused sandboxes, newest first (``order=asc``: oldest first), filtered by ``state``,
    ``metadata``, ``template`` and ``startedAfter`` (inclusive), paginated with ``limit`` and ``nextToken``."""
    state = get_state(request)
    query = request.query_params
    states = _states(query.get("state"))
    order = query.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise _invalid_param("order", 'value is not one of the allowed values ["asc","desc"]')
    started_after = _started_after(query.get("startedAfter"))
    template = query.get("template")
    _limit(request)  # checked before anything is listed, as E2B's validator does
    items, running = [], 0
    for record, view in await _sandboxes(state, _metadata_filter(query.get("metadata"))):
        micros = _micros(_started_at(record))
        if template and SandboxExtras.of(record).template != template:
            continue
        if started_after is not None and micros < started_after:
            continue
        running += view == "running"
        if view in states:
            items.append(_Keyed(micros, record.id, (record, view)))
    page, headers = _page(request, items, ascending=order == "asc")
    if "running" in states:
        headers["X-Total-Running"] = str(running)
    return JSONResponse([listed_json(record, view) for record, view in page], headers=headers)


async def list_v1(request: Request) -> JSONResponse:
    """Running sandboxes (API v1), newest first, filtered by ``metadata``; 400 past 5000 of them."""
    state = get_state(request)
    running = [
        (record, view)
        for record, view in await _sandboxes(state, _metadata_filter(request.query_params.get("metadata")))
        if view == "running"
    ]
    if len(running) > V1_LIST_MAX:
        raise E2BApiError(
            400, f"more than {V1_LIST_MAX} running sandboxes match; use GET /v2/sandboxes to page through them"
        )
    running.sort(key=lambda found: (-_micros(_started_at(found[0])), found[0].id))
    return JSONResponse([listed_json(record, view) for record, view in running])


# --- one sandbox --------------------------------------------------------------------------------------------------


async def get_sandbox(sandbox_id: str, request: Request) -> JSONResponse:
    """One sandbox's details, including its envd access token."""
    state = get_state(request)
    record, view = await _visible(state, sandbox_id)
    return JSONResponse(detail_json(state, record, view))


async def update_network(sandbox_id: str, request: Request) -> Response:
    """Replace a running sandbox's egress rules (``Sandbox.update_network``): in force when this answers."""
    state = get_state(request)
    policy = egress_of_update(await json_body(request))
    record, _ = await _visible(state, sandbox_id)
    if record.network != "default":
        raise E2BApiError(
            400,
            f"sandbox {sandbox_id} was created without network access (allow_internet_access=False and no "
            "allowOut): it has no network to set rules on; create it with network rules instead",
        )
    await state.service.set_egress(sandbox_id, policy)
    return Response(status_code=204)


async def kill(sandbox_id: str, request: Request) -> Response:
    """Kill the sandbox (running or paused): its workspace is destroyed. It is refused at once, so its envd health
    check says it is gone before its commands' streams end; 404 once it is gone or being killed."""
    state = get_state(request)
    if await _record(state, sandbox_id) is None:
        raise E2BApiError(404, "Sandbox not found")
    await state.kill(sandbox_id)
    return Response(status_code=204)


async def set_timeout(sandbox_id: str, request: Request) -> Response:
    """The running sandbox now times out ``timeout`` seconds from now (sooner or later than before), at most 24 h
    after it started; 404 when it is not running."""
    state = get_state(request)
    timeout = _int(await json_body(request), "timeout", None)
    if timeout is None:
        raise _invalid_body('doesn\'t match schema: property "timeout" is missing')
    async with state.lifecycle_lock(sandbox_id):
        record = await _running(state, sandbox_id)
        if time.time() - _started_at(record) > MAX_TIMEOUT_S:
            raise E2BApiError(400, "Max instance length exceeded")
        await state.set_timeout(record, timeout)
    return Response(status_code=204)


async def refresh(sandbox_id: str, request: Request) -> Response:
    """Keep the running sandbox alive ``duration`` more seconds (at least 15; never shortens its life)."""
    state = get_state(request)
    duration = max(_int(await json_body(request), "duration", None) or V1_TIMEOUT_S, V1_TIMEOUT_S)
    async with state.lifecycle_lock(sandbox_id):
        record = await _running(state, sandbox_id)
        await state.set_timeout(record, duration, only_extend=True)
    return Response(status_code=204)


async def _settled(state: E2BState, sandbox_id: str) -> tuple[WorkspaceRecord, View] | None:
    """The sandbox once the kill or pause its passed deadline calls for is done (call it holding its lifecycle
    lock): E2B's proxy and API wait out ``pausing`` before they resume a sandbox."""
    if state.transition(sandbox_id) is not None:
        await state.settle(sandbox_id)
    return await _record(state, sandbox_id)


async def pause(sandbox_id: str, request: Request) -> Response:
    """Pause, keeping processes and memory (with ``memory: false``, only the disk). 409 when already paused."""
    state = get_state(request)
    memory = _bool(await json_body(request), "memory", True)
    async with state.lifecycle_lock(sandbox_id):
        _, view = await _visible(state, sandbox_id)
        transition = state.transition(sandbox_id)
        if transition is not None:
            raise E2BApiError(409, transition.message(sandbox_id))
        if view != "running":
            raise E2BApiError(409, f'Sandbox "{sandbox_id}" is already paused')
        await state.pause(sandbox_id, memory=memory)
    return Response(status_code=204)


async def _wake(request: Request, sandbox_id: str, *, timeout_default: int | None) -> JSONResponse:
    """Connect (and resume, API v1): 200 for a running sandbox (its timeout only extended), 201 after resuming a
    paused one (with its processes and memory, or from its disk with ``memory: false``)."""
    state = get_state(request)
    body = await json_body(request)
    if timeout_default is None and body.get("timeout") is None:
        raise _invalid_body('doesn\'t match schema: property "timeout" is missing')
    timeout, memory = _timeout(body, timeout_default or 0), _bool(body, "memory", True)
    async with state.lifecycle_lock(sandbox_id):
        found = await _settled(state, sandbox_id)
        if found is None:
            raise E2BApiError(404, "Sandbox can't be resumed, no snapshot found")
        record, view = found
        if view == "running":
            await state.set_timeout(record, timeout, only_extend=True)
            return JSONResponse(sandbox_json(state, record), status_code=200)
        record = await state.wake(sandbox_id, timeout, memory=memory)
    return JSONResponse(sandbox_json(state, record), status_code=201)


async def connect(sandbox_id: str, request: Request) -> JSONResponse:
    """Connect (v2): the timeout defaults to 300 s."""
    return await _wake(request, sandbox_id, timeout_default=DEFAULT_TIMEOUT_S)


async def connect_v1(sandbox_id: str, request: Request) -> JSONResponse:
    """Connect (v1): the timeout is required."""
    return await _wake(request, sandbox_id, timeout_default=None)


async def resume(sandbox_id: str, request: Request) -> JSONResponse:
    """Resume a paused sandbox (API v1, deprecated), with its memory unless ``memory: false``; the timeout
    defaults to 15 s; 409 when it is running."""
    state = get_state(request)
    body = await json_body(request)
    timeout, memory = _timeout(body, V1_TIMEOUT_S), _bool(body, "memory", True)
    async with state.lifecycle_lock(sandbox_id):
        found = await _settled(state, sandbox_id)
        if found is None:
            raise _not_found(sandbox_id)
        record, view = found
        if view == "running":
            raise E2BApiError(409, f'Sandbox "{sandbox_id}" is already running')
        if body.get("autoPause") is not None:
            await state.save(record, replace(SandboxExtras.of(record), auto_pause=_bool(body, "autoPause", False)))
        record = await state.wake(sandbox_id, timeout, memory=memory)
    return JSONResponse(sandbox_json(state, record), status_code=201)


async def fork(sandbox_id: str, request: Request) -> JSONResponse:
    """``count`` new sandboxes with the running sandbox's files and processes; it carries on. All or nothing: a
    failure answers one error and leaves no fork, so every entry of a 201 holds a sandbox."""
    state = get_state(request)
    body = await json_body(request)
    timeout = clamp_timeout(_int(body, "timeout", FORK_TIMEOUT_S) or FORK_TIMEOUT_S)
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int):
        raise _invalid_body(f'doesn\'t match schema: property "count": must be an integer, not {count!r}')
    async with state.lifecycle_lock(sandbox_id):
        source, view = await _visible(state, sandbox_id)
        if view != "running":
            raise E2BApiError(409, f'Sandbox "{sandbox_id}" is paused; connect to it before forking it')
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
    body = await json_body(request)
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise _invalid_body('doesn\'t match schema: property "name": must be a string')
    memory = _bool(body, "memory", True)
    async with state.lifecycle_lock(sandbox_id):
        _, view = await _visible(state, sandbox_id)
        if view != "running":
            raise E2BApiError(409, f'Sandbox "{sandbox_id}" is paused; connect to it before taking a snapshot')
        snapshot = await state.snapshots.create(
            sandbox_id, name=name or None, metadata=None if memory else FILESYSTEM_ONLY
        )
    return JSONResponse(snapshot_json(snapshot), status_code=201)


async def list_snapshots(request: Request) -> JSONResponse:
    """Ready snapshots, newest first, optionally of one sandbox (``sandboxID``) or by name or id (``name``),
    paginated as the sandbox list is."""
    state = get_state(request)
    sandbox_id = request.query_params.get("sandboxID") or None
    name = request.query_params.get("name")
    if name:
        found = [r for r in await lookup(state.snapshots, name) if sandbox_id is None or r.workspace_id == sandbox_id]
    else:
        found = await state.snapshots.find(workspace_id=sandbox_id)
    items = [_Keyed(_micros(r.created_at.timestamp()), r.id, r) for r in found if r.status == "ready"]
    page, headers = _page(request, items)
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
        ("DELETE", "/sandboxes/{sandbox_id}", kill, 204),
        ("POST", "/sandboxes/{sandbox_id}/timeout", set_timeout, 204),
        ("PUT", "/sandboxes/{sandbox_id}/network", update_network, 204),
        ("POST", "/sandboxes/{sandbox_id}/refreshes", refresh, 204),
        ("POST", "/sandboxes/{sandbox_id}/pause", pause, 204),
        ("POST", "/sandboxes/{sandbox_id}/resume", resume, 201),
        ("POST", "/sandboxes/{sandbox_id}/connect", connect_v1, 200),
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
