"""``/api/v1/agent/workspaces``: create, inspect and operate workspaces (the README's "HTTP API").

Each route declares the error statuses its work can end in; 400 for invalid input, 401 and 413 are added to the
OpenAPI document by :mod:`corral.api.openapi`. Every workspace answer names its ``isolation``.
"""

from __future__ import annotations

import contextlib
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from corral.api.deps import ServiceDep, SnapshotsDep
from corral.api.errors import error_responses
from corral.api.exec_stream import KILLED_EXIT_CODE, NDJSON_CONTENT, NdjsonResponse, ndjson_events
from corral.api.schemas import (
    ChmodBody,
    CreateWorkspaceBody,
    DirectoryListing,
    ExecBody,
    ExecResponse,
    FileInfoModel,
    ForkBody,
    ForkResponse,
    GlobResponse,
    MoveBody,
    PausedWorkspace,
    PoolStatusResponse,
    ProvidersResponse,
    SnapshotBody,
    SnapshotList,
    SnapshotModel,
    WorkspaceList,
    WorkspaceModel,
    WriteFileResponse,
)
from corral.errors import ExecTimeoutError, InvalidRequestError
from corral.orchestrator.archives import extract_archive, open_archive
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.orchestrator.stdin import stdin_file
from corral.providers.base import WORKSPACE_ROOT, ExecMode, ExecRequest, ResourceLimits
from corral.store import WorkspaceRecord
from corral.streams import relay

__all__ = ["router", "snapshots_router"]

router = APIRouter(prefix="/api/v1/agent/workspaces", tags=["workspaces"])

DEFAULT_EXEC_TIMEOUT_S = 600.0
# minLength is documented, not enforced here: the service refuses an empty path with a clearer message.
PathQuery = Annotated[
    str, Query(description="a path inside /workspace; relative paths start there", json_schema_extra={"minLength": 1})
]

# What operating on a workspace can end in: not found, destroyed, not in a state for it, or its runtime failing
# (the provider unavailable, the agent broken or not answering in time).
WORKSPACE_ERRORS = (404, 409, 410, 502, 503, 504)
RAW_BYTES = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


class OctetStreamResponse(StreamingResponse):
    """A streamed body of raw bytes."""

    media_type = "application/octet-stream"


def _model(service: WorkspaceService, record: WorkspaceRecord) -> WorkspaceModel:
    return WorkspaceModel.of(
        record, isolation=service.isolation_of(record.provider), lifetime=service.workspace_lifetime(record)
    )


@router.get("/providers")
async def list_providers(service: ServiceDep) -> ProvidersResponse:
    """Every configured provider with its cached health, active workspaces and capabilities."""
    return ProvidersResponse.model_validate({"providers": await service.provider_status()})


@router.get("/pool")
async def pool_status(service: ServiceDep) -> PoolStatusResponse:
    """Each warm pool: provider, image, target and current size, hits and misses (with reasons)."""
    if service.pools is None:
        return PoolStatusResponse(pools=[], unpooled_misses={})
    return PoolStatusResponse.model_validate(
        {"pools": await service.pools.status(), "unpooled_misses": service.pools.unpooled_misses()}
    )


@router.post("", status_code=201, responses=error_responses(403, 404, 409, 422, 503, 422))
async def create_workspace(
    body: CreateWorkspaceBody,
    service: ServiceDep,
    snapshots: SnapshotsDep,
    keep_failed: Annotated[
        bool,
        Query(
            description="keep the workspace's record, in status error, when the create fails (by default it is "
            "deleted; the error answer says what failed either way); kept ones go after CORRAL_FAILED_RECORD_TTL_S"
        ),
    ] = False,
) -> WorkspaceModel:
    """Create a workspace; ``provider`` omitted or ``"auto"`` lets Corral choose and fall back. With
    ``from_snapshot`` it is restored from that snapshot instead (404 when it does not exist, 409 when not ready).

    Only provider failures fall back: bad input (400), limits no host here can give (422) and a provider the
    operator has not allowed (403, plain ``docker`` unless CORRAL_ALLOW_DOCKER_FALLBACK is true) are refused before
    any provider is tried.
    """
    if body.from_snapshot is not None:
        given = sorted(
            f
            for f in ("provider", "resource_limits", "base_image", "network", "container_type")
            if f in body.model_fields_set
        )
        if given:
            raise InvalidRequestError(
                f"{', '.join(given)}: not allowed with from_snapshot; a restored workspace takes them from its "
                "snapshot",
                details={"fields": given},
            )
        return _model(service, await snapshots.restore(body.from_snapshot, metadata=body.metadata))
    limits = ResourceLimits.parse(body.resource_limits, defaults=service.default_limits())
    record = await service.create(
        CreateWorkspace(
            provider=body.provider,
            container_type=body.container_type,
            limits=limits,
            base_image=body.base_image,
            network=body.network,
            metadata=body.metadata,
            keep_failed=keep_failed,
        )
    )
    return _model(service, record)


@router.get("")
async def list_workspaces(
    service: ServiceDep,
    include_warm: Annotated[
        bool, Query(description="also the warm-pool workspaces waiting to be claimed (each with warm: true)")
    ] = False,
) -> WorkspaceList:
    """Every workspace that is not destroyed; warm-pool ones only with ``include_warm=true``."""
    records = await service.list_workspaces(include_warm=include_warm)
    return WorkspaceList(workspaces=[_model(service, r) for r in records])


@router.get("/{workspace_id}", responses=error_responses(404))
async def get_workspace(workspace_id: str, service: ServiceDep) -> WorkspaceModel:
    """One workspace (destroyed ones too, with status ``destroyed``)."""
    return _model(service, await service.get(workspace_id))


@router.delete("/{workspace_id}", responses=error_responses(404, 503))
async def delete_workspace(workspace_id: str, service: ServiceDep) -> WorkspaceModel:
    """Destroy the workspace: its container and volume are removed. Repeating it is fine."""
    return _model(service, await service.destroy(workspace_id))


@router.post("/{workspace_id}/stop", responses=error_responses(404, 409, 410, 503))
async def stop_workspace(workspace_id: str, service: ServiceDep) -> WorkspaceModel:
    """Stop the workspace; /workspace is kept for resume."""
    return _model(service, await service.stop(workspace_id))


@router.post("/{workspace_id}/resume", responses=error_responses(400, 404, 409, 410, 422, 503))
async def resume_workspace(workspace_id: str, service: ServiceDep) -> WorkspaceModel:
    """Resume a stopped or paused workspace; a paused one gets its processes and memory back."""
    return _model(service, await service.resume(workspace_id))


@router.post("/{workspace_id}/pause", responses=error_responses(404, 409, 410, 503))
async def pause_workspace(workspace_id: str, service: ServiceDep) -> PausedWorkspace:
    """Pause: free the workspace's CPU and memory. ``pause`` says what was kept: ``memory`` (processes, memory and
    open files come back on resume) or ``filesystem`` (the provider cannot checkpoint memory: a stop that keeps the
    whole disk). Commands in flight end; background processes live on in the memory image."""
    record, kept = await service.pause(workspace_id)
    return PausedWorkspace(**_model(service, record).model_dump(), pause=kept)


@router.post("/{workspace_id}/snapshots", status_code=201, responses=error_responses(404, 409, 410, 503, 422))
async def create_snapshot(workspace_id: str, body: SnapshotBody, snapshots: SnapshotsDep) -> SnapshotModel:
    """Snapshot a running workspace: its files, and its processes and memory where the provider can (``kind``).
    The workspace carries on; it is held only while the checkpoint and copy are taken. 422 past the storage limit."""
    return SnapshotModel.of(await snapshots.create(workspace_id, name=body.name))


@router.post("/{workspace_id}/fork", status_code=201, responses=error_responses(404, 409, 410, 503, 422))
async def fork_workspace(
    workspace_id: str, body: ForkBody, service: ServiceDep, snapshots: SnapshotsDep
) -> ForkResponse:
    """``count`` new workspaces with the source's files and running processes; the source keeps running. Each
    fork is independent (its own disk, memory, id and hostname). All or nothing: on a failure none is left."""
    records = await snapshots.fork(workspace_id, body.count)
    return ForkResponse(workspaces=[_model(service, r) for r in records])


snapshots_router = APIRouter(prefix="/api/v1/agent/snapshots", tags=["snapshots"])


@snapshots_router.get("")
async def list_snapshots(
    snapshots: SnapshotsDep,
    workspace_id: Annotated[str | None, Query(description="only snapshots of this workspace")] = None,
    name: Annotated[str | None, Query(description="only snapshots with this name")] = None,
) -> SnapshotList:
    """Snapshots, newest first."""
    return SnapshotList(
        snapshots=[SnapshotModel.of(r) for r in await snapshots.find(workspace_id=workspace_id, name=name)]
    )


@snapshots_router.get("/{snapshot_id}", responses=error_responses(404))
async def get_snapshot(snapshot_id: str, snapshots: SnapshotsDep) -> SnapshotModel:
    """One snapshot."""
    return SnapshotModel.of(await snapshots.get(snapshot_id))


@snapshots_router.delete("/{snapshot_id}", status_code=204, responses=error_responses(404, 503))
async def delete_snapshot(snapshot_id: str, snapshots: SnapshotsDep) -> Response:
    """Delete a snapshot and its files. Workspaces restored from it keep running."""
    await snapshots.delete(snapshot_id)
    return Response(status_code=204)


@router.post(
    "/{workspace_id}/exec",
    response_model=ExecResponse,
    responses={200: {"content": NDJSON_CONTENT}, **error_responses(*WORKSPACE_ERRORS, 429)},
)
async def exec_command(workspace_id: str, body: ExecBody, service: ServiceDep) -> ExecResponse | Response:
    """Run a command; a nonzero exit is a result. Past ``timeout_s`` the command is killed: ``timed_out: true``.

    ``stdin``: text the command reads, then end of file. ``stream: true`` answers ``application/x-ndjson`` while
    the command runs: ``{"stream", "data"}`` lines as produced, then ``{"exit_code", "timed_out", "duration_ms"}``
    (or ``{"error": ...}`` for a failure after the first line). Errors found before it starts (unknown workspace,
    bad input) are ordinary error answers. Closing the connection early kills the command."""
    request = ExecRequest(
        command=body.command,
        args=tuple(body.args),
        mode=ExecMode(body.mode),
        cwd=body.cwd or WORKSPACE_ROOT,
        env=body.env,
        timeout_s=body.timeout_s or DEFAULT_EXEC_TIMEOUT_S,
    )
    request.validate()
    if body.stream:
        await service.ensure_ready(workspace_id)  # a 404 or 409 is still an error answer, before the stream
        cleanup = contextlib.AsyncExitStack()
        if body.stdin is not None:
            request = await cleanup.enter_async_context(stdin_file(service.runtime, workspace_id, request, body.stdin))
        return NdjsonResponse(ndjson_events(service.exec_stream(workspace_id, request), cleanup))
    async with contextlib.AsyncExitStack() as cleanup:
        if body.stdin is not None:
            request = await cleanup.enter_async_context(stdin_file(service.runtime, workspace_id, request, body.stdin))
        try:
            result = await service.exec(workspace_id, request)
        except ExecTimeoutError as exc:
            return ExecResponse(
                exit_code=KILLED_EXIT_CODE,
                stdout=exc.stdout.decode(errors="replace"),
                stderr=exc.stderr.decode(errors="replace"),
                duration_ms=exc.duration_ms,
                timed_out=True,
                truncated=False,
            )
    return ExecResponse(
        exit_code=result.exit_code,
        stdout=result.stdout.decode(errors="replace"),
        stderr=result.stderr.decode(errors="replace"),
        duration_ms=result.duration_ms,
        timed_out=False,
        truncated=result.truncated,
    )


# --- files ----------------------------------------------------------------------------------------------------------


@router.get(
    "/{workspace_id}/files",
    response_class=OctetStreamResponse,
    responses={
        200: {"description": "the file's raw bytes", "content": RAW_BYTES},
        **error_responses(*WORKSPACE_ERRORS),
    },
)
async def read_file(workspace_id: str, path: PathQuery, service: ServiceDep) -> OctetStreamResponse:
    """The file's raw bytes, streamed."""
    return OctetStreamResponse(relay(await service.read_file(workspace_id, path)))


@router.put(
    "/{workspace_id}/files",
    responses=error_responses(*WORKSPACE_ERRORS, 422),
    openapi_extra={"requestBody": {"required": True, "content": RAW_BYTES, "description": "the file's raw bytes"}},
)
async def write_file(
    workspace_id: str,
    path: PathQuery,
    request: Request,
    service: ServiceDep,
    mode: Annotated[str | None, Query(description="permission bits in octal, e.g. 0644")] = None,
) -> WriteFileResponse:
    """Write the request body (raw bytes, any length) to the file, parents created, streaming it through."""
    absolute, written = await service.write_file(workspace_id, path, request.stream(), mode=_mode(mode))
    return WriteFileResponse(path=absolute, bytes_written=written)


TAR_BYTES = {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}


class TarStreamResponse(StreamingResponse):
    """A streamed tar archive."""

    media_type = "application/x-tar"


@router.get(
    "/{workspace_id}/files/archive",
    response_class=TarStreamResponse,
    responses={
        200: {
            "description": "a tar archive whose one top-level entry is the path's last component",
            "content": TAR_BYTES,
        },
        **error_responses(*WORKSPACE_ERRORS),
    },
)
async def read_archive(workspace_id: str, path: PathQuery, service: ServiceDep) -> TarStreamResponse:
    """A file or directory as a tar stream, made inside the workspace (``corral workspaces cp`` downloads this).

    A missing path is a 404 before the stream begins; a failure later cuts the stream short."""
    return TarStreamResponse(relay(await open_archive(service, workspace_id, path)))


@router.put(
    "/{workspace_id}/files/archive",
    responses=error_responses(*WORKSPACE_ERRORS, 422),
    openapi_extra={"requestBody": {"required": True, "content": TAR_BYTES, "description": "a tar archive"}},
)
async def write_archive(workspace_id: str, path: PathQuery, request: Request, service: ServiceDep) -> WriteFileResponse:
    """Extract a tar body (any length, streamed) into the directory ``path``, created when missing; entries belong to
    the workspace's user. ``bytes_written`` is the archive's size."""
    absolute, written = await extract_archive(service, workspace_id, path, request.stream())
    return WriteFileResponse(path=absolute, bytes_written=written)


@router.delete("/{workspace_id}/files", status_code=204, responses=error_responses(*WORKSPACE_ERRORS))
async def delete_file(workspace_id: str, path: PathQuery, service: ServiceDep, recursive: bool = False) -> Response:
    """Delete a file, or a directory (non-empty ones with ``recursive=true``)."""
    await service.delete(workspace_id, path, recursive=recursive)
    return Response(status_code=204)


@router.get("/{workspace_id}/files/stat", responses=error_responses(*WORKSPACE_ERRORS))
async def stat_file(workspace_id: str, path: PathQuery, service: ServiceDep) -> FileInfoModel:
    """Metadata of one path (a final symlink is not followed)."""
    return FileInfoModel.of(await service.stat(workspace_id, path))


@router.get("/{workspace_id}/files/list", responses=error_responses(*WORKSPACE_ERRORS))
async def list_files(workspace_id: str, service: ServiceDep, path: PathQuery = WORKSPACE_ROOT) -> DirectoryListing:
    """A directory's entries, sorted by name."""
    entries = await service.list_dir(workspace_id, path)
    return DirectoryListing(path=path, entries=[FileInfoModel.of(e) for e in entries])


@router.get("/{workspace_id}/files/glob", responses=error_responses(*WORKSPACE_ERRORS))
async def glob_files(
    workspace_id: str,
    pattern: Annotated[
        str, Query(description="a glob relative to path; ** matches any depth", json_schema_extra={"minLength": 1})
    ],
    service: ServiceDep,
    path: PathQuery = WORKSPACE_ROOT,
) -> GlobResponse:
    """Paths matching the pattern, sorted."""
    return GlobResponse(paths=await service.glob(workspace_id, pattern, path))


@router.post("/{workspace_id}/files/move", status_code=204, responses=error_responses(*WORKSPACE_ERRORS))
async def move_file(workspace_id: str, body: MoveBody, service: ServiceDep) -> Response:
    """Rename ``src`` to ``dst`` (parents of ``dst`` are created)."""
    await service.move(workspace_id, body.src, body.dst)
    return Response(status_code=204)


@router.post("/{workspace_id}/files/chmod", status_code=204, responses=error_responses(*WORKSPACE_ERRORS))
async def chmod_file(workspace_id: str, body: ChmodBody, service: ServiceDep) -> Response:
    """Set permission bits."""
    mode = _mode(body.mode) if isinstance(body.mode, str) else body.mode
    assert mode is not None  # a str was given
    await service.chmod(workspace_id, body.path, mode)
    return Response(status_code=204)


def _mode(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        mode = int(value, 8)
    except ValueError:
        raise InvalidRequestError(
            f"mode: {value!r} is not an octal permission mode such as '0644'", details={"field": "mode"}
        ) from None
    if not 0 <= mode <= 0o7777:
        raise InvalidRequestError(f"mode: {value!r} is outside 0000..7777", details={"field": "mode"})
    return mode
