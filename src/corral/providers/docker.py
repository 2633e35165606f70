"""The ``docker`` provider: workspaces as Docker containers under runc. Also the engine behind ``gvisor``.

Layout of one workspace ``{id}``:

* volume ``agent-workspace-{id}`` mounted at ``/workspace``; it also carries the workspace spec in a label, so a
  stopped workspace can be resumed by any server process without a database;
* container ``corral-{id}`` running ``sleep infinity`` under Docker's init, hardened: no new privileges, every
  capability dropped but the few a dev workspace needs, a pids limit, CPU and memory limits, no host paths or
  sockets mounted, and no network at all in ``isolated`` mode;
* both labelled ``corral.workspace.id={id}`` and ``corral.provider={name}``.

Stop removes the container and keeps the volume; resume creates a new container on the same volume. Exec and file
calls go to the guest agent (:mod:`corral.guest.agent`), started once per container with ``docker exec -i`` and then
reused for every call: one round trip over an open stream instead of a new ``docker exec`` per call.

Plain runc shares the host kernel: every create logs a security warning saying isolation is reduced. Prefer gvisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from corral.errors import (
    CorralError,
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.guest.client import GuestConnection, GuestConnectionLost
from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.providers.agent_backed import AgentBackedProvider
from corral.providers.agent_runtime import AGENT_COMMAND, RUNTIME_MOUNT, AgentRuntime, agent_environment
from corral.providers.base import (
    WORKSPACE_ROOT,
    Capabilities,
    Health,
    NetworkMode,
    ResourceLimits,
    WorkspaceEvent,
    WorkspaceSpec,
    WorkspaceState,
)

__all__ = ["DockerProvider", "volume_name"]

log = logging.getLogger(__name__)

LABEL_ID = "corral.workspace.id"
LABEL_PROVIDER = "corral.provider"
LABEL_SPEC = "corral.spec"
LABEL_OWNER = "corral.owner"

# What a development workspace needs: file ownership and permissions (package managers, git), signals to its own
# processes, and switching users (su, sudo-less tools that drop privileges). Everything else (NET_RAW, MKNOD,
# SYS_CHROOT, AUDIT_WRITE, SETPCAP, NET_BIND_SERVICE, SETFCAP...) is dropped.
WORKSPACE_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"]
AGENT_START_TIMEOUT_S = 30.0
DEFAULT_AGENT_IMAGE = "corral/workspace:base"
DEFAULT_AGENT_RUNTIME_DIR = Path("/var/lib/corral/agent-runtime")
WARMUP_CONCURRENCY = 2


def volume_name(workspace_id: str) -> str:
    """The Docker volume holding ``/workspace``."""
    return f"agent-workspace-{workspace_id}"


def container_name(workspace_id: str) -> str:
    """The Docker container of a running workspace."""
    return f"corral-{workspace_id}"


class DockerProvider(AgentBackedProvider):
    """Workspaces as hardened Docker containers with a named volume. ``runtime`` picks runc or runsc.

    Exec and file operations come from :class:`~corral.providers.agent_backed.AgentBackedProvider`; this class
    supplies the agent connection (``_agent``) and everything about containers and volumes.
    """

    name = "docker"
    isolation: Any = "container"
    default_startup_ms = 250.0

    def __init__(
        self,
        engine: DockerEngine,
        *,
        pids_limit: int = 1024,
        output_limit: int = 16 * 1024 * 1024,
        owner: str | None = None,
        agent_image: str = DEFAULT_AGENT_IMAGE,
        agent_runtime_dir: Path = DEFAULT_AGENT_RUNTIME_DIR,
    ) -> None:
        self.engine = engine
        self.owner = owner
        self.agent_runtime = AgentRuntime(engine, image=agent_image, root=agent_runtime_dir, provider=self.name)
        self.pids_limit = pids_limit
        self.output_limit = output_limit
        self._agents: dict[str, GuestConnection] = {}
        self._agent_locks: dict[str, asyncio.Lock] = {}
        self._startup_ms: float | None = None
        self._events_task: asyncio.Task[None] | None = None
        self._warmups: dict[str, asyncio.Task[None]] = {}
        self._dead: set[str] = set()  # containers that died since their create/resume, from the event stream
        self._expected_exits: set[str] = set()  # containers Corral itself is stopping or removing
        self._containers: dict[str, str] = {}  # workspace id -> the id of the container started for it last
        self._generations: dict[str, int] = {}  # workspace id -> how many containers this process started for it
        self._warmup_slots = asyncio.Semaphore(WARMUP_CONCURRENCY)

    # --- what differs between runc and runsc -------------------------------------------------------------------

    def runtime_for(self, network: NetworkMode) -> str:
        """The dockerd runtime for a workspace with this network mode."""
        del network
        return "runc"

    async def check_runtime(self) -> None:
        """Raise ProviderUnavailableError when the runtime this provider needs is not registered."""
        return

    def on_create(self, spec: WorkspaceSpec) -> None:
        """Hook run before every create; plain Docker uses it to log the reduced-isolation warning."""
        log.warning(
            "SECURITY: workspace %s runs under plain Docker (runc): it shares the host kernel, so isolation is "
            "reduced. Use the gvisor provider (or firecracker) for untrusted code.",
            spec.id,
        )

    # --- lifecycle -----------------------------------------------------------------------------------------------

    async def create(self, spec: WorkspaceSpec) -> None:
        """Create the volume and the container and start it (see the module docstring)."""
        started = time.monotonic()
        await self.check_runtime()
        self.on_create(spec)
        labels = self._labels(spec.id)
        try:
            await self._call(self.engine.create_volume(volume_name(spec.id), {**labels, LABEL_SPEC: _spec_json(spec)}))
            await self._start_container(spec)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._remove_all(spec.id))
            raise
        elapsed = (time.monotonic() - started) * 1000
        self._startup_ms = elapsed if self._startup_ms is None else 0.8 * self._startup_ms + 0.2 * elapsed
        # Start the agent in the background, so the first exec usually finds it ready.
        task = asyncio.create_task(self._connect_quietly(spec.id), name=f"agent-warmup-{spec.id}")
        self._warmups[spec.id] = task
        task.add_done_callback(lambda _: self._warmups.pop(spec.id, None))

    def known_dead(self, workspace_id: str) -> bool:
        """True when the event stream saw the container die since it was started (see :class:`DeathWatcher`)."""
        return workspace_id in self._dead

    async def _start_container(self, spec: WorkspaceSpec) -> None:
        self._dead.discard(spec.id)
        self._expected_exits.discard(spec.id)
        self._ensure_event_watch()
        config = self._container_config(spec, await self.agent_runtime.ensure())
        name = container_name(spec.id)
        try:
            self._containers[spec.id] = await self.engine.create_container(name, config)
            self._generations[spec.id] = self._generations.get(spec.id, 0) + 1
            await self.engine.start_container(name)
        except DockerAPIError as exc:
            with contextlib.suppress(Exception):
                await self.engine.remove_container(name)
            raise self._translate(exc, spec.id, image=spec.image) from exc

    def _container_config(self, spec: WorkspaceSpec, agent_runtime: str) -> dict[str, Any]:
        limits = spec.limits
        return {
            "Image": spec.image,
            "Cmd": ["sleep", "infinity"],
            "WorkingDir": WORKSPACE_ROOT,
            "Hostname": "workspace",
            "Env": [f"{k}={v}" for k, v in spec.env.items()],
            "Labels": {**dict(spec.labels), **self._labels(spec.id)},
            "NetworkDisabled": spec.network == "isolated",
            "HostConfig": {
                "Runtime": self.runtime_for(spec.network),
                "NanoCpus": round(limits.cpu * 1e9),
                "Memory": limits.memory_bytes,
                "MemorySwap": limits.memory_bytes,  # no swap on top of the memory limit
                "PidsLimit": self.pids_limit,
                "CapDrop": ["ALL"],
                "CapAdd": WORKSPACE_CAPABILITIES,
                "SecurityOpt": ["no-new-privileges:true"],
                "Init": True,  # reaps orphaned processes; `sleep` as PID 1 would not
                "NetworkMode": "none" if spec.network == "isolated" else "bridge",
                "IpcMode": "private",
                "LogConfig": {"Type": "none"},
                "Mounts": [
                    {"Type": "volume", "Source": volume_name(spec.id), "Target": WORKSPACE_ROOT},
                    # The agent's runtime, read-only: nothing inside can change the agent's code path.
                    {"Type": "bind", "Source": agent_runtime, "Target": RUNTIME_MOUNT, "ReadOnly": True},
                ],
                "RestartPolicy": {"Name": "no"},
            },
        }

    def _labels(self, workspace_id: str) -> dict[str, str]:
        labels = {LABEL_ID: workspace_id, LABEL_PROVIDER: self.name}
        if self.owner is not None:
            labels[LABEL_OWNER] = self.owner
        return labels

    async def destroy(self, workspace_id: str) -> None:
        """Remove container and volume. Idempotent."""
        await self._drop_agent(workspace_id)
        self._forget_gate(workspace_id)
        await self._remove_all(workspace_id)

    async def _remove_all(self, workspace_id: str) -> None:
        self._expected_exits.add(workspace_id)
        await self._call(self.engine.remove_container(container_name(workspace_id)))
        await self._call(self.engine.remove_volume(volume_name(workspace_id)))

    async def stop(self, workspace_id: str) -> None:
        """Remove the container (processes end, memory is freed); the volume stays."""
        if await self._call(self.engine.inspect_volume(volume_name(workspace_id))) is None:
            raise WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        await self._drop_agent(workspace_id)
        self._expected_exits.add(workspace_id)
        await self._call(self.engine.remove_container(container_name(workspace_id)))

    async def resume(self, workspace_id: str) -> None:
        """Start a new container on the workspace's volume. A running workspace is left as it is."""
        volume = await self._call(self.engine.inspect_volume(volume_name(workspace_id)))
        if volume is None:
            raise WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is not None and info["State"].get("Running"):
            return
        if info is not None:  # exited on its own (e.g. killed by the OOM killer): replace it
            self._expected_exits.add(workspace_id)
            await self._call(self.engine.remove_container(container_name(workspace_id)))
        spec = _spec_from_json(workspace_id, (volume.get("Labels") or {}).get(LABEL_SPEC, "{}"))
        await self.check_runtime()
        await self._start_container(spec)

    async def state(self, workspace_id: str) -> WorkspaceState:
        """Running when the container runs; stopped when only the volume is left; else missing."""
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is not None and info["State"].get("Running"):
            return WorkspaceState.RUNNING
        if await self._call(self.engine.inspect_volume(volume_name(workspace_id))) is not None:
            return WorkspaceState.STOPPED
        return WorkspaceState.STOPPED if info is not None else WorkspaceState.MISSING

    async def list_workspaces(self) -> list[str]:
        """Ids of every workspace with a volume or a container of this provider (and this owner, if set)."""
        labels = [f"{LABEL_PROVIDER}={self.name}"]
        if self.owner is not None:
            labels.append(f"{LABEL_OWNER}={self.owner}")
        volumes = await self._call(self.engine.list_volumes(labels))
        containers = await self._call(self.engine.list_containers(labels))
        ids = {v["Labels"][LABEL_ID] for v in volumes if LABEL_ID in (v.get("Labels") or {})}
        ids |= {c["Labels"][LABEL_ID] for c in containers if LABEL_ID in (c.get("Labels") or {})}
        return sorted(ids)

    # --- the agent ---------------------------------------------------------------------------------------------

    async def _connect_quietly(self, workspace_id: str) -> None:
        # Bounded: an agent start costs ~0.3 s of CPU under gVisor, and 50 at once would starve the creates.
        async with self._warmup_slots:
            with contextlib.suppress(CorralError, GuestConnectionLost):
                await self._agent(workspace_id)

    async def _agent(self, workspace_id: str) -> GuestConnection:
        conn = self._agents.get(workspace_id)
        if conn is not None and not conn.closed:
            return conn
        lock = self._agent_locks.setdefault(workspace_id, asyncio.Lock())
        async with lock:
            conn = self._agents.get(workspace_id)
            if conn is not None and not conn.closed:
                return conn
            info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
            if info is None or not info["State"].get("Running"):
                await self._require_running(workspace_id)  # raises: missing or stopped
            try:
                stream = await self.engine.exec_attached(
                    container_name(workspace_id),
                    AGENT_COMMAND,
                    env=agent_environment(info["Config"].get("Env") or []),
                    working_dir=RUNTIME_MOUNT,  # nothing of the agent's is read from a directory the workspace owns
                    on_stderr=_AgentLog(workspace_id),
                )
            except DockerAPIError as exc:
                raise self._translate(exc, workspace_id) from exc
            conn = GuestConnection(
                stream.reader,
                stream.writer,
                label=f"workspace {workspace_id}",
                on_violation=self._violation_reporter(workspace_id),
                answer_timeout_s=self.agent_answer_timeout_s,
            )
            try:
                await conn.wait_ready(AGENT_START_TIMEOUT_S)
            except GuestConnectionLost as exc:
                await conn.aclose()
                await self._require_running(workspace_id)
                raise ProviderUnavailableError(self.name, f"the workspace agent did not start: {exc}") from exc
            except BaseException:  # cancelled (destroy, shutdown): never leave the stream open
                await asyncio.shield(conn.aclose())
                raise
            self._agents[workspace_id] = conn
            self._ensure_event_watch()
            return conn

    def _ensure_event_watch(self) -> None:
        if self._events_task is None or self._events_task.done():
            self._events_task = asyncio.create_task(self._watch_events(), name=f"{self.name}-docker-events")

    async def _watch_events(self) -> None:
        """Report containers that die on their own, and close their agent streams, as soon as the engine says so.

        A sandbox killed by a fork bomb, the OOM killer or ``docker kill`` is a ``died`` event for subscribers (the
        workspace service marks the record at once, for every API). dockerd does not always end a hijacked exec
        stream when the container goes away (runsc keeps it open), so without closing it a command in a dead
        workspace would wait forever. Exits Corral caused itself (stop, destroy) are not reported.
        """
        labels = [f"{LABEL_PROVIDER}={self.name}"] + ([f"{LABEL_OWNER}={self.owner}"] if self.owner else [])
        filters = {"type": ["container"], "event": ["die", "destroy"], "label": labels}
        while True:
            try:
                async for event in self.engine.events(filters):
                    attributes = event.get("Actor", {}).get("Attributes") or {}
                    workspace_id = attributes.get(LABEL_ID)
                    if not workspace_id or not self._current(workspace_id, event.get("Actor", {}).get("ID")):
                        continue  # an older container of the workspace (replaced by a resume) is no news
                    self._dead.add(workspace_id)
                    if event.get("Action") == "die" and workspace_id not in self._expected_exits:
                        code = attributes.get("exitCode", "?")
                        self._emit(
                            WorkspaceEvent(
                                workspace_id, "died", f"its {self.name} sandbox exited on its own (exit code {code})"
                            )
                        )
                    conn = self._agents.pop(workspace_id, None)
                    if conn is not None:
                        log.info(
                            "workspace %s: container %s; closing its agent stream", workspace_id, event.get("Action")
                        )
                        await conn.aclose()
            except DockerAPIError as exc:
                log.warning("%s: docker event stream failed (%s); retrying", self.name, exc)
                await asyncio.sleep(1.0)

    def _current(self, workspace_id: str, container_id: object) -> bool:
        """Whether an event's container is the one this process started last for the workspace (unknown: yes)."""
        known = self._containers.get(workspace_id)
        return known is None or container_id == known

    def _generation(self, workspace_id: str) -> int:
        """How many containers this process started for the workspace (see AgentBackedProvider)."""
        return self._generations.get(workspace_id, 0)

    async def _drop_agent(self, workspace_id: str) -> None:
        warmup = self._warmups.pop(workspace_id, None)
        if warmup is not None:
            warmup.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await warmup
        conn = self._agents.pop(workspace_id, None)
        self._agent_locks.pop(workspace_id, None)
        if conn is not None:
            await conn.aclose()

    async def _require_running(self, workspace_id: str) -> None:
        state = await self.state(workspace_id)
        if state is WorkspaceState.MISSING:
            raise WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        if state is WorkspaceState.STOPPED:
            raise WorkspaceStateError(
                f"workspace {workspace_id} is stopped; resume it first", details={"id": workspace_id}
            )

    # --- health ----------------------------------------------------------------------------------------------------

    async def health(self) -> Health:
        """Ping the engine, then check the runtime is registered."""
        started = time.monotonic()
        try:
            await self.engine.ping()
            await self.check_runtime()
        except ProviderUnavailableError as exc:
            return Health(False, exc.reason, latency_ms=(time.monotonic() - started) * 1000)
        except DockerAPIError as exc:
            return Health(False, exc.message, latency_ms=(time.monotonic() - started) * 1000)
        return Health(True, latency_ms=(time.monotonic() - started) * 1000)

    async def capabilities(self) -> Capabilities:
        """Features and what this host has left."""
        resources_now: dict[str, object] = {}
        with contextlib.suppress(DockerAPIError):
            info = await self.engine.info()
            resources_now = {
                "cpu_count": info.get("NCPU"),
                "memory_bytes": info.get("MemTotal"),
                "containers_running": info.get("ContainersRunning"),
            }
            root = info.get("DockerRootDir") or "/var/lib/docker"
            with contextlib.suppress(OSError):
                resources_now["disk_free_bytes"] = shutil.disk_usage(root).free
        return Capabilities(
            isolation=self.isolation,
            persistence=True,
            snapshots=False,
            warm_pool=True,
            streaming=True,
            # The local volume driver has no size option on ext4/overlay2, so the disk limit is watched, not enforced.
            disk_limit="monitored",
            requirements=self.requirements(),
            startup_latency_ms=self._startup_ms if self._startup_ms is not None else self.default_startup_ms,
            resources=resources_now,
        )

    def requirements(self) -> tuple[str, ...]:
        """What the host must provide."""
        return ("docker",)

    async def aclose(self) -> None:
        """Close agent streams and the engine client; containers keep running."""
        for workspace_id in {*self._agents, *self._warmups}:
            await self._drop_agent(workspace_id)
        if self._events_task is not None:
            self._events_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._events_task
        await self.engine.aclose()

    # --- errors ----------------------------------------------------------------------------------------------------

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except DockerAPIError as exc:
            raise self._translate(exc, None) from exc

    def _translate(self, exc: DockerAPIError, workspace_id: str | None, image: str | None = None) -> CorralError:
        message = exc.message
        bad_image = _image_error(exc, image)
        if bad_image is not None:
            return bad_image
        if exc.status == 0:
            return ProviderUnavailableError(self.name, message)
        if "unknown runtime" in message.lower():
            return ProviderUnavailableError(self.name, f"gVisor runtime not available: {message}")
        if exc.status == 404 and workspace_id is not None:
            return WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        if "range of cpus" in message.lower() or ("memory" in message.lower() and exc.status == 400):
            return ResourceLimitError(f"{self.name}: {message}")
        return ProviderUnavailableError(self.name, message)


def _image_error(exc: DockerAPIError, image: str | None) -> InvalidRequestError | None:
    """The engine's answer about the image as bad input (400), never a provider failure worth falling back on."""
    message = exc.message.lower()
    if image is not None and exc.status == 404 and "no such image" in message:
        # Container create never pulls (only the CLI's `docker run` does), so a missing image ends here.
        return InvalidRequestError(
            f"base_image: image {image!r} is not present on this host; Corral never pulls images. "
            "Build the default one with `corral image build` (make bootstrap does it).",
            details={"field": "base_image", "image": image},
        )
    if "invalid reference format" in message:
        return InvalidRequestError(
            f"base_image: {image!r} is not a valid image reference ({exc.message}); use "
            "[registry[:port]/]name[:tag][@digest] with a lowercase name, e.g. 'corral/workspace:base'",
            details={"field": "base_image", "image": image},
        )
    return None


class _AgentLog:
    """Where an agent's stderr goes: the debug log, capped, and not even decoded unless debug logging is on (root in
    the workspace can write there as much as it likes)."""

    MAX_LOGGED = 64 * 1024

    def __init__(self, workspace_id: str) -> None:
        self.workspace_id = workspace_id
        self.logged = 0

    def __call__(self, data: bytes) -> None:
        if self.logged >= self.MAX_LOGGED or not log.isEnabledFor(logging.DEBUG):
            return
        self.logged += len(data)
        log.debug("agent %s: %s", self.workspace_id, data[:4096].decode(errors="replace"))


def _spec_json(spec: WorkspaceSpec) -> str:
    return json.dumps(
        {
            "image": spec.image,
            "cpu": spec.limits.cpu,
            "memory": spec.limits.memory_bytes,
            "disk": spec.limits.disk_bytes,
            "network": spec.network,
            "container_type": spec.container_type,
            "env": dict(spec.env),
            "labels": dict(spec.labels),
        },
        separators=(",", ":"),
    )


def _spec_from_json(workspace_id: str, text: str) -> WorkspaceSpec:
    data = json.loads(text)
    return WorkspaceSpec(
        id=workspace_id,
        image=data["image"],
        limits=ResourceLimits(cpu=data["cpu"], memory_bytes=data["memory"], disk_bytes=data["disk"]),
        network=data["network"],
        container_type=data["container_type"],
        env=data.get("env", {}),
        labels=data.get("labels", {}),
    )
