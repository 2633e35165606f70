"""Agent types and sessions: a session of a workspace-enabled agent type gets its workspace before it starts.

Starting a session returns at once with status ``provisioning``; a background task then creates the workspace (from
a warm pool when one matches), checks the repository out (the task's repository and branch, or the type's fixed
one), runs the setup commands, and marks the session ``active``. A failure is retried once on the fallback
provider; if that fails too the session becomes ``active`` and ``degraded`` with the reason, and its tools say so.

Each session keeps a snapshot of its agent type's configuration taken at start, so a later change of the type
applies to later sessions only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.agents.checkout import RepoRef, checkout, split_credentials
from corral.agents.config import WorkspaceConfig, config_from_json, parse_workspace_config, validate_repo_url
from corral.errors import CorralError, ExecTimeoutError, InvalidRequestError, SandboxNotFoundError
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers.base import WORKSPACE_ROOT, ExecRequest, ResourceLimits
from corral.store import AgentTypeRecord, AuditEntry, SessionRecord
from corral.tools import Toolbox, ToolNotAllowedError, UnknownToolError, check_tool_allowed, summarize_arguments

__all__ = ["AgentService", "TaskContext"]

log = logging.getLogger(__name__)
OUTPUT_TAIL = 2000


@dataclass(frozen=True, slots=True)
class TaskContext:
    """The repository side of a task: where its code lives and which change it is about."""

    repository_url: str | None = None
    branch: str | None = None
    pull_request_number: int | None = None
    base_branch: str | None = None

    @classmethod
    def parse(cls, raw: object) -> TaskContext:
        """Validate ``task.context`` from the API."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise InvalidRequestError("task.context: must be an object")
        problems = []
        extra = sorted(set(raw) - {"repository_url", "branch", "pull_request_number", "base_branch"})
        if extra:
            problems.append(f"task.context: unknown field(s) {extra}")
        url = raw.get("repository_url")
        if url is not None and (
            not isinstance(url, str) or (p := validate_repo_url(url, field_name="task.context.repository_url"))
        ):
            problems.append(p if isinstance(url, str) and p else "task.context.repository_url: must be a string")
        for name in ("branch", "base_branch"):
            value = raw.get(name)
            if value is not None and (not isinstance(value, str) or not value.strip() or value.startswith("-")):
                problems.append(f"task.context.{name}: {value!r} is not a branch name")
        number = raw.get("pull_request_number")
        if number is not None and (isinstance(number, bool) or not isinstance(number, int) or number < 1):
            problems.append("task.context.pull_request_number: must be a positive whole number")
        if problems:
            raise InvalidRequestError("; ".join(problems), details={"problems": problems})
        return cls(url, raw.get("branch"), number, raw.get("base_branch"))

    def to_json(self) -> dict[str, Any]:
        """Stored form; the repository URL keeps its credentials (the host needs them to clone)."""
        return {
            "repository_url": self.repository_url,
            "branch": self.branch,
            "pull_request_number": self.pull_request_number,
            "base_branch": self.base_branch,
        }


class AgentService:
    """Agent types, their workspace configs, and sessions with auto-provisioned workspaces."""

    def __init__(self, workspaces: WorkspaceService) -> None:
        self.workspaces = workspaces
        self.store = workspaces.store
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    # --- agent types -------------------------------------------------------------------------------------------

    def parse_config(self, raw: object) -> WorkspaceConfig:
        """Validate a workspace config against this server's defaults."""
        return parse_workspace_config(raw, default_limits=self.workspaces.default_limits())

    async def create_type(self, name: str, workspace: object | None) -> AgentTypeRecord:
        """A new agent type; without ``workspace`` it gets ``enabled = false``."""
        if not name.strip():
            raise InvalidRequestError("name: must not be empty", details={"field": "name"})
        config = self.parse_config(workspace) if workspace is not None else config_from_json(None)
        return await self.store.agent_types.create(name, config.to_json())

    async def get_type(self, agent_type_id: str) -> AgentTypeRecord:
        """The agent type; raises a 404-mapped error when unknown."""
        record = await self.store.agent_types.get(agent_type_id)
        if record is None:
            raise AgentTypeNotFoundError(f"agent type {agent_type_id!r} does not exist", details={"id": agent_type_id})
        return record

    async def set_config(self, agent_type_id: str, raw: object) -> AgentTypeRecord:
        """Replace the type's workspace config (validated); running sessions keep their snapshot."""
        await self.get_type(agent_type_id)
        config = self.parse_config(raw)
        record = await self.store.agent_types.update_config(agent_type_id, config.to_json())
        assert record is not None  # it existed a moment ago; agent types are never deleted
        return record

    # --- sessions ----------------------------------------------------------------------------------------------

    async def start(self, agent_type_id: str, task: TaskContext) -> SessionRecord:
        """Create the session and start provisioning in the background.

        When there is nothing to check out or set up and a warm workspace matches, the session is active at once.
        """
        agent_type = await self.get_type(agent_type_id)
        config = config_from_json(agent_type.workspace_config)
        if config.enabled and _nothing_to_prepare(config, task):
            session_id = uuid.uuid4().hex
            warm = await self.workspaces.create_if_warm(self._workspace_request(session_id, config, task))
            if warm is not None:
                return await self.store.sessions.create(
                    agent_type_id,
                    id=session_id,
                    task_context=task.to_json(),
                    workspace_config=config.to_json(),
                    status="active",
                    workspace_id=warm.id,
                )
        session = await self.store.sessions.create(
            agent_type_id,
            task_context=task.to_json(),
            workspace_config=config.to_json(),
            status="provisioning" if config.enabled else "active",
        )
        if config.enabled:
            job = asyncio.create_task(self._provision(session.id, config, task), name=f"provision-{session.id}")
            self._tasks[session.id] = job
            job.add_done_callback(lambda _: self._tasks.pop(session.id, None))
        return session

    def _workspace_request(
        self, session_id: str, config: WorkspaceConfig, task: TaskContext, *, provider: str | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> CreateWorkspace:  # fmt: skip
        return CreateWorkspace(
            provider=provider or config.provider,
            container_type=config.container_type,
            limits=ResourceLimits.parse(config.resource_limits, defaults=self.workspaces.default_limits()),
            base_image=config.base_image,
            network=config.network,
            metadata=_metadata(session_id, task, _repository(config, task)),
            exclude=exclude,
        )

    async def get(self, session_id: str) -> SessionRecord:
        """The session; raises a 404-mapped error when unknown."""
        record = await self.store.sessions.get(session_id)
        if record is None:
            raise SessionNotFoundError(f"session {session_id!r} does not exist", details={"id": session_id})
        return record

    async def end(self, session_id: str) -> SessionRecord:
        """End the session and destroy its workspace (provisioning in flight is cancelled first)."""
        session = await self.get(session_id)
        self._locks.pop(session_id, None)
        job = self._tasks.pop(session_id, None)
        if job is not None:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
            session = await self.get(session_id)
        if session.workspace_id is not None:
            with contextlib.suppress(SandboxNotFoundError):
                await self.workspaces.destroy(session.workspace_id)
        if session.status == "ended":
            return session
        updated = await self.store.sessions.update(session_id, status="ended")
        assert updated is not None
        return updated

    async def wait_provisioned(self, session_id: str) -> SessionRecord:
        """Wait for a running provisioning task (tests and the CLI use this); returns the session."""
        job = self._tasks.get(session_id)
        if job is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(job)
        return await self.get(session_id)

    async def call_tool(self, session_id: str, tool: str, arguments: object) -> dict[str, object]:
        """Run one tool for the session under its agent type's policy; every call lands in the audit log."""
        started = time.monotonic()
        status = "error"
        try:
            toolbox = await self._toolbox(session_id, tool)
            async with self._locks.setdefault(session_id, asyncio.Lock()):  # one shell per session: calls queue
                result = await toolbox.call(tool, arguments)
        except (ToolNotAllowedError, UnknownToolError, NoWorkspaceError):
            status = "refused"
            raise
        else:
            status = "ok"
            return result
        finally:
            if await self.store.sessions.get(session_id) is not None:
                await self.store.audit.append(
                    session_id,
                    tool=tool[:64],
                    arguments_summary=summarize_arguments(tool, arguments),
                    status=status,
                    duration_ms=(time.monotonic() - started) * 1000,
                )

    async def _toolbox(self, session_id: str, tool: str) -> Toolbox:
        session = await self.get(session_id)
        config = config_from_json(session.workspace_config)
        if not config.enabled:
            raise NoWorkspaceError(
                f"session {session_id}'s agent type has no workspace (workspace.enabled is false), so it has no tools"
            )
        check_tool_allowed(tool, config.tools)
        if session.status == "ended":
            raise SessionStateError(f"session {session_id} has ended")
        if session.status == "provisioning":
            raise SessionStateError(f"session {session_id} is still provisioning its workspace; retry shortly")
        if session.degraded or session.workspace_id is None:
            raise SessionDegradedError(
                f"session {session_id} has no workspace: {session.degraded_reason or 'provisioning failed'}"
            )
        provider = await self.workspaces.provider_of(session.workspace_id)
        return Toolbox(provider, session.workspace_id, session_id=session_id)

    async def audit(self, session_id: str) -> list[AuditEntry]:
        """The session's tool calls, oldest first."""
        await self.get(session_id)
        return await self.store.audit.list(session_id)

    async def aclose(self) -> None:
        """Cancel provisioning in flight (its workspaces are cleaned up by the cancelled task)."""
        for job in list(self._tasks.values()):
            job.cancel()
        for job in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job

    # --- provisioning ------------------------------------------------------------------------------------------

    async def _provision(self, session_id: str, config: WorkspaceConfig, task: TaskContext) -> None:
        repo = _repository(config, task)
        failures: list[str] = []
        tried: set[str] = set()
        for attempt in (1, 2):
            provider = config.provider if attempt == 1 else "auto"
            workspace_id = None
            try:
                record = await self.workspaces.create(
                    self._workspace_request(session_id, config, task, provider=provider, exclude=frozenset(tried))
                )
                workspace_id = record.id
                tried.add(record.provider or "")
                if not _nothing_to_prepare(config, task):  # long work ahead: let the session know its workspace
                    await self.store.sessions.update(session_id, workspace_id=workspace_id)
                if repo is not None and config.checkout_on_start:
                    await checkout(await self.workspaces.provider_of(workspace_id), workspace_id, repo)
                warnings = await self._run_setup(workspace_id, config)
            except CorralError as exc:
                failures.append(f"attempt {attempt} ({provider}): {exc.message}")
                log.warning("session %s: provisioning attempt %d failed: %s", session_id, attempt, exc.message)
                if workspace_id is not None:
                    await self.workspaces.discard(workspace_id)
                    await self.store.sessions.update(session_id, workspace_id=None)
                continue
            except BaseException:
                if workspace_id is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self.workspaces.discard(workspace_id))
                raise
            if warnings:
                await self.store.sessions.add_warnings(session_id, *warnings)
                await self.store.workspaces.add_warnings(workspace_id, *warnings)
            await self.store.sessions.update(session_id, status="active", workspace_id=workspace_id)
            return
        reason = "workspace provisioning failed twice; the session runs without a workspace: " + " | ".join(failures)
        log.error("session %s: %s", session_id, reason)
        await self.store.sessions.update(session_id, status="active", degraded=True, degraded_reason=reason)

    async def _run_setup(self, workspace_id: str, config: WorkspaceConfig) -> list[str]:
        """Run the setup commands in order; the first failure or timeout stops the rest and becomes a warning."""
        for index, command in enumerate(config.setup_commands):
            request = ExecRequest(command, cwd=WORKSPACE_ROOT, timeout_s=config.setup_timeout_s)
            skipped = len(config.setup_commands) - index - 1
            rest = f"; {skipped} later command(s) skipped" if skipped else ""
            try:
                result = await self.workspaces.exec(workspace_id, request)
            except ExecTimeoutError as exc:
                tail = _tail(exc.stdout + exc.stderr)
                log.warning("setup command %r timed out after %g s and was killed", command, config.setup_timeout_s)
                return [
                    f"setup command {command!r} timed out after {config.setup_timeout_s:g} s and was killed{rest}. "
                    f"Output tail: {tail}"
                ]
            if result.exit_code != 0:
                tail = _tail(result.stdout + result.stderr)
                return [
                    f"setup command {command!r} failed with exit code {result.exit_code}{rest}. Output tail: {tail}"
                ]
        return []


class AgentTypeNotFoundError(CorralError, LookupError):
    """No agent type with that id."""

    code = "agent_type_not_found"
    http_status = 404


class SessionNotFoundError(CorralError, LookupError):
    """No session with that id."""

    code = "session_not_found"
    http_status = 404


class NoWorkspaceError(CorralError):
    """The session's agent type has no workspace, so there are no tools to call."""

    code = "no_workspace"
    http_status = 404


class SessionStateError(CorralError):
    """The session cannot take tool calls now (provisioning, ended)."""

    code = "session_state_conflict"
    http_status = 409


class SessionDegradedError(CorralError):
    """The session runs without its workspace (provisioning failed twice); the message says why."""

    code = "session_degraded"
    http_status = 409


def _nothing_to_prepare(config: WorkspaceConfig, task: TaskContext) -> bool:
    """No checkout and no setup commands: the workspace is ready the moment it exists."""
    no_checkout = _repository(config, task) is None or not config.checkout_on_start
    return no_checkout and not config.setup_commands


def _repository(config: WorkspaceConfig, task: TaskContext) -> RepoRef | None:
    source = config.repo_source
    if source.type == "fixed" and source.url:
        return RepoRef(source.url, source.branch)  # the task's branch belongs to the task's repository
    if source.type == "task_context" and task.repository_url:
        return RepoRef(task.repository_url, task.branch or source.branch)
    return None


def _metadata(session_id: str, task: TaskContext, repo: RepoRef | None) -> dict[str, Any]:
    task_meta = {
        "repository_url": split_credentials(repo.url)[0] if repo is not None else None,
        "branch": repo.branch if repo is not None else None,
        "pull_request_number": task.pull_request_number,
        "base_branch": task.base_branch,
    }
    return {"session_id": session_id, "task": task_meta}


def _tail(output: bytes) -> str:
    text = output.decode(errors="replace").strip()
    return text[-OUTPUT_TAIL:] if text else "(no output)"
