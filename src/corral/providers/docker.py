"""The ``docker`` provider: workspaces as Docker containers under runc. Also the engine behind ``gvisor``.

Layout of one workspace ``{id}`` (seed 003):

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
from importlib import resources
from typing import Any

from corral.errors import (
    CorralError,
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    SandboxNotFoundError,
    WorkspaceStateError,
)
from corral.guest.client import GuestConnection, GuestConnectionLost
from corral.guest.remote import AgentBackedProvider
from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.providers.base import (
    WORKSPACE_ROOT,
    Capabilities,
    Health,
    NetworkMode,
    ResourceLimits,
    SandboxState,
    WorkspaceSpec,
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
WARMUP_CONCURRENCY = 2


def volume_name(workspace_id: str) -> str:
    """The Docker volume holding ``/workspace`` (seed 003's name)."""
    return f"agent-workspace-{workspace_id}"


def container_name(workspace_id: str) -> str:
    """The Docker container of a running workspace."""
    return f"corral-{workspace_id}"


# The agent's source travels over the exec's stdin (length line, then the source), so nothing is written into the
# workspace, any image with python3 works, and the process list shows one short line. -I ignores the environment
# and user site; -S skips `site` for a faster start.
AGENT_BOOT = (
    "import sys;n=int(sys.stdin.buffer.readline());exec(compile(sys.stdin.buffer.read(n),'corral-agent','exec'))"
)
AGENT_COMMAND = ["python3", "-I", "-S", "-c", AGENT_BOOT]


def _agent_source() -> bytes:
    source = resources.files("corral.guest").joinpath("agent.py").read_bytes()
    return b"%d\n%s" % (len(source), source)


class DockerProvider(AgentBackedProvider):
    """Workspaces as hardened Docker containers with a named volume. ``runtime`` picks runc or runsc.

    Exec and file operations come from :class:`~corral.guest.remote.AgentBackedProvider`; this class supplies the
    agent connection (``_agent``) and everything about containers and volumes.
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
    ) -> None:
        self.engine = engine
        self.owner = owner
        self.pids_limit = pids_limit
        self.output_limit = output_limit
        self._agents: dict[str, GuestConnection] = {}
        self._agent_locks: dict[str, asyncio.Lock] = {}
        self._startup_ms: float | None = None
        self._events_task: asyncio.Task[None] | None = None
        self._warmups: dict[str, asyncio.Task[None]] = {}
        self._dead: set[str] = set()  # containers that died since their create/resume, from the event stream
        self._warmup_slots = asyncio.Semaphore(WARMUP_CONCURRENCY)
        self._agent_source = _agent_source()

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
        config = self._container_config(spec)
        name = container_name(spec.id)
        try:
            await self.engine.create_container(name, config)
            await self.engine.start_container(name)
        except DockerAPIError as exc:
            with contextlib.suppress(Exception):
                await self.engine.remove_container(name)
            raise self._translate(exc, spec.id, image=spec.image) from exc

    def _container_config(self, spec: WorkspaceSpec) -> dict[str, Any]:
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
                "Mounts": [{"Type": "volume", "Source": volume_name(spec.id), "Target": WORKSPACE_ROOT}],
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
        await self._remove_all(workspace_id)

    async def _remove_all(self, workspace_id: str) -> None:
        await self._call(self.engine.remove_container(container_name(workspace_id)))
        await self._call(self.engine.remove_volume(volume_name(workspace_id)))

    async def stop(self, workspace_id: str) -> None:
        """Remove the container (processes end, memory is freed); the volume stays."""
        if await self._call(self.engine.inspect_volume(volume_name(workspace_id))) is None:
            raise SandboxNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        await self._drop_agent(workspace_id)
        await self._call(self.engine.remove_container(container_name(workspace_id)))

    async def resume(self, workspace_id: str) -> None:
        """Start a new container on the workspace's volume. A running workspace is left as it is."""
        volume = await self._call(self.engine.inspect_volume(volume_name(workspace_id)))
        if volume is None:
            raise SandboxNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is not None and info["State"].get("Running"):
            return
        if info is not None:  # exited on its own (e.g. killed by the OOM killer): replace it
            await self._call(self.engine.remove_container(container_name(workspace_id)))
        spec = _spec_from_json(workspace_id, (volume.get("Labels") or {}).get(LABEL_SPEC, "{}"))
        await self.check_runtime()
        await self._start_container(spec)

    async def state(self, workspace_id: str) -> SandboxState:
        """Running when the container runs; stopped when only the volume is left; else missing."""
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is not None and info["State"].get("Running"):
            return SandboxState.RUNNING
        if await self._call(self.engine.inspect_volume(volume_name(workspace_id))) is not None:
            return SandboxState.STOPPED
        return SandboxState.STOPPED if info is not None else SandboxState.MISSING

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
            await self._require_running(workspace_id)
            try:
                stream = await self.engine.exec_attached(
                    container_name(workspace_id),
                    AGENT_COMMAND,
                    on_stderr=lambda data: log.debug("agent %s: %s", workspace_id, data.decode(errors="replace")),
                )
            except DockerAPIError as exc:
                raise self._translate(exc, workspace_id) from exc
            stream.writer.write(self._agent_source)
            conn = GuestConnection(stream.reader, stream.writer, label=f"workspace {workspace_id}")
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
        """Close a workspace's agent stream as soon as its container dies.

        dockerd does not always end a hijacked exec stream when the container goes away (runsc keeps it open), so
        without this a command in a killed or OOM-stopped workspace would wait forever.
        """
        filters = {"type": ["container"], "event": ["die", "destroy"], "label": [f"{LABEL_PROVIDER}={self.name}"]}
        while self._agents:
            try:
                async for event in self.engine.events(filters):
                    workspace_id = (event.get("Actor", {}).get("Attributes") or {}).get(LABEL_ID)
                    if workspace_id:
                        self._dead.add(workspace_id)
                    conn = self._agents.pop(workspace_id, None) if workspace_id else None
                    if conn is not None:
                        log.info(
                            "workspace %s: container %s; closing its agent stream", workspace_id, event.get("Action")
                        )
                        await conn.aclose()
            except DockerAPIError as exc:
                log.warning("%s: docker event stream failed (%s); retrying", self.name, exc)
                await asyncio.sleep(1.0)

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
        if state is SandboxState.MISSING:
            raise SandboxNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        if state is SandboxState.STOPPED:
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
        if image is not None and exc.status == 404 and "no such image" in message.lower():
            # Container create never pulls (only the CLI's `docker run` does), so a missing image ends here.
            return InvalidRequestError(
                f"base_image: image {image!r} is not present on this host; Corral never pulls images. "
                "Build the default one with `corral image build` (make bootstrap does it).",
                details={"field": "base_image", "image": image},
            )
        if exc.status == 0:
            return ProviderUnavailableError(self.name, message)
        if "unknown runtime" in message.lower():
            return ProviderUnavailableError(self.name, f"gVisor runtime not available: {message}")
        if exc.status == 404 and workspace_id is not None:
            return SandboxNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        if "range of cpus" in message.lower() or ("memory" in message.lower() and exc.status == 400):
            return ResourceLimitError(f"{self.name}: {message}")
        return ProviderUnavailableError(self.name, message)


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
