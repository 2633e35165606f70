"""The plain alternative: the same containers driven straight through the Docker Engine API, no Corral in between.

It uses Corral's own :class:`~corral.providers._docker_engine.DockerEngine` (httpx over the Unix socket), so both
sides talk to dockerd the same way, and the hardening of Corral's containers (capabilities, no-new-privileges, pids,
CPU and memory limits, init, no network, no logging) taken from the provider itself, so the comparison stays fair
when those flags change. What the plain side leaves out is what Corral adds: the database, the workspace volume
(except where a file test needs ``/workspace``), the guest agent, the API.
"""

from __future__ import annotations

import io
import tarfile
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from corral.providers._docker_engine import API_VERSION, DockerEngine
from corral.providers.base import WORKSPACE_ROOT, WorkspaceSpec
from corral.providers.docker import DockerProvider

__all__ = ["BENCH_LABEL", "PlainContainer", "PlainDocker", "tar_one_file"]

BENCH_LABEL = "corral.bench.run"
"""Every plain container and volume carries ``corral.bench.run=<run id>``, so a final sweep finds them all."""


@dataclass(frozen=True, slots=True)
class PlainContainer:
    """A container started by :meth:`PlainDocker.run`."""

    id: str
    name: str
    volume: str | None


def tar_one_file(name: str, data: bytes) -> bytes:
    """A tar archive holding one file: the body ``PUT /containers/{id}/archive`` takes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class PlainDocker:
    """``docker run -d``, ``docker exec``, ``docker cp`` and ``docker stats``, as Docker Engine API calls."""

    def __init__(self, socket_path: str, *, image: str, run_id: str) -> None:
        self.engine = DockerEngine(socket_path)
        # Archive up- and downloads carry raw bytes, which DockerEngine's JSON calls do not; same transport though.
        self._raw = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=socket_path),
            base_url=f"http://docker/{API_VERSION}",
            timeout=httpx.Timeout(120.0, connect=5.0),
        )
        self.image = image
        self.run_id = run_id
        template = DockerProvider(self.engine)._container_config(
            WorkspaceSpec(id="template", image=image),
            agent_runtime="",  # its mount is dropped below
        )
        self._host_config: dict[str, Any] = {
            k: v for k, v in template["HostConfig"].items() if k not in ("Runtime", "Mounts")
        }
        self._count = 0

    async def aclose(self) -> None:
        """Close both clients (containers are removed by :meth:`remove` or the final sweep)."""
        await self._raw.aclose()
        await self.engine.aclose()

    def _labels(self) -> dict[str, str]:
        return {BENCH_LABEL: self.run_id}

    async def run(
        self, runtime: str, *, volume: bool = False, cmd: list[str] | None = None, image: str | None = None
    ) -> PlainContainer:
        """``docker run -d --runtime=RUNTIME --network=none [-v VOL:/workspace] IMAGE sleep infinity``: create and
        start; returns once the container is running. With ``volume`` a named volume is created first; ``cmd`` and
        ``image`` replace ``sleep infinity`` and the bench's image."""
        container = await self.create(runtime, volume=volume, cmd=cmd, image=image)
        try:
            await self.engine.start_container(container.id)
        except BaseException:
            await self.remove(container)
            raise
        return container

    async def create(
        self, runtime: str, *, volume: bool = False, cmd: list[str] | None = None, image: str | None = None
    ) -> PlainContainer:
        """``docker create``: the container :meth:`run` starts, not started (a restore starts it from a
        checkpoint)."""
        self._count += 1
        name = f"corral-bench-{self.run_id}-{self._count}-{uuid.uuid4().hex[:6]}"
        volume_name = f"{name}-vol" if volume else None
        if volume_name is not None:
            await self.engine.create_volume(volume_name, self._labels())
        mounts = [{"Type": "volume", "Source": volume_name, "Target": WORKSPACE_ROOT}] if volume_name else []
        config = {
            "Image": image or self.image,
            "Cmd": cmd or ["sleep", "infinity"],
            "WorkingDir": WORKSPACE_ROOT,
            "Labels": self._labels(),
            "NetworkDisabled": True,
            "HostConfig": {**self._host_config, "Runtime": runtime, "Mounts": mounts},
        }
        try:
            container_id = await self.engine.create_container(name, config)
        except BaseException:
            await self.remove(PlainContainer(name, name, volume_name))
            raise
        return PlainContainer(container_id, name, volume_name)

    async def exec_true(self, container: PlainContainer) -> None:
        """``docker exec CONTAINER true``: exec create, start (attached, until it ends), inspect for the exit code."""
        code = await self.exec(container, ["true"])
        if code != 0:
            raise RuntimeError(f"docker exec true exited with {code}")

    async def exec(self, container: PlainContainer, cmd: list[str]) -> int:
        """``docker exec CONTAINER CMD...``; returns the exit code (the output is read and dropped)."""
        created = await self.engine.request(
            "POST",
            f"/containers/{container.id}/exec",
            body={"Cmd": cmd, "AttachStdout": True, "AttachStderr": True, "Tty": False},
        )
        exec_id = created["Id"]
        await self.engine.request("POST", f"/exec/{exec_id}/start", body={"Detach": False, "Tty": False})
        inspected = await self.engine.request("GET", f"/exec/{exec_id}/json")
        return int(inspected["ExitCode"])

    async def copy_in(self, container: PlainContainer, directory: str, archive: bytes) -> None:
        """``docker cp FILE CONTAINER:DIR``: ``PUT /containers/{id}/archive`` with a prepared tar."""
        resp = await self._raw.put(
            f"/containers/{container.id}/archive",
            params={"path": directory},
            content=archive,
            headers={"Content-Type": "application/x-tar"},
        )
        resp.raise_for_status()

    async def copy_out(self, container: PlainContainer, path: str) -> bytes:
        """``docker cp CONTAINER:PATH -``: ``GET /containers/{id}/archive``, then the file taken out of the tar."""
        resp = await self._raw.get(f"/containers/{container.id}/archive", params={"path": path})
        resp.raise_for_status()
        with tarfile.open(fileobj=io.BytesIO(resp.content)) as archive:
            member = archive.next()
            extracted = archive.extractfile(member) if member is not None else None
            if extracted is None:
                raise RuntimeError(f"docker cp of {path}: the archive holds no file")
            return extracted.read()

    async def memory_usage(self, container: PlainContainer | str) -> int:
        """What ``docker stats`` shows as MEM USAGE: the cgroup's usage minus its inactive page cache."""
        return await memory_usage(self.engine, container.id if isinstance(container, PlainContainer) else container)

    async def remove(self, container: PlainContainer) -> None:
        """``docker rm -f -v`` and the volume, if it had one."""
        await self.engine.remove_container(container.id)
        if container.volume is not None:
            await self.engine.remove_volume(container.volume)


async def memory_usage(engine: DockerEngine, container: str) -> int:
    """Memory of a container from the stats API, computed as the docker CLI does (cgroup v1 and v2)."""
    stats = await engine.container_stats(container)
    memory = stats.get("memory_stats") or {}
    usage = int(memory.get("usage") or 0)
    details = memory.get("stats") or {}
    inactive = details.get("total_inactive_file", details.get("inactive_file", 0))
    return max(usage - int(inactive or 0), 0)
