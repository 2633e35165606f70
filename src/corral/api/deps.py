"""FastAPI dependencies, as ``Annotated`` aliases: the app's state is reached through these and nothing global."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from starlette.exceptions import HTTPException

from corral.orchestrator.service import WorkspaceService

__all__ = ["ServiceDep", "require_token"]


# Dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a worker thread, which cost
# about a millisecond per request on the exec hot path.
async def require_token(request: Request) -> None:
    """Check ``Authorization: Bearer <CORRAL_API_TOKEN>`` in constant time."""
    expected: str = request.app.state.api_token
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise HTTPException(401, "missing or wrong bearer token; send 'Authorization: Bearer <CORRAL_API_TOKEN>'")


async def _service(request: Request) -> WorkspaceService:
    service: WorkspaceService = request.app.state.service
    return service


ServiceDep = Annotated[WorkspaceService, Depends(_service)]
