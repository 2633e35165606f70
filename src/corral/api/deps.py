"""FastAPI dependencies, as ``Annotated`` aliases: the app's state is reached through these and nothing global."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from corral.orchestrator.service import WorkspaceService
from corral.orchestrator.snapshots import SnapshotService

__all__ = ["ServiceDep", "SnapshotsDep", "require_token"]


# The bearer scheme of the OpenAPI document (Swagger's "Authorize" button). auto_error is off: a missing or foreign
# scheme gets Corral's own 401 below rather than FastAPI's 403.
_bearer = HTTPBearer(
    scheme_name="bearerAuth",
    bearerFormat="CORRAL_API_TOKEN",
    description="`Authorization: Bearer <CORRAL_API_TOKEN>`; every route but /healthz needs it.",
    auto_error=False,
)


# Dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a worker thread, which cost
# about a millisecond per request on the exec hot path.
async def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Check ``Authorization: Bearer <CORRAL_API_TOKEN>`` in constant time."""
    expected: str = request.app.state.api_token
    token = credentials.credentials.strip() if credentials is not None else ""
    if credentials is None or not hmac.compare_digest(token.encode(), expected.encode()):
        raise HTTPException(
            401,
            "missing or wrong bearer token; send 'Authorization: Bearer <CORRAL_API_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def _service(request: Request) -> WorkspaceService:
    service: WorkspaceService = request.app.state.service
    return service


ServiceDep = Annotated[WorkspaceService, Depends(_service)]


async def _snapshots(request: Request) -> SnapshotService:
    snapshots: SnapshotService = request.app.state.snapshots
    return snapshots


SnapshotsDep = Annotated[SnapshotService, Depends(_snapshots)]
