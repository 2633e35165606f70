"""The ``docker`` provider: workspaces as Docker containers under runc. Also the engine behind ``gvisor``.

Layout of one workspace ``{id}``:

* volume ``agent-workspace-{id}`` mounted at ``/workspace``; it also carries the workspace spec in a label, so a
  stopped workspace can be resumed by any server process without a database;
* container ``corral-{id}`` running ``sleep infinity`` under Docker's init, hardened: no new privileges, every
  capability dropped but the few a dev workspace needs, a pids limit, CPU and memory limits, no host paths or
  sockets mounted, and no network at all in ``isolated`` mode;
* both labelled ``corral.workspace.id={id}`` and ``corral.provider={name}``.

Stop stops the container and keeps it: its whole filesystem (packages, /etc, /root, /tmp on disk) and the volume
come back on resume. Pause under gVisor checkpoints processes and memory into the stopped container (Docker's
experimental checkpoint API); resume restores them. Snapshots and forks: see :meth:`DockerProvider.snapshot`.
Exec and file calls go to the guest agent (:mod:`corral.guest.agent`), started once per container with
``docker exec -i`` and then reused for every call: one round trip over an open stream instead of a new
``docker exec`` per call.

Plain runc shares the host kernel: every create logs a security warning saying isolation is reduced. Prefer gvisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import time
import weakref
from pathlib import Path
from typing import Any, Literal

from corral.egress import EgressController, EgressPolicy
from corral.egress.controller import always_denied, docker_nameservers
from corral.errors import (
    CorralError,
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    SnapshotNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.guest.agent import SPAWNER_SOCKET
from corral.guest.client import GuestConnection, GuestConnectionLost
from corral.providers._container_stats import NotRunning, usage_from_stats
from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.providers._host_copy import copy_tree, link_tree, tree_size
from corral.providers.agent_backed import AgentBackedProvider
from corral.providers.agent_runtime import (
    AGENT_COMMAND,
    RUNTIME_MOUNT,
    SPAWNER_COMMAND,
    AgentRuntime,
    agent_environment,
)
from corral.providers.base import (
    WORKSPACE_ROOT,
    Capabilities,
    Health,
    NetworkMode,
    ResourceLimits,
    ResourceUsage,
    SnapshotInfo,
    WorkspaceEvent,
    WorkspaceSpec,
    WorkspaceState,
)

__all__ = ["DockerProvider", "volume_name"]

log = logging.getLogger(__name__)

LABEL_ID = "corral.workspace.id"
LAYER_SIZE_MAX_AGE_S = 20.0
"""How long a measured writable-layer size serves :meth:`DockerProvider.resource_usage` (metrics sample every 5 s)."""
LABEL_PROVIDER = "corral.provider"
LABEL_SPEC = "corral.spec"
LABEL_OWNER = "corral.owner"
LABEL_SNAPSHOT = "corral.snapshot.id"
SNAPSHOT_REPO = "corral-snapshot"
PAUSE_CHECKPOINT = "corral-pause"
DEFAULT_SNAPSHOT_DIR = Path("/var/lib/corral/snapshots")

# What a development workspace needs: file ownership and permissions (package managers, git), signals to its own
# processes, and switching users (su, sudo-less tools that drop privileges). Everything else (NET_RAW, MKNOD,
# SYS_CHROOT, AUDIT_WRITE, SETPCAP, NET_BIND_SERVICE, SETFCAP...) is dropped.
WORKSPACE_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"]
AGENT_START_TIMEOUT_S = 30.0
DEFAULT_AGENT_IMAGE = "corral/workspace:base"
DEFAULT_AGENT_RUNTIME_DIR = Path("/var/lib/corral/agent-runtime")
WARMUP_CONCURRENCY = 2
_RESTORES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def _restore_lock() -> asyncio.Lock:
    """One checkpoint restore at a time per event loop, across provider instances (see DockerProvider._start)."""
    return _RESTORES.setdefault(asyncio.get_running_loop(), asyncio.Lock())


def volume_name(workspace_id: str) -> str:
    """The Docker volume holding ``/workspace``."""
    return f"agent-workspace-{workspace_id}"


def container_name(workspace_id: str) -> str:
    """The Docker container of a running workspace."""
    return f"corral-{workspace_id}"


def snapshot_volume(snapshot_id: str) -> str:
    """The Docker volume holding a snapshot's copy of ``/workspace`` (never mounted anywhere)."""
    return f"corral-snapshot-{snapshot_id}"


def snapshot_image(snapshot_id: str) -> str:
    """The image holding a snapshot's root filesystem (``docker commit`` of the source)."""
    return f"{SNAPSHOT_REPO}:{snapshot_id}"


class DockerProvider(AgentBackedProvider):
    """Workspaces as hardened Docker containers with a named volume. ``runtime`` picks runc or runsc.

    Exec and file operations come from :class:`~corral.providers.agent_backed.AgentBackedProvider`; this class
    supplies the agent connection (``_agent``) and everything about containers and volumes.
    """

    name = "docker"
    isolation: Any = "container"
    default_startup_ms = 250.0
    memory_checkpoints = False
    """Whether the runtime checkpoints processes and memory (runsc does; runc would need CRIU, which cannot
    checkpoint on these hosts' kernels). Without it, pause is a stop and snapshots hold files only."""
    agent_idle_close_s: float = 0.0
    """Close a workspace's agent stream after this many seconds without a call, once the agent has served one
    (CORRAL_AGENT_IDLE_CLOSE_S; 0: never). The agent and the host's ``docker exec`` process behind the stream end (the
    `runsc exec` and the agent's memory under gVisor); the next call starts a fresh agent, as after a pause. An agent
    started ahead of its first call (at create, resume, in a warm pool) waits for that call."""

    def __init__(
        self,
        engine: DockerEngine,
        *,
        pids_limit: int = 1024,
        output_limit: int = 16 * 1024 * 1024,
        owner: str | None = None,
        agent_image: str = DEFAULT_AGENT_IMAGE,
        agent_runtime_dir: Path = DEFAULT_AGENT_RUNTIME_DIR,
        snapshot_dir: Path = DEFAULT_SNAPSHOT_DIR,
    ) -> None:
        self.engine = engine
        self.egress = EgressController()
        self.egress_always_deny: tuple[str, ...] = ()
        """CIDR blocks (and ``bridge``) every networked workspace is denied (``CORRAL_EGRESS_ALWAYS_DENY``)."""
        self._egress_policies: dict[str, EgressPolicy] = {}  # workspace id -> rules to put in force at each start
        self._networks: dict[str, NetworkMode] = {}  # workspace id -> its network mode, once this process knows it
        self.snapshot_dir = snapshot_dir
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
        self._layer_sizes: dict[str, tuple[float, int]] = {}  # workspace -> (monotonic time, writable layer bytes)
        self._settling: set[str] = set()  # checkpointed; dockerd may not have handled the exit yet (see _settle)
        self._containers: dict[str, str] = {}  # workspace id -> the id of the container started for it last
        self._generations: dict[str, int] = {}  # workspace id -> how many starts this process made for it
        self._started_ns: dict[str, int] = {}  # workspace id -> when this process last started its container
        self._agent_execs: dict[str, str] = {}  # workspace id -> the exec id of its agent
        self._agent_used: dict[str, float] = {}  # workspace id -> monotonic time of its agent's last call
        self._idle_task: asyncio.Task[None] | None = None
        self._idle_closed: set[str] = set()  # workspaces whose agent stream was closed for idleness
        self._docker_root: Path | None = None
        self._warmup_slots = asyncio.Semaphore(WARMUP_CONCURRENCY)

    # --- what differs between runc and runsc -------------------------------------------------------------------

    def runtime_for(self, network: NetworkMode) -> str:
        """The dockerd runtime for a workspace with this network mode."""
        del network
        return "runc"

    def keeps_memory(self, network: NetworkMode) -> bool:
        """Whether pause and snapshot keep processes and memory for a workspace with this network mode."""
        del network
        return self.memory_checkpoints

    async def _network_of(self, workspace_id: str) -> NetworkMode:
        network = self._networks.get(workspace_id)
        if network is None:
            volume = await self._call(self.engine.inspect_volume(volume_name(workspace_id)))
            label = ((volume or {}).get("Labels") or {}).get(LABEL_SPEC)
            network = _spec_from_json(workspace_id, label).network if label else "isolated"
            self._networks[workspace_id] = network
        return network

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
        self._warm_up(spec.id)

    def _warm_up(self, workspace_id: str) -> None:
        """Start the agent in the background, so the first exec usually finds it ready."""
        task = asyncio.create_task(self._connect_quietly(workspace_id), name=f"agent-warmup-{workspace_id}")
        self._warmups[workspace_id] = task
        task.add_done_callback(lambda _: self._warmups.pop(workspace_id, None))

    def known_dead(self, workspace_id: str) -> bool:
        """True when the event stream saw the container die since it was started (see :class:`DeathWatcher`)."""
        return workspace_id in self._dead

    async def _start_container(self, spec: WorkspaceSpec) -> None:
        self._networks[spec.id] = spec.network
        self._dead.discard(spec.id)
        self._expected_exits.discard(spec.id)
        self._ensure_event_watch()
        config = self._container_config(spec, await self.agent_runtime.ensure())
        name = container_name(spec.id)
        try:
            self._containers[spec.id] = await self.engine.create_container(name, config)
            await self._start(spec.id)
        except DockerAPIError as exc:
            with contextlib.suppress(Exception):
                await self.engine.remove_container(name)
            raise self._translate(exc, spec.id, image=spec.image) from exc

    async def _start(self, workspace_id: str, checkpoint: str | None = None) -> None:
        """Start (or restore) the workspace's container, and put its egress rules in force before anything else runs
        a command there. A workspace whose rules cannot be applied does not stay running."""
        await self._start_container_process(workspace_id, checkpoint)
        if workspace_id in self._egress_policies or (
            self.egress_always_deny and await self._network_of(workspace_id) == "default"
        ):
            try:
                await self._apply_egress(workspace_id)
            except BaseException:
                self._expected_exits.add(workspace_id)
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._call(self.engine.stop_container(container_name(workspace_id))))
                raise

    async def _start_container_process(self, workspace_id: str, checkpoint: str | None) -> None:
        """Start (or restore) the workspace's container, and note when: older die events are no news."""
        self._dead.discard(workspace_id)
        self._expected_exits.discard(workspace_id)
        self._ensure_event_watch()
        self._generations[workspace_id] = self._generations.get(workspace_id, 0) + 1
        self._started_ns[workspace_id] = time.time_ns()
        if checkpoint is None:
            await self.engine.start_container(container_name(workspace_id))
            return
        # One restore at a time: dockerd uploads each checkpoint into containerd's content store, keyed by digest,
        # and two uploads of the same content at once (a fork; or another server on this engine) collide there
        # ("commit failed: content sha256:...: already exists"). The collision is transient: try again shortly.
        async with _restore_lock():
            for attempt in range(6):
                try:
                    await self.engine.start_container(container_name(workspace_id), checkpoint=checkpoint)
                except DockerAPIError as exc:
                    if "already exists" not in exc.message or attempt == 5:
                        raise
                    log.info("workspace %s: restore collided in containerd (%s); retrying", workspace_id, exc)
                    await asyncio.sleep(0.02 * 2**attempt)  # 20 ms, 40 ms... (moby/moby#42900)
                else:
                    return

    def _container_config(self, spec: WorkspaceSpec, agent_runtime: str) -> dict[str, Any]:
        limits = spec.limits
        return {
            "Image": spec.image,
            # The spawner is the main process: commands are its children, so gVisor restores them after a
            # checkpoint (it drops everything `docker exec` started).
            "Cmd": SPAWNER_COMMAND,
            "WorkingDir": WORKSPACE_ROOT,
            "Hostname": hostname(spec.id),
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
        return {LABEL_ID: workspace_id, **self._owner_labels()}

    async def destroy(self, workspace_id: str) -> None:
        """Remove container (its checkpoints with it) and volume. Idempotent."""
        await self._drop_agent(workspace_id)
        self._forget_gate(workspace_id)
        self._egress_policies.pop(workspace_id, None)
        self._networks.pop(workspace_id, None)
        await self.egress.release(workspace_id)
        await self._remove_all(workspace_id)

    async def _remove_all(self, workspace_id: str) -> None:
        self._expected_exits.add(workspace_id)
        self._settling.discard(workspace_id)  # removed whatever state dockerd has it in
        self._layer_sizes.pop(workspace_id, None)
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        await self._call(self.engine.remove_container(container_name(workspace_id)))
        await self._call(self.engine.remove_volume(volume_name(workspace_id)))
        if info is not None:
            await self._collect_snapshot_image(info.get("Image", ""))

    async def _collect_snapshot_image(self, image_id: str) -> None:
        """Remove a snapshot image whose snapshot was deleted (untagged) once its last workspace is gone."""
        image = await self._call(self.engine.inspect_image(image_id)) if image_id else None
        if image is None or LABEL_SNAPSHOT not in ((image.get("Config") or {}).get("Labels") or {}):
            return
        if not image.get("RepoTags"):
            with contextlib.suppress(DockerAPIError):  # another workspace restored from it still runs
                await self.engine.remove_image(image_id)

    async def stop(self, workspace_id: str) -> None:
        """Stop the container and keep it: processes end, CPU and memory are freed, the whole disk stays. A paused
        workspace's memory is discarded."""
        await self._settle(workspace_id)
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is None:
            if await self._call(self.engine.inspect_volume(volume_name(workspace_id))) is None:
                raise WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
            return  # stopped before full-disk stop existed: only the volume is left
        await self._drop_agent(workspace_id)
        self._expected_exits.add(workspace_id)
        await self._call(self.engine.stop_container(container_name(workspace_id)))
        await self.egress.release(workspace_id)  # its namespace went with the container; the rules stay kept
        if self.memory_checkpoints:
            await self._call(self.engine.remove_checkpoint(container_name(workspace_id), PAUSE_CHECKPOINT))

    async def resume(self, workspace_id: str) -> None:
        """Start the stopped container again (its whole disk is there), restoring processes and memory when it was
        paused. A running workspace is left as it is."""
        await self._settle(workspace_id)
        volume = await self._call(self.engine.inspect_volume(volume_name(workspace_id)))
        if volume is None:
            raise WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is not None and info["State"].get("Running"):
            return
        await self.check_runtime()
        if info is None:  # only the volume is left (stopped by an older Corral): a new container on it
            spec = _spec_from_json(workspace_id, (volume.get("Labels") or {}).get(LABEL_SPEC, "{}"))
            await self._start_container(spec)
            return
        self._containers[workspace_id] = info["Id"]
        name = container_name(workspace_id)
        if await self._paused(workspace_id):
            try:
                await self._start(workspace_id, checkpoint=PAUSE_CHECKPOINT)
            except DockerAPIError as exc:
                # The memory image cannot be restored (a runtime upgrade, a damaged file): the disk is intact, so
                # start cold rather than leave the workspace unusable, and say so in the log.
                log.warning(
                    "workspace %s: restoring its paused memory failed (%s); starting it cold", workspace_id, exc
                )
                await self._call(self._start(workspace_id))
            finally:
                with contextlib.suppress(DockerAPIError):
                    await self.engine.remove_checkpoint(name, PAUSE_CHECKPOINT)
            self._warm_up(workspace_id)
            return
        await self._call(self._start(workspace_id))
        self._warm_up(workspace_id)

    async def _paused(self, workspace_id: str) -> bool:
        if not self.memory_checkpoints:
            return False
        with contextlib.suppress(DockerAPIError):
            return PAUSE_CHECKPOINT in await self.engine.list_checkpoints(container_name(workspace_id))
        return False

    async def state(self, workspace_id: str) -> WorkspaceState:
        """Running when the container runs; paused when it holds a pause checkpoint; stopped when it (or only the
        volume) is left; else missing."""
        await self._settle(workspace_id)
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is not None and info["State"].get("Running"):
            return WorkspaceState.RUNNING
        if info is not None:
            return WorkspaceState.PAUSED if await self._paused(workspace_id) else WorkspaceState.STOPPED
        if await self._call(self.engine.inspect_volume(volume_name(workspace_id))) is not None:
            return WorkspaceState.STOPPED
        return WorkspaceState.MISSING

    # --- pause, snapshots, forks ---------------------------------------------------------------------------------

    async def pause(self, workspace_id: str) -> Literal["memory", "filesystem"]:
        """Under gVisor: checkpoint processes, memory and open files into the container and stop it ("memory").
        Under runc: a stop, keeping the whole disk ("filesystem"). Commands in flight end; background processes
        (``nohup``, ``setsid``) are part of the memory image."""
        if not self.memory_checkpoints or not self.keeps_memory(await self._network_of(workspace_id)):
            await self.stop(workspace_id)  # raises WorkspaceNotFoundError for a missing workspace
            return "filesystem"
        await self._settle(workspace_id)
        try:
            await self._checkpoint(workspace_id, PAUSE_CHECKPOINT)
        except ProviderUnavailableError:
            # Asked only now, so a pause costs the checkpoint and nothing before it: why did it fail?
            info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
            if info is None:
                await self._require_running(workspace_id)  # raises: missing, or stopped by an older Corral
                raise WorkspaceNotFoundError(
                    f"workspace {workspace_id} does not exist", details={"id": workspace_id}
                ) from None
            if info["State"].get("Running"):
                raise
            if await self._paused(workspace_id):
                return "memory"
            raise WorkspaceStateError(
                f"workspace {workspace_id} is stopped; only a running workspace can be paused",
                details={"id": workspace_id},
            ) from None
        await self.egress.release(workspace_id)  # its namespace went with the container; the rules stay kept
        return "memory"

    async def _checkpoint(self, workspace_id: str, name: str) -> None:
        """Checkpoint and stop the container. The agent goes first: gVisor cannot restore a process holding file
        descriptors donated by ``docker exec`` (the agent's stdio), and a new agent connects after the restore."""
        await self._quiesce(workspace_id)
        self._expected_exits.add(workspace_id)
        try:
            await self.engine.create_checkpoint(container_name(workspace_id), name, exit=True)
        except DockerAPIError as exc:
            self._expected_exits.discard(workspace_id)
            raise ProviderUnavailableError(self.name, f"checkpoint of workspace {workspace_id} failed: {exc}") from exc
        # dockerd answers before it has handled the container's exit (for up to ~0.3 s inspect blocks or says Running,
        # and a start from the checkpoint would fail): the next call on this workspace waits for it (_settle), as the
        # next `docker` command after a `docker checkpoint create` does. A pause answers when the checkpoint is done.
        self._settling.add(workspace_id)

    async def _settle(self, workspace_id: str) -> None:
        """Wait until dockerd has handled the exit of a container checkpointed by :meth:`_checkpoint`."""
        if workspace_id not in self._settling:
            return
        deadline = time.monotonic() + 10.0
        while (info := await self._call(self.engine.inspect_container(container_name(workspace_id)))) is not None:
            if not info["State"].get("Running"):
                break
            if time.monotonic() > deadline:
                self._settling.discard(workspace_id)  # said once; later calls see the container as dockerd does
                raise ProviderUnavailableError(self.name, f"workspace {workspace_id} still ran 10 s after checkpoint")
            await asyncio.sleep(0.01)
        self._settling.discard(workspace_id)

    async def _quiesce(self, workspace_id: str) -> None:
        """Close the agent's stream and wait until its process has ended (it ends its commands as it goes)."""
        exec_id = self._agent_execs.pop(workspace_id, "")
        await self._drop_agent(workspace_id)
        deadline = time.monotonic() + 10.0
        while exec_id and time.monotonic() < deadline:
            if not await self._call(self.engine.exec_running(exec_id)):
                return
            await asyncio.sleep(0.01)
        if exec_id:
            raise ProviderUnavailableError(self.name, f"the agent of workspace {workspace_id} did not exit in 10 s")

    async def snapshot(self, workspace_id: str, snapshot_id: str) -> SnapshotInfo:
        """Capture the workspace under ``snapshot_id``: its root filesystem as an image (``docker commit``), a copy
        of its volume, and under gVisor a checkpoint of its processes and memory, kept in ``snapshot_dir``.

        Under gVisor the workspace is checkpointed and stopped, copied while still, and restored from that very
        checkpoint: it is held for checkpoint + copy + restore, and its processes carry on. Under runc it is frozen
        (``docker pause``) while the image and the volume are copied.
        """
        await self._settle(workspace_id)
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is None or not info["State"].get("Running"):
            await self._require_running(workspace_id)
            raise WorkspaceStateError(
                f"workspace {workspace_id} is not running; resume it before taking a snapshot",
                details={"id": workspace_id},
            )
        volume = await self._call(self.engine.inspect_volume(volume_name(workspace_id)))
        spec = _spec_from_json(workspace_id, ((volume or {}).get("Labels") or {}).get(LABEL_SPEC, "{}"))
        name, checkpoint = container_name(workspace_id), f"corral-snap-{snapshot_id}"
        target = self.snapshot_dir / snapshot_id
        labels = {**self._owner_labels(), LABEL_SNAPSHOT: snapshot_id, LABEL_SPEC: _spec_json(spec)}
        _check_snapshot_id(snapshot_id)
        memory = self.keeps_memory(spec.network)
        try:
            self.snapshot_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.snapshot_dir.chmod(0o700)  # memory images inside: no other user of the host reads them
            target.mkdir(mode=0o700, exist_ok=False)
            if memory:
                await self._checkpoint(workspace_id, checkpoint)
                await self._settle(workspace_id)  # copied while still
                try:
                    await self._copy_out(workspace_id, snapshot_id, volume, labels)
                    source = await self._checkpoint_path(info["Id"], checkpoint)
                    await asyncio.to_thread(link_tree, source, target / "checkpoint")
                finally:
                    # Carry on from the checkpoint just taken (the snapshot keeps its own links to it).
                    try:
                        await self._start(workspace_id, checkpoint=checkpoint)
                    except DockerAPIError:
                        log.warning("workspace %s: restore after snapshot failed; starting it cold", workspace_id)
                        await self._call(self._start(workspace_id))
                    await self._call(self.engine.remove_checkpoint(name, checkpoint))
                    self._warm_up(workspace_id)
            else:
                await self._call(self.engine.request("POST", f"/containers/{name}/pause"))
                try:
                    await self._copy_out(workspace_id, snapshot_id, volume, labels)
                finally:
                    await self._call(self.engine.request("POST", f"/containers/{name}/unpause"))
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.delete_snapshot(snapshot_id))
            if isinstance(exc, OSError):  # copying on the host failed (disk full, a file vanished)
                raise ProviderUnavailableError(
                    self.name, f"snapshot of workspace {workspace_id} failed: {exc}"
                ) from exc
            raise
        kind: Literal["memory", "filesystem"] = "memory" if memory else "filesystem"
        return SnapshotInfo(kind, await self._snapshot_size(snapshot_id, spec.image))

    async def set_egress(self, workspace_id: str, policy: EgressPolicy | None) -> None:
        """See :class:`~corral.providers.base.EgressControl`: rules in the container's network namespace, kept for
        every later start."""
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is None:
            raise WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        if (info.get("HostConfig") or {}).get("NetworkMode") == "none":
            raise InvalidRequestError(
                f"workspace {workspace_id} has no network (isolated): egress rules apply to networked workspaces",
                details={"id": workspace_id, "field": "network"},
            )
        if policy is None or policy.empty:
            self._egress_policies.pop(workspace_id, None)
            if info["State"].get("Running"):
                await self._apply_egress(workspace_id, EgressPolicy(), info)  # what is always denied stays
            return
        if info["State"].get("Running"):
            try:
                await self._apply_egress(workspace_id, policy, info)
            except BaseException:
                # The namespace may hold half of the new rules: stop the workspace rather than let it run on
                # under rules nobody asked for. Its old rules stay kept for its next start.
                self._expected_exits.add(workspace_id)
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._call(self.engine.stop_container(container_name(workspace_id))))
                raise
        self._egress_policies[workspace_id] = policy

    async def _apply_egress(
        self, workspace_id: str, policy: EgressPolicy | None = None, info: dict[str, Any] | None = None
    ) -> None:
        policy = policy if policy is not None else self._egress_policies.get(workspace_id, EgressPolicy())
        if info is None:
            info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        pid = int(((info or {}).get("State") or {}).get("Pid") or 0)
        if not pid:
            raise WorkspaceStateError(f"workspace {workspace_id} is not running", details={"id": workspace_id})
        # The nameservers Docker gave the container, worked out from the host's resolv.conf as dockerd does: the
        # container's own copy is writable from inside, so it must not say which servers the filter lets through.
        nameservers = await asyncio.to_thread(docker_nameservers)
        try:
            await self.egress.apply(
                workspace_id, pid, policy, nameservers, always_denied(self.egress_always_deny, info or {})
            )
        except OSError as exc:
            log.warning("workspace %s: egress rules could not be put in force: %s", workspace_id, exc)
            raise ProviderUnavailableError(
                self.name, f"egress rules for workspace {workspace_id} could not be put in force (see the server log)"
            ) from exc

    async def resource_usage(self, workspace_id: str) -> ResourceUsage:
        """CPU time and memory now, from the engine's one-shot stats (the cgroup's counters, as ``docker stats``), and
        the size of the container's writable layer."""
        name = container_name(workspace_id)
        try:
            stats = await self.engine.container_stats(name)
            # The layer's size is a walk of the container's files on the host (inspect ?size=true), and the workspace
            # decides how many there are: measured at most every 20 s per workspace, the last value in between.
            measured_at, layer = self._layer_sizes.get(workspace_id, (-LAYER_SIZE_MAX_AGE_S, 0))
            if time.monotonic() - measured_at >= LAYER_SIZE_MAX_AGE_S:
                layer = await self.engine.container_size(name)
                self._layer_sizes[workspace_id] = (time.monotonic(), layer)
            return dataclasses.replace(usage_from_stats(stats), layer_bytes=layer)
        except DockerAPIError as exc:
            raise self._translate(exc, workspace_id) from exc
        except NotRunning as exc:
            raise WorkspaceStateError(f"workspace {workspace_id}: {exc}", details={"id": workspace_id}) from exc

    async def port_address(self, workspace_id: str, port: int) -> tuple[str, int]:
        """See :class:`~corral.providers.base.PortDialer`: the container's address on its bridge network."""
        info = await self._call(self.engine.inspect_container(container_name(workspace_id)))
        if info is None or not info["State"].get("Running"):
            raise WorkspaceStateError(f"workspace {workspace_id} is not running", details={"id": workspace_id})
        networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
        for network in networks.values():
            address = (network or {}).get("IPAddress")
            if address:
                return str(address), port
        raise InvalidRequestError(
            f"workspace {workspace_id} has no network address (network isolated)", details={"id": workspace_id}
        )

    async def disk_usage(self, workspace_id: str) -> int:
        """Bytes used under /workspace. A background check (the disk watcher's, the metrics') does not start an agent
        closed for idleness again: the volume is then counted on the host, as :meth:`snapshot_estimate` counts it."""
        if workspace_id in self._idle_closed and workspace_id not in self._agents:
            await self._require_running(workspace_id)
            volume = await self._call(self.engine.inspect_volume(volume_name(workspace_id)))
            if volume:
                return await asyncio.to_thread(tree_size, Path(volume["Mountpoint"]))
        return await super().disk_usage(workspace_id)

    async def snapshot_estimate(self, workspace_id: str) -> int:
        """What a snapshot would hold, measured before it is taken: the writable layer as ``docker commit`` writes it
        (sparse files in full), the volume's allocated bytes, and under gVisor the memory the workspace uses now."""
        layer = await self._call(self.engine.container_size(container_name(workspace_id)))
        volume = await self._call(self.engine.inspect_volume(volume_name(workspace_id)))
        volume_bytes = await asyncio.to_thread(tree_size, Path(volume["Mountpoint"])) if volume else 0
        memory = 0
        if self.memory_checkpoints:
            with contextlib.suppress(DockerAPIError, KeyError, TypeError):
                stats = await self.engine.container_stats(container_name(workspace_id))
                memory = int(stats["memory_stats"]["usage"])
        return int(layer) + volume_bytes + memory

    async def _copy_out(
        self, workspace_id: str, snapshot_id: str, volume: dict[str, Any] | None, labels: dict[str, str]
    ) -> None:
        """The image and the volume copy of a snapshot, from the (still) source container."""
        await self._call(self.engine.commit(container_name(workspace_id), SNAPSHOT_REPO, snapshot_id, labels=labels))
        await self._call(self.engine.create_volume(snapshot_volume(snapshot_id), labels))
        copy = await self._call(self.engine.inspect_volume(snapshot_volume(snapshot_id)))
        await copy_tree(Path((volume or {})["Mountpoint"]), Path(copy["Mountpoint"]))

    async def _snapshot_size(self, snapshot_id: str, base_image: str) -> int:
        image = await self._call(self.engine.inspect_image(snapshot_image(snapshot_id))) or {}
        base = await self._call(self.engine.inspect_image(base_image)) if base_image else None
        layer = max(0, int(image.get("Size") or 0) - int((base or {}).get("Size") or 0))
        copy = await self._call(self.engine.inspect_volume(snapshot_volume(snapshot_id)))
        volume_bytes = await asyncio.to_thread(tree_size, Path(copy["Mountpoint"])) if copy else 0
        memory = await asyncio.to_thread(tree_size, self.snapshot_dir / snapshot_id)
        return layer + volume_bytes + memory

    async def restore(self, spec: WorkspaceSpec, snapshot_id: str) -> None:
        """Create workspace ``spec.id`` from a snapshot: a container of the snapshot's image on a copy of its
        volume, started from its checkpoint when it has one (processes and memory carry on), with its own
        hostname."""
        _check_snapshot_id(snapshot_id)
        image = await self._call(self.engine.inspect_image(snapshot_image(snapshot_id)))
        copy = await self._call(self.engine.inspect_volume(snapshot_volume(snapshot_id)))
        if image is None or copy is None:
            raise SnapshotNotFoundError(
                f"snapshot {snapshot_id} has nothing left on this host", details={"id": snapshot_id}
            )
        await self.check_runtime()
        spec = dataclasses.replace(spec, image=snapshot_image(snapshot_id))
        self._networks[spec.id] = spec.network
        labels = self._labels(spec.id)
        checkpoint = self.snapshot_dir / snapshot_id / "checkpoint"
        name = f"corral-snap-{snapshot_id}"
        try:
            await self._call(self.engine.create_volume(volume_name(spec.id), {**labels, LABEL_SPEC: _spec_json(spec)}))
            target = await self._call(self.engine.inspect_volume(volume_name(spec.id)))
            await copy_tree(Path(copy["Mountpoint"]), Path(target["Mountpoint"]))
            config = self._container_config(spec, await self.agent_runtime.ensure())
            try:
                self._containers[spec.id] = await self.engine.create_container(container_name(spec.id), config)
                if self.memory_checkpoints and checkpoint.is_dir():
                    path = await self._checkpoint_path(self._containers[spec.id], name)
                    await asyncio.to_thread(link_tree, checkpoint, path)
                    await self._start(spec.id, checkpoint=name)
                    await self.engine.remove_checkpoint(container_name(spec.id), name)
                    # The kernel's hostname is part of the memory image: give the fork its own.
                    await self.engine.exec_privileged(
                        container_name(spec.id), [*AGENT_COMMAND[:-1], "-c", _SET_HOSTNAME, hostname(spec.id)]
                    )
                else:
                    await self._start(spec.id)
                self._warm_up(spec.id)
            except DockerAPIError as exc:
                raise self._translate(exc, spec.id) from exc
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._remove_all(spec.id))
            if isinstance(exc, OSError):  # the snapshot's files went away meanwhile, or the disk is full
                raise ProviderUnavailableError(self.name, f"restore from snapshot {snapshot_id} failed: {exc}") from exc
            raise

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove the snapshot's image tag, volume copy and checkpoint. Idempotent. Workspaces restored from it keep
        running: the image's layers go with the last of them (see ``_collect_snapshot_image``)."""
        _check_snapshot_id(snapshot_id)
        await self._call(self.engine.remove_image(snapshot_image(snapshot_id), force=True))
        await self._call(self.engine.remove_volume(snapshot_volume(snapshot_id)))
        await asyncio.to_thread(shutil.rmtree, self.snapshot_dir / snapshot_id, True)

    async def list_snapshots(self) -> list[str]:
        """Ids of the snapshots with an image or a volume of this provider (and owner)."""
        labels = [LABEL_SNAPSHOT, *self._owner_filter()]
        images = await self._call(self.engine.list_images(labels))
        volumes = await self._call(self.engine.list_volumes(labels))
        ids = {
            tag.split(":", 1)[1]
            for image in images
            for tag in image.get("RepoTags") or ()
            if tag.startswith(f"{SNAPSHOT_REPO}:")
        }
        ids |= {v["Labels"][LABEL_SNAPSHOT] for v in volumes if LABEL_SNAPSHOT in (v.get("Labels") or {})}
        return sorted(ids)

    async def _checkpoint_path(self, container_id: str, name: str) -> Path:
        """Where dockerd keeps a container's checkpoint (Docker 20.10 takes no custom directory on start)."""
        if self._docker_root is None:
            info = await self._call(self.engine.info())
            self._docker_root = Path(info.get("DockerRootDir") or "/var/lib/docker")
        return self._docker_root / "containers" / container_id / "checkpoints" / name

    def _owner_filter(self) -> list[str]:
        """:meth:`_owner_labels` as Docker's ``label`` filter (``key=value`` each)."""
        return [f"{k}={v}" for k, v in self._owner_labels().items()]

    def _owner_labels(self) -> dict[str, str]:
        labels = {LABEL_PROVIDER: self.name}
        if self.owner is not None:
            labels[LABEL_OWNER] = self.owner
        return labels

    async def list_workspaces(self) -> list[str]:
        """Ids of every workspace with a volume or a container of this provider (and this owner, if set)."""
        labels = self._owner_filter()
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
                await self._connect(workspace_id)

    async def _agent(self, workspace_id: str) -> GuestConnection:
        conn = await self._connect(workspace_id)
        if self.agent_idle_close_s > 0:
            self._agent_used[workspace_id] = time.monotonic()
            if self._idle_task is None or self._idle_task.done():
                self._idle_task = asyncio.create_task(self._close_idle_agents(), name=f"{self.name}-agent-idle")
        return conn

    async def _close_idle_agents(self) -> None:
        """Close the streams of agents that have served a call and then none for :attr:`agent_idle_close_s`; a
        request still open (a running command, a terminal, a watch, a tunnel) counts as a call until it ends."""
        while self._agent_used:
            await asyncio.sleep(max(self.agent_idle_close_s / 4, 0.05))
            now = time.monotonic()
            for workspace_id, used in list(self._agent_used.items()):
                conn = self._agents.get(workspace_id)
                if conn is None or conn.closed:
                    self._agent_used.pop(workspace_id, None)
                elif conn.in_flight:
                    self._agent_used[workspace_id] = now
                elif now - used >= self.agent_idle_close_s:
                    async with self._agent_locks.setdefault(workspace_id, asyncio.Lock()):
                        if self._agents.get(workspace_id) is not conn or self._agent_used.get(workspace_id) != used:
                            continue  # reconnected, or called meanwhile
                        del self._agents[workspace_id]
                        del self._agent_used[workspace_id]
                        self._idle_closed.add(workspace_id)
                    log.debug("workspace %s: agent idle for %g s; closing its stream", workspace_id, now - used)
                    await conn.aclose()

    async def _connect(self, workspace_id: str) -> GuestConnection:
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
                    _agent_command(info),
                    env=[
                        *agent_environment(info["Config"].get("Env") or []),
                        *(
                            [f"CORRAL_SPAWNER_SOCKET={SPAWNER_SOCKET}"]
                            if _runs_a_spawner(info["Config"].get("Cmd") or [])
                            else []
                        ),
                    ],
                    working_dir=RUNTIME_MOUNT,  # nothing of the agent's is read from a directory the workspace owns
                    on_stderr=_AgentLog(workspace_id),
                )
            except DockerAPIError as exc:
                raise self._translate(exc, workspace_id) from exc
            self._agent_execs[workspace_id] = stream.exec_id
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
            self._idle_closed.discard(workspace_id)
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
        labels = self._owner_filter()
        filters = {"type": ["container"], "event": ["die", "destroy"], "label": labels}
        while True:
            try:
                async for event in self.engine.events(filters):
                    attributes = event.get("Actor", {}).get("Attributes") or {}
                    workspace_id = attributes.get(LABEL_ID)
                    if not workspace_id or not self._current(workspace_id, event.get("Actor", {}).get("ID")):
                        continue  # an older container of the workspace (replaced by a resume) is no news
                    if int(event.get("timeNano") or 0) < self._started_ns.get(workspace_id, 0):
                        continue  # the end of an earlier run of this container (a stop before the resume)
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
        self._agent_used.pop(workspace_id, None)
        self._idle_closed.discard(workspace_id)
        if conn is not None:
            await conn.aclose()

    async def _require_running(self, workspace_id: str) -> None:
        state = await self.state(workspace_id)
        if state is WorkspaceState.MISSING:
            raise WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        if state in (WorkspaceState.STOPPED, WorkspaceState.PAUSED):
            raise WorkspaceStateError(
                f"workspace {workspace_id} is {state}; resume it first", details={"id": workspace_id}
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
            persistence="full",
            snapshots="memory" if self.memory_checkpoints else "filesystem",
            pause="memory" if self.memory_checkpoints else "filesystem",
            pty=True,
            dir_watch=True,
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
        await self.egress.aclose()
        for task in (self._events_task, self._idle_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
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


_SET_HOSTNAME = "import socket, sys; socket.sethostname(sys.argv[1])"
_SNAPSHOT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def _check_snapshot_id(snapshot_id: str) -> None:
    """Snapshot ids name host paths, images and volumes: letters, digits, '-' and '_' only."""
    if not _SNAPSHOT_ID.fullmatch(snapshot_id):
        raise InvalidRequestError(
            f"snapshot id {snapshot_id!r} is not allowed: use 1-64 letters, digits, '-' or '_'",
            details={"id": snapshot_id},
        )


def hostname(workspace_id: str) -> str:
    """A workspace's hostname: its own, so forks and their source can tell each other apart."""
    return f"ws-{workspace_id[:16]}"


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


def _runs_a_spawner(cmd: list[str]) -> bool:
    """Whether a container's main process is a spawner: this version's, or the ``agent.py --spawner`` of containers
    made before it (their read-only runtime holds the matching agent)."""
    return cmd == SPAWNER_COMMAND or "--spawner" in cmd


def _agent_command(info: dict[str, Any]) -> list[str]:
    """How to start the agent in this container: from its bytecode, or from ``agent.py`` where the container mounts
    the runtime of a Corral from before agent.pyc (its container keeps that runtime for its life)."""
    runtime = next((m.get("Source", "") for m in info.get("Mounts") or [] if m.get("Destination") == RUNTIME_MOUNT), "")
    if not runtime or os.path.exists(os.path.join(runtime, "agent.pyc")):
        return AGENT_COMMAND
    return [*AGENT_COMMAND[:-1], f"{RUNTIME_MOUNT}/agent.py"]
