"""``/api/v1/agent-types`` and ``/api/v1/agent/sessions``: declared workspaces, sessions and their tools."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from corral.agents.config import config_from_json
from corral.agents.sessions import AgentService, TaskContext
from corral.api.errors import error_responses
from corral.api.schemas import AgentTypeList, AgentTypeModel, AuditResponse, SessionModel
from corral.credentials import redact_text, redact_url
from corral.store import AgentTypeRecord, SessionRecord

__all__ = ["router"]

router = APIRouter(tags=["agents"])


async def _agents(request: Request) -> AgentService:
    service: AgentService = request.app.state.agents
    return service


AgentsDep = Annotated[AgentService, Depends(_agents)]


class CreateAgentTypeBody(BaseModel):
    """``POST /api/v1/agent-types``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    workspace: dict[str, Any] | None = None


class TaskBody(BaseModel):
    """The task given to a session; only its repository context matters to the workspace."""

    model_config = ConfigDict(extra="allow")
    context: dict[str, Any] | None = None


class StartSessionBody(BaseModel):
    """``POST /api/v1/agent/sessions``."""

    model_config = ConfigDict(extra="forbid")
    agent_type_id: str
    task: TaskBody | None = None


def agent_type_json(record: AgentTypeRecord) -> dict[str, Any]:
    """``{id, name, workspace}``."""
    return {"id": record.id, "name": record.name, "workspace": config_from_json(record.workspace_config).to_json()}


def session_json(record: SessionRecord, *, isolation: str | None = None) -> dict[str, Any]:
    """The session as the API shows it: credentials masked, the sealed one left out.

    The store already keeps them masked; masking again here also covers rows written by older versions.
    """
    config = config_from_json(record.workspace_config)
    context = {k: v for k, v in record.task_context.items() if k in TaskContext.FIELDS}
    if isinstance(context.get("repository_url"), str):
        context["repository_url"] = redact_url(context["repository_url"])
    return {
        "id": record.id,
        "agent_type_id": record.agent_type_id,
        "status": record.status,
        "workspace_id": record.workspace_id,
        "isolation": isolation,  # the workspace's (WorkspaceService.workspace_isolation), None without one
        "degraded": record.degraded,
        "degraded_reason": redact_text(record.degraded_reason) if record.degraded_reason else None,
        "warnings": [redact_text(w) for w in record.warnings],
        "tools": list(config.tools) if config.enabled else [],
        "task": {"context": context},
        "created_at": record.created_at.isoformat(),
        "ended_at": record.ended_at.isoformat() if record.ended_at else None,
    }


async def _session(agents: AgentService, record: SessionRecord) -> dict[str, Any]:
    """``session_json`` with the isolation of the session's workspace and its idle timeout."""
    answer = session_json(record, isolation=await agents.workspaces.workspace_isolation(record.workspace_id))
    return {**answer, **agents.workspaces.session_lifetime(record).to_json()}


# Routes declare the error statuses their work can end in; 400, 401 and 413 are added by corral.api.openapi.
@router.post("/api/v1/agent-types", status_code=201, response_model=AgentTypeModel)
async def create_agent_type(body: CreateAgentTypeBody, agents: AgentsDep) -> dict[str, Any]:
    """Declare an agent type; without ``workspace`` it has ``enabled: false``."""
    return agent_type_json(await agents.create_type(body.name, body.workspace))


@router.get("/api/v1/agent-types", response_model=AgentTypeList)
async def list_agent_types(agents: AgentsDep) -> dict[str, Any]:
    """Every agent type."""
    return {"agent_types": [agent_type_json(r) for r in await agents.store.agent_types.list()]}


@router.get("/api/v1/agent-types/{agent_type_id}", response_model=AgentTypeModel, responses=error_responses(404))
async def get_agent_type(agent_type_id: str, agents: AgentsDep) -> dict[str, Any]:
    """One agent type."""
    return agent_type_json(await agents.get_type(agent_type_id))


@router.delete("/api/v1/agent-types/{agent_type_id}", status_code=204, responses=error_responses(404, 409))
async def delete_agent_type(agent_type_id: str, agents: AgentsDep) -> Response:
    """Delete an agent type with its ended sessions and their audit logs. 409 ``agent_type_in_use`` while sessions of
    it are provisioning or active (``details.sessions`` lists them): end them first."""
    await agents.delete_type(agent_type_id)
    return Response(status_code=204)


@router.get("/api/v1/agent-types/{agent_type_id}/workspace-config", responses=error_responses(404))
async def get_workspace_config(agent_type_id: str, agents: AgentsDep) -> dict[str, Any]:
    """The type's workspace configuration, every field included."""
    return config_from_json((await agents.get_type(agent_type_id)).workspace_config).to_json()


@router.put("/api/v1/agent-types/{agent_type_id}/workspace-config", responses=error_responses(404))
async def put_workspace_config(
    agent_type_id: str, agents: AgentsDep, body: Annotated[dict[str, Any], Body()]
) -> dict[str, Any]:
    """Validate and replace the configuration; sessions started afterwards use it, running ones keep theirs."""
    return config_from_json((await agents.set_config(agent_type_id, body)).workspace_config).to_json()


@router.post(
    "/api/v1/agent/sessions", status_code=201, response_model=SessionModel, responses=error_responses(403, 404, 503)
)
async def start_session(body: StartSessionBody, agents: AgentsDep) -> dict[str, Any]:
    """Start a session; it is ``provisioning`` until its workspace is ready, then ``active``."""
    task = TaskContext.parse(body.task.context if body.task is not None else None)
    return await _session(agents, await agents.start(body.agent_type_id, task))


class SessionList(BaseModel):
    """``GET /api/v1/agent/sessions``."""

    sessions: list[SessionModel]


@router.get("/api/v1/agent/sessions", response_model=SessionList)
async def list_sessions(
    agents: AgentsDep,
    status: Annotated[
        str | None, Query(description="only sessions in this status: provisioning, active or ended")
    ] = None,
) -> dict[str, Any]:
    """Sessions, newest first, each as ``GET /api/v1/agent/sessions/{id}`` shows it."""
    return {"sessions": [await _session(agents, r) for r in await agents.list_sessions(status)]}


@router.get("/api/v1/agent/sessions/{session_id}", response_model=SessionModel, responses=error_responses(404))
async def get_session(session_id: str, agents: AgentsDep) -> dict[str, Any]:
    """One session with its status, workspace (and its isolation) and warnings."""
    return await _session(agents, await agents.get(session_id))


@router.delete("/api/v1/agent/sessions/{session_id}", response_model=SessionModel, responses=error_responses(404, 503))
async def end_session(session_id: str, agents: AgentsDep) -> dict[str, Any]:
    """End the session and destroy its workspace."""
    return await _session(agents, await agents.end(session_id))


@router.post(
    "/api/v1/agent/sessions/{session_id}/tools/{tool}",
    responses=error_responses(403, 404, 409, 410, 422, 429, 502, 503, 504),
)
async def call_tool(
    session_id: str, tool: str, agents: AgentsDep, body: Annotated[dict[str, Any] | None, Body()] = None
) -> dict[str, Any]:
    """Run one of the agent's tools (bash, read, write, edit, grep, glob, git) in the session's workspace."""
    return dict(await agents.call_tool(session_id, tool, body or {}))


@router.get("/api/v1/agent/sessions/{session_id}/audit", response_model=AuditResponse, responses=error_responses(404))
async def session_audit(session_id: str, agents: AgentsDep) -> dict[str, Any]:
    """Every tool call of the session: when, which tool, a summary of the arguments, outcome and duration."""
    entries = await agents.audit(session_id)
    return {
        "entries": [
            {
                "at": e.at.isoformat(),
                "tool": e.tool,
                "arguments_summary": e.arguments_summary,
                "status": e.status,
                "duration_ms": round(e.duration_ms, 3),
            }
            for e in entries
        ]
    }
