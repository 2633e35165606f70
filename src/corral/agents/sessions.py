"""Agent types and sessions: a session of a workspace-enabled agent type gets its workspace before it starts.

Starting a session returns at once with status ``provisioning``; a background task then creates the workspace (from
a warm pool when one matches), records its id on the session, checks the repository out (the task's repository and
branch, or the type's fixed one), runs the setup commands, and marks the session ``active``. A provider failure
(:class:`~corral.errors.ProviderUnavailableError`, a workspace lost mid-way...) is retried once on ``auto``; a
failure that another provider would not fix (:data:`NOT_RETRIED`: a failed checkout, an invalid request, an unknown
provider name, an unreadable credential) is not. Either way the session then becomes ``active`` and ``degraded``
with the reason, and its tools say so.

Each session keeps a snapshot of its agent type's configuration taken at start, so a later change of the type
applies to later sessions only.

Credentials (:mod:`corral.credentials`): the task's repository URL is stored masked; while the session provisions,
the full URL is also stored sealed (AES-GCM) so that provisioning can resume after a restart, and dropped once
provisioning ends. A fixed ``repo_source`` URL is write-only: stored masked beside its sealed form; a config sent
back with the masked URL unchanged keeps the stored credential.

The hot path: a session's first tool call reads its row and keeps what calls need (its workspace, the tools its
snapshot enables), and starting a session keeps its type's config; both are dropped whenever this service changes
them (ending a session, replacing or deleting a type), so this service must be the only writer of its database's
sessions and agent types, as :class:`~corral.orchestrator.service.WorkspaceService` is of its workspaces. The tool
policy and the workspace's state are still checked on every call. Audit entries are queued and written behind the
answers by one writer, in batches; reading the audit and closing the service wait for the queue.

Restarts: a server that stops (SIGTERM) or dies (SIGKILL) while sessions provision leaves them ``provisioning``.
At start-up :meth:`AgentService.resume_interrupted` destroys whatever workspace each one had (found by the id on the
session and by the ``session_id`` in workspace metadata) and provisions it again from its snapshot and task. A
session whose sealed credential cannot be opened (the secret key changed) is degraded with that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Collection, Coroutine, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, ClassVar

from corral.agents.checkout import RepoRef, checkout, resolve_commit
from corral.agents.config import (
    RepoSource,
    WorkspaceConfig,
    config_from_json,
    parse_workspace_config,
    validate_repo_url,
)
from corral.credentials import (
    MASK,
    SecretBox,
    clean_url,
    has_credentials,
    redact_text,
    redact_url,
)
from corral.errors import (
    AgentTypeInUseError,
    AgentTypeNotFoundError,
    CheckoutError,
    CorralError,
    CredentialUnavailableError,
    ExecTimeoutError,
    InvalidRequestError,
    NoWorkspaceError,
    ProviderNotFoundError,
    SessionDegradedError,
    SessionNotFoundError,
    SessionStateError,
    ToolNotAllowedError,
    UnknownToolError,
    WorkspaceNotFoundError,
)
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.orchestrator.snapshots import SETUP_OWNER, SnapshotService
from corral.providers.base import WORKSPACE_ROOT, ExecRequest, ResourceLimits
from corral.store import AgentTypeRecord, AuditEntry, SessionRecord, ToolCall
from corral.tools import Toolbox, check_tool_allowed, summarize_arguments

__all__ = ["NOT_RETRIED", "AgentService", "TaskContext"]

log = logging.getLogger(__name__)
OUTPUT_TAIL = 2000
TASK_URL_PURPOSE = "task repository URL"
SOURCE_URL_PURPOSE = "repo_source URL"
_SEALED_TASK_KEY = "sealed_repository_url"
SESSION_STATUSES = ("provisioning", "active", "ended")
LIVE_SESSION_STATUSES = ("provisioning", "active")
"""Sessions in these statuses keep their agent type from being deleted."""

NOT_RETRIED: tuple[type[CorralError], ...] = (
    CheckoutError,
    InvalidRequestError,
    ProviderNotFoundError,
    CredentialUnavailableError,
)
"""Provisioning failures that are not the provider's fault: another provider would fail the same way."""


@dataclass(frozen=True, slots=True)
class TaskContext:
    """The repository side of a task: where its code lives and which change it is about."""

    FIELDS: ClassVar[frozenset[str]] = frozenset({"repository_url", "branch", "pull_request_number", "base_branch"})
    """The fields of ``task.context``; the stored form may add a sealed URL, which no answer shows."""

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
        extra = sorted(set(raw) - cls.FIELDS)
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
        """The answer's and the store's form: the repository URL with its credentials masked as ``***``."""
        return {
            "repository_url": redact_url(self.repository_url) if self.repository_url else self.repository_url,
            "branch": self.branch,
            "pull_request_number": self.pull_request_number,
            "base_branch": self.base_branch,
        }

    def sealed_json(self, box: SecretBox) -> dict[str, Any]:
        """:meth:`to_json` plus, when the URL has credentials, the full URL sealed: what resuming needs."""
        stored = self.to_json()
        if self.repository_url and has_credentials(self.repository_url):
            stored[_SEALED_TASK_KEY] = box.seal(self.repository_url, purpose=TASK_URL_PURPOSE)
        return stored

    @classmethod
    def from_stored(cls, raw: Mapping[str, Any], box: SecretBox) -> TaskContext:
        """Rebuild a stored task, its sealed URL opened.

        Raises:
            CredentialUnavailableError: the sealed URL cannot be opened with this server's key.
        """
        sealed = raw.get(_SEALED_TASK_KEY)
        url = box.open(sealed, purpose=TASK_URL_PURPOSE) if isinstance(sealed, str) else raw.get("repository_url")
        return cls(url, raw.get("branch"), raw.get("pull_request_number"), raw.get("base_branch"))


@dataclass(frozen=True, slots=True)
class _ToolTarget:
    """What a tool call needs of an active session: its workspace, the tools its snapshot enables, its toolbox."""

    workspace_id: str
    tools: frozenset[str]
    toolbox: Toolbox


class AgentService:
    """Agent types, their workspace configs, and sessions with auto-provisioned workspaces."""

    def __init__(
        self, workspaces: WorkspaceService, box: SecretBox | None = None, *, snapshots: SnapshotService | None = None
    ) -> None:
        """``box`` seals stored credentials; without one, a key that lives as long as the process is used.
        ``snapshots`` serves agent types with ``snapshot_after_setup``; without it they set up every session."""
        self.workspaces = workspaces
        self.snapshots = snapshots
        self._setup_commits: dict[str, str | None] = {}  # setup key -> the commit it names (see _setup_key)
        self.store = workspaces.store
        self.box = box if box is not None else SecretBox.ephemeral()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # The hot path of tool calls reads no session row: what a call needs of an active session is kept here
        # and dropped whenever this service changes the session (see _update_session).
        self._targets: dict[str, _ToolTarget] = {}
        self._changes = 0  # bumped by every session change; a read that overlapped one is not kept
        self._type_configs: dict[str, WorkspaceConfig] = {}  # agent type id -> its config, for starting sessions
        self._type_changes = 0
        self._audit_queue: list[ToolCall] = []  # answered calls whose audit entries are not written yet
        self._audit_writer: asyncio.Task[None] | None = None

    # --- agent types -------------------------------------------------------------------------------------------

    def parse_config(self, raw: object) -> WorkspaceConfig:
        """Validate a workspace config against this server's defaults."""
        return parse_workspace_config(raw, default_limits=self.workspaces.default_limits())

    async def create_type(self, name: str, workspace: object | None) -> AgentTypeRecord:
        """A new agent type; without ``workspace`` it gets ``enabled = false``."""
        if not name.strip():
            raise InvalidRequestError("name: must not be empty", details={"field": "name"})
        config = self.parse_config(workspace) if workspace is not None else config_from_json(None)
        config = self._seal_source(config, previous=None)
        return await self.store.agent_types.create(name, config.to_json(include_sealed=True))

    async def get_type(self, agent_type_id: str) -> AgentTypeRecord:
        """The agent type; raises a 404-mapped error when unknown."""
        record = await self.store.agent_types.get(agent_type_id)
        if record is None:
            raise AgentTypeNotFoundError(f"agent type {agent_type_id!r} does not exist", details={"id": agent_type_id})
        return record

    async def _type_config(self, agent_type_id: str) -> WorkspaceConfig:
        """The type's workspace config as sessions start with it: read once, then kept until this service changes
        or deletes the type (a read that overlapped a change is not kept)."""
        config = self._type_configs.get(agent_type_id)
        if config is None:
            changes = self._type_changes
            config = config_from_json((await self.get_type(agent_type_id)).workspace_config)
            if changes == self._type_changes:
                self._type_configs[agent_type_id] = config
        return config

    def _type_changed(self, agent_type_id: str) -> None:
        self._type_configs.pop(agent_type_id, None)
        self._type_changes += 1

    async def set_config(self, agent_type_id: str, raw: object) -> AgentTypeRecord:
        """Replace the type's workspace config (validated); running sessions keep their snapshot.

        A fixed ``repo_source.url`` sent back exactly as answered (credential masked as ``***``) keeps the stored
        credential; a URL with a credential replaces it.
        """
        current = config_from_json((await self.get_type(agent_type_id)).workspace_config)
        config = self._seal_source(self.parse_config(raw), previous=current.repo_source)
        self._type_changed(agent_type_id)
        try:
            record = await self.store.agent_types.update_config(agent_type_id, config.to_json(include_sealed=True))
        finally:
            self._type_changed(agent_type_id)
        if record is None:  # deleted meanwhile
            raise AgentTypeNotFoundError(f"agent type {agent_type_id!r} does not exist", details={"id": agent_type_id})
        return record

    async def delete_type(self, agent_type_id: str) -> None:
        """Delete an agent type, with its ended sessions and their audit logs (sessions reference their type).

        Raises:
            AgentTypeNotFoundError: No agent type has that id.
            AgentTypeInUseError: Sessions of the type are provisioning or active; the message names them.
        """
        self._type_changed(agent_type_id)
        try:
            live = await self.store.agent_types.delete(agent_type_id, live=LIVE_SESSION_STATUSES)
        finally:
            self._type_changed(agent_type_id)
        if live is None:
            raise AgentTypeNotFoundError(f"agent type {agent_type_id!r} does not exist", details={"id": agent_type_id})
        if live:
            shown = ", ".join(live[:10]) + (f" and {len(live) - 10} more" if len(live) > 10 else "")
            raise AgentTypeInUseError(
                f"agent type {agent_type_id!r} has {len(live)} live session(s) ({shown}); end them first "
                "(DELETE /api/v1/agent/sessions/{id}, or corral sessions end ID)",
                details={"id": agent_type_id, "sessions": live},
            )

    async def list_sessions(self, status: str | None = None) -> list[SessionRecord]:
        """Sessions, newest first; ``status`` keeps only those in it.

        Raises:
            InvalidRequestError: ``status`` is not a session status.
        """
        if status is not None and status not in SESSION_STATUSES:
            raise InvalidRequestError(
                f"status: {status!r} is not a session status; use one of {', '.join(SESSION_STATUSES)}",
                details={"field": "status"},
            )
        records = await self.store.sessions.list(status=status)  # type: ignore[arg-type]  # checked above
        return records[::-1]

    def _seal_source(self, config: WorkspaceConfig, *, previous: RepoSource | None) -> WorkspaceConfig:
        """The config with its repository URL's credential sealed, or the stored one kept for a masked URL."""
        source = config.repo_source
        if source.url is None:
            return config
        if MASK in source.url:
            # Only the exact URL answered before may keep its credential: a masked URL pointed at another host
            # must never make Corral send the stored credential there.
            if previous is not None and previous.url is not None and redact_url(previous.url) == source.url:
                sealed = previous.sealed_url
                if sealed is None and has_credentials(previous.url):  # stored before credentials were sealed
                    sealed = self.box.seal(previous.url, purpose=SOURCE_URL_PURPOSE)
                return replace(config, repo_source=replace(source, url=previous.url, sealed_url=sealed))
            shown = redact_url(previous.url) if previous is not None and previous.url else None
            raise InvalidRequestError(
                f"repo_source.url: {source.url!r} masks its credential with {MASK!r} but is not this agent type's "
                f"stored URL ({shown!r}); send the stored URL exactly as shown to keep its credential, or the URL "
                "with the credential to replace it",
                details={"field": "repo_source.url"},
            )
        if has_credentials(source.url):
            sealed = self.box.seal(source.url, purpose=SOURCE_URL_PURPOSE)
            return replace(config, repo_source=replace(source, url=redact_url(source.url), sealed_url=sealed))
        return config

    # --- sessions ----------------------------------------------------------------------------------------------

    async def start(self, agent_type_id: str, task: TaskContext) -> SessionRecord:
        """Create the session and start provisioning in the background.

        When there is nothing to check out or set up and a warm workspace matches, the session is active at once.
        """
        config = await self._type_config(agent_type_id)
        session_id = uuid.uuid4().hex  # the same whether the warm start hits or not: the pools count it once
        if config.enabled and _nothing_to_prepare(config, task):
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
            id=session_id,
            # Only a session that provisions keeps its credentials (sealed), for as long as it provisions.
            task_context=task.sealed_json(self.box) if config.enabled else task.to_json(),
            workspace_config=config.to_json(include_sealed=config.enabled),
            status="provisioning" if config.enabled else "active",
        )
        if config.enabled:
            self._spawn(session.id, self._provision(session.id, config, task))
        return session

    def _spawn(self, session_id: str, work: Coroutine[Any, Any, None]) -> None:
        job = asyncio.create_task(work, name=f"provision-{session_id}")
        self._tasks[session_id] = job
        job.add_done_callback(lambda _: self._tasks.pop(session_id, None))

    async def protect_stored_credentials(self) -> int:
        """Seal or mask the credentials older versions stored in clear; returns how many rows changed.

        Call once at start-up, before :meth:`resume_interrupted`. Agent types get their fixed URL sealed; sessions
        still provisioning get their task URL and snapshot sealed, others masked; reasons, warnings and workspace
        metadata are masked. (Audit summaries written by older versions are left as they are.)
        """
        changed = 0
        for agent_type in await self.store.agent_types.list():
            try:
                config = config_from_json(agent_type.workspace_config)
            except CorralError as exc:  # stored by a version that validated differently: leave it, say so
                log.warning("agent type %s: stored config is not valid now: %s", agent_type.id, exc.message)
                continue
            if _in_clear(config.repo_source.url) and config.repo_source.sealed_url is None:
                sealed = self._seal_source(config, previous=None)
                self._type_changed(agent_type.id)
                await self.store.agent_types.update_config(agent_type.id, sealed.to_json(include_sealed=True))
                self._type_changed(agent_type.id)
                changed += 1
        for session in await self.store.sessions.list():
            try:
                changed += await self._protect_session(session)
            except CorralError as exc:
                log.warning("session %s: stored credentials not protected: %s", session.id, exc.message)
        for workspace in await self.store.workspaces.list(include_destroyed=True):
            task = workspace.metadata.get("task")
            url = task.get("repository_url") if isinstance(task, Mapping) else None
            if isinstance(task, Mapping) and isinstance(url, str) and clean_url(url) != url:
                metadata = {**workspace.metadata, "task": {**task, "repository_url": clean_url(url)}}
                await self.workspaces.set_metadata(workspace.id, metadata)
                changed += 1
        if changed:
            log.warning("masked or sealed credentials stored in clear by an older version in %d row(s)", changed)
            await self.store.checkpoint()
        return changed

    async def _protect_session(self, session: SessionRecord) -> int:
        provisioning = session.status == "provisioning"
        updates: dict[str, Any] = {}
        url = session.task_context.get("repository_url")
        if isinstance(url, str) and _in_clear(url):
            task = TaskContext.from_stored(session.task_context, self.box)
            updates["task_context"] = task.sealed_json(self.box) if provisioning else task.to_json()
        config = config_from_json(session.workspace_config)
        if _in_clear(config.repo_source.url) and config.repo_source.sealed_url is None:
            snapshot = self._seal_source(config, previous=None) if provisioning else config
            updates["workspace_config"] = snapshot.to_json(include_sealed=provisioning)
        if session.degraded_reason and redact_text(session.degraded_reason) != session.degraded_reason:
            updates["degraded_reason"] = session.degraded_reason  # the store masks it on the way in
        if any(redact_text(w) != w for w in session.warnings):
            updates["warnings"] = session.warnings
        if updates:
            await self._update_session(session.id, **updates)
        return 1 if updates else 0

    async def resume_interrupted(self) -> list[str]:
        """Provision again every session a previous server left ``provisioning``; returns their ids.

        Call once at start-up, after reconciliation. Each session's old workspaces are destroyed and provisioning
        restarts in the background from the session's configuration snapshot and task.
        """
        sessions = await self.store.sessions.list(status="provisioning")
        if not sessions:
            return []
        # A workspace made just before the crash may not have reached the session record yet; its metadata knows.
        owned: dict[str, set[str]] = {}
        for workspace in await self.store.workspaces.list():
            owner = workspace.metadata.get("session_id")
            if isinstance(owner, str):
                owned.setdefault(owner, set()).add(workspace.id)
        for session in sessions:
            stale = owned.get(session.id, set()) | ({session.workspace_id} if session.workspace_id else set())
            log.warning("session %s was still provisioning when the server stopped; provisioning it again", session.id)
            self._spawn(session.id, self._resume(session, sorted(stale)))
        return [s.id for s in sessions]

    async def _resume(self, session: SessionRecord, stale: Collection[str]) -> None:
        for workspace_id in stale:
            await self._reclaim(workspace_id)
        await self._update_session(session.id, workspace_id=None)
        try:
            config = config_from_json(session.workspace_config)
            task = TaskContext.from_stored(session.task_context, self.box)
        except CorralError as exc:  # an unreadable credential (another key), or a snapshot no longer valid
            await self._fail(session.id, [f"resuming after a restart: {exc.message}"], retried=False)
            return
        if not config.enabled:  # cannot happen for a session that provisions; finish it rather than loop
            await self._finish(session.id, status="active")
            return
        await self._provision(session.id, config, task)

    async def _reclaim(self, workspace_id: str) -> None:
        """Destroy a workspace left by an interrupted provisioning, whatever state it is in."""
        try:
            record = await self.workspaces.get(workspace_id)
            if record.status != "destroyed":
                log.info("reclaiming workspace %s of an interrupted provisioning", workspace_id)
                await self.workspaces.discard(workspace_id)
        except WorkspaceNotFoundError:
            pass
        except CorralError as exc:  # provisioning goes on; the reaper or the next reconciliation retries this one
            log.warning("could not reclaim workspace %s: %s", workspace_id, exc.message)

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
            requester=session_id,
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
        self._session_changed(session_id)  # calls from now on read the session again
        self._locks.pop(session_id, None)
        job = self._tasks.pop(session_id, None)
        if job is not None:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
            session = await self.get(session_id)
        if session.workspace_id is not None:
            with contextlib.suppress(WorkspaceNotFoundError):
                await self.workspaces.destroy(session.workspace_id)
        if session.status == "ended":
            return session
        updated = await self._finish(session_id, status="ended")  # ended mid-provisioning: sealed values go too
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
        """Run one tool for the session under its agent type's policy; every call lands in the audit log.

        The entry is written behind the answer (:meth:`audit` and :meth:`aclose` wait for it), so the call does
        not wait for a database commit.
        """
        started = time.monotonic()
        status = "error"
        try:
            target = await self._tool_target(session_id, tool)
            async with self._locks.setdefault(session_id, asyncio.Lock()):  # one shell per session: calls queue
                result = await target.toolbox.call(tool, arguments)
        except (ToolNotAllowedError, UnknownToolError, NoWorkspaceError):
            status = "refused"
            raise
        else:
            status = "ok"
            return result
        finally:
            self._write_audit(session_id, tool[:64], summarize_arguments(tool, arguments), status, started)

    def _write_audit(self, session_id: str, tool: str, summary: str, status: str, started: float) -> None:
        """Queue the audit entry of a call that ends now; one writer flushes the queue (nothing is written for an
        unknown session)."""
        duration_ms = (time.monotonic() - started) * 1000
        self._audit_queue.append(ToolCall(session_id, datetime.now(UTC), tool, summary, status, duration_ms))
        if self._audit_writer is None or self._audit_writer.done():
            self._audit_writer = asyncio.create_task(self._flush_audit(), name="audit-writer")

    async def _flush_audit(self) -> None:
        """Write what the queue holds, batch after batch, until it is empty: one writer, so calls never wait for
        each other's commits (SQLite has one write lock) and a burst of calls costs one transaction per batch."""
        while self._audit_queue:
            batch, self._audit_queue = self._audit_queue, []
            try:
                await self.store.audit.record(batch)
            except Exception:  # the calls were answered already; say loudly that their entries are lost
                log.exception("%d audit entr(y/ies) could not be written", len(batch))

    async def _audit_written(self) -> None:
        """Wait until every audit entry queued so far is written."""
        while self._audit_writer is not None and not self._audit_writer.done():
            await asyncio.shield(self._audit_writer)

    async def _tool_target(self, session_id: str, tool: str) -> _ToolTarget:
        """The session's toolbox, after the checks every call passes: a workspace, the tool allowed, the session
        active and not degraded, its workspace ready. The session row is read once, then kept (see
        :meth:`_update_session`); the policy and the workspace's state are checked on every call."""
        target = self._targets.get(session_id)
        if target is None:
            changes = self._changes
            target = self._check_session(await self.get(session_id), tool)
            if changes == self._changes:  # no change of any session while it was read: the answer is current
                self._targets[session_id] = target
        check_tool_allowed(tool, target.tools)
        await self.workspaces.ensure_ready(target.workspace_id)
        return target

    def _check_session(self, session: SessionRecord, tool: str) -> _ToolTarget:
        session_id = session.id
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
        toolbox = Toolbox(self.workspaces.runtime, session.workspace_id, session_id=session_id)
        return _ToolTarget(session.workspace_id, frozenset(config.tools), toolbox)

    async def _update_session(self, session_id: str, **fields: Any) -> SessionRecord | None:
        """``store.sessions.update``, and what tool calls keep of the session dropped before and after."""
        self._session_changed(session_id)
        try:
            return await self.store.sessions.update(session_id, **fields)
        finally:
            self._session_changed(session_id)

    def _session_changed(self, session_id: str) -> None:
        self._targets.pop(session_id, None)
        self._changes += 1

    async def audit(self, session_id: str) -> list[AuditEntry]:
        """The session's tool calls, oldest first, up to the call answered last."""
        await self.get(session_id)
        await self._audit_written()
        return await self.store.audit.list(session_id)

    async def aclose(self) -> None:
        """Cancel provisioning in flight (its workspaces are cleaned up by the cancelled task).

        The sessions stay ``provisioning``, their sealed credentials kept, so the next start resumes them.
        """
        for job in list(self._tasks.values()):
            job.cancel()
        for job in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job
        await self._audit_written()  # every call answered has its entry before the store closes

    # --- provisioning ------------------------------------------------------------------------------------------

    async def _provision(self, session_id: str, config: WorkspaceConfig, task: TaskContext) -> None:
        try:
            repo = self._clone_source(config, task)
        except CredentialUnavailableError as exc:
            await self._fail(session_id, [exc.message], retried=False)
            return
        setup_key = await self._setup_key(session_id, config, repo)
        if not await self._from_setup_snapshot(session_id, setup_key, task, repo):
            await self._provision_fresh(session_id, config, task, repo, setup_key)

    async def _provision_fresh(
        self, session_id: str, config: WorkspaceConfig, task: TaskContext, repo: RepoRef | None, setup_key: str | None
    ) -> None:
        """Create a workspace, check out and set up, with one retry on another provider."""
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
                # Recorded at once, so that a server killed from here on finds (and reclaims) it when it restarts.
                await self._update_session(session_id, workspace_id=workspace_id)
                setup_key = await self._check_out(workspace_id, config, repo, setup_key)
                warnings = [redact_text(w) for w in await self._run_setup(workspace_id, config)]
            except Exception as exc:
                message = redact_text(exc.message if isinstance(exc, CorralError) else f"{type(exc).__name__}: {exc}")
                failures.append(f"attempt {attempt} ({provider}): {message}")
                if isinstance(exc, CorralError):
                    log.warning("session %s: provisioning attempt %d failed: %s", session_id, attempt, message)
                else:  # a bug: no retry, but the session must not stay provisioning
                    log.exception("session %s: provisioning attempt %d failed unexpectedly", session_id, attempt)
                if workspace_id is not None:
                    try:
                        await self.workspaces.discard(workspace_id)
                        await self._update_session(session_id, workspace_id=None)
                    except CorralError as cleanup:  # still end provisioning; the reaper or a restart cleans up
                        log.warning("session %s: could not discard %s: %s", session_id, workspace_id, cleanup)
                if isinstance(exc, NOT_RETRIED) or not isinstance(exc, CorralError):
                    break
                continue
            except BaseException:  # cancelled: the session ended, or the server is stopping (it resumes at start)
                if workspace_id is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self.workspaces.discard(workspace_id))
                raise
            if setup_key is not None and not warnings:  # a failed setup is not worth repeating
                warnings = await self._snapshot_setup(session_id, workspace_id, setup_key, task, repo)
            if warnings:
                await self.store.sessions.add_warnings(session_id, *warnings)
                await self.workspaces.add_warnings(workspace_id, *warnings)
            await self._finish(session_id, status="active", workspace_id=workspace_id)
            return
        await self._fail(session_id, failures, retried=len(failures) > 1)

    async def _check_out(
        self, workspace_id: str, config: WorkspaceConfig, repo: RepoRef | None, setup_key: str | None
    ) -> str | None:
        """Check the repository out (when the type does); returns the setup key still valid for what was checked
        out: None when the branch moved since the key was made (a push meanwhile), so no snapshot is filed under a
        commit it does not hold."""
        if repo is None or not config.checkout_on_start:
            return setup_key
        head = await checkout(self.workspaces.runtime, workspace_id, repo)
        if setup_key is not None and self._setup_commits.get(setup_key) != head:
            return None
        return setup_key

    # --- set up once, start many ---------------------------------------------------------------------------------

    async def _setup_key(self, session_id: str, config: WorkspaceConfig, repo: RepoRef | None) -> str | None:
        """What decides the result of checkout and setup, hashed; None when the type does not snapshot (or the
        commit cannot be told now: then the session sets up as usual)."""
        if not config.snapshot_after_setup or self.snapshots is None:
            return None
        commit = None
        if repo is not None and config.checkout_on_start:
            try:
                commit = await resolve_commit(repo)
            except CorralError as exc:
                log.warning("session %s: no setup snapshot (%s)", session_id, redact_text(exc.message))
                return None
        limits = ResourceLimits.parse(config.resource_limits, defaults=self.workspaces.default_limits())
        key = {
            "repository": clean_url(repo.url) if repo is not None and config.checkout_on_start else None,
            "branch": repo.branch if repo is not None else None,
            "commit": commit,
            "setup_commands": list(config.setup_commands),
            "image": config.base_image or self.workspaces.settings.base_image,
            "limits": limits.to_json(),
            "network": config.network,
            "container_type": config.container_type,
            "provider": config.provider,
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        self._setup_commits[digest] = commit
        return digest

    async def _from_setup_snapshot(
        self, session_id: str, setup_key: str | None, task: TaskContext, repo: RepoRef | None
    ) -> bool:
        """Start the session from the snapshot an earlier session took after the same setup: a workspace of the
        snapshot's setup pool when one is ready, else one restored now. False when there is none (or it cannot be
        restored: then the session sets up as usual)."""
        if setup_key is None or self.snapshots is None:
            return False
        snapshot = await self.store.snapshots.find_setup(setup_key)
        if snapshot is None:
            return False
        task_metadata = _metadata(session_id, task, repo)
        setup = {"source": "snapshot", "snapshot_id": snapshot.id}
        try:
            # Its setup pool holds workspaces restored from exactly this snapshot, ready in milliseconds.
            record = await self.snapshots.restore_warm(
                snapshot.id, metadata={**task_metadata, "setup": {**setup, "warm_pool": True}}
            )
            if record is None:
                record = await self.snapshots.restore(snapshot.id, metadata={**task_metadata, "setup": setup})
        except Exception as exc:  # whatever went wrong, the session still gets a workspace: set it up as usual
            log.warning("session %s: setup snapshot %s not restored (%s); setting up", session_id, snapshot.id, exc)
            return False
        await self._update_session(session_id, workspace_id=record.id)
        await self._finish(session_id, status="active", workspace_id=record.id)
        how = "from its warm pool" if record.from_warm_pool else "restored now"
        log.info(
            "session %s: started from setup snapshot %s, %s (checkout and setup skipped)", session_id, snapshot.id, how
        )
        return True

    async def _snapshot_setup(
        self, session_id: str, workspace_id: str, setup_key: str, task: TaskContext, repo: RepoRef | None
    ) -> list[str]:
        """Snapshot the freshly set-up workspace for later sessions; returns warnings (a failure is one)."""
        assert self.snapshots is not None
        session = await self.store.sessions.get(session_id)
        owner = {SETUP_OWNER: session.agent_type_id} if session is not None else {}  # its type's newest gets a pool
        try:
            snapshot = await self.snapshots.create(
                workspace_id,
                name=f"setup-{setup_key[:12]}",
                setup_key=setup_key,
                metadata={"session_id": session_id, **owner},
            )
        except CorralError as exc:
            return [f"could not snapshot the workspace after setup ({exc.message}); the next session sets up again"]
        metadata = {**_metadata(session_id, task, repo), "setup": {"source": "ran", "snapshot_id": snapshot.id}}
        await self.workspaces.set_metadata(workspace_id, metadata)
        return []

    async def _finish(self, session_id: str, **fields: Any) -> SessionRecord | None:
        """Set ``fields`` and drop the sealed credentials from the session: provisioning is over, nothing needs them."""
        session = await self.store.sessions.get(session_id)
        if session is None:
            return None
        task = {k: v for k, v in session.task_context.items() if k != _SEALED_TASK_KEY}
        config = dict(session.workspace_config)
        if isinstance(source := config.get("repo_source"), Mapping):
            config["repo_source"] = {k: v for k, v in source.items() if k != "sealed_url"}
        return await self._update_session(session_id, task_context=task, workspace_config=config, **fields)

    async def _fail(self, session_id: str, failures: list[str], *, retried: bool) -> None:
        """End provisioning without a workspace: the session is active and degraded, and says why."""
        if retried:
            reason = "workspace provisioning failed twice; the session runs without a workspace: "
        else:
            reason = "workspace provisioning failed (not retried: another provider would not fix it); the session "
            reason += "runs without a workspace: "
        reason += " | ".join(failures)
        log.error("session %s: %s", session_id, reason)
        await self._finish(session_id, status="active", degraded=True, degraded_reason=reason)

    def _clone_source(self, config: WorkspaceConfig, task: TaskContext) -> RepoRef | None:
        """The repository to clone, with its credential: a fixed source's sealed URL is opened here."""
        source = config.repo_source
        if source.type == "fixed" and source.url and source.sealed_url is not None:
            return RepoRef(self.box.open(source.sealed_url, purpose=SOURCE_URL_PURPOSE), source.branch)
        return _repository(config, task)

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


def _in_clear(url: str | None) -> bool:
    """A URL whose credential is not masked."""
    return url is not None and redact_url(url) != url


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
        "repository_url": clean_url(repo.url) if repo is not None else None,
        "branch": repo.branch if repo is not None else None,
        "pull_request_number": task.pull_request_number,
        "base_branch": task.base_branch,
    }
    return {"session_id": session_id, "task": task_meta}


def _tail(output: bytes) -> str:
    text = output.decode(errors="replace").strip()
    return text[-OUTPUT_TAIL:] if text else "(no output)"
