"""The guest agent's runtime: a self-contained Python that nothing inside a workspace can change.

Every Docker-based workspace runs :mod:`corral.guest.agent`, and the host trusts it to tell the truth about exec and
file operations. Root inside the workspace owns the container's filesystem, so an agent started by a ``PATH`` lookup
of ``python3`` (or from ``/usr/bin/python3``, or with the image's shared libraries and ``/etc/ld.so.preload``) can be
swapped for an impostor that stays there for good. So the agent runs from a directory the host provides, mounted
read-only at ``/.corral``:

* ``agent.py``: the agent's source, and ``agent.pyc``, its bytecode (what runs);
* ``spawner``: the workspace's main process, which starts the agent's commands (``corral/guest/spawner.c``,
  compiled on the host with ``gcc -static``, so it needs nothing from the image);
* ``bin/python3`` and ``lib/python3.11/``: the base image's interpreter and standard library (the interpreter sits
  one level down so that both places Python looks for a ``pyvenv.cfg``, its own directory and the parent, are on
  the read-only mount);
* ``lib/``: exactly the shared libraries that interpreter maps while running the agent (libc, libm, libz, ...),
  under their sonames;
* ``ld.so``: the image's dynamic loader with one change: the path ``/etc/ld.so.preload`` it reads at start is
  replaced by ``/.corral/nopreload`` (same length), a file that cannot exist on a read-only mount. The agent is
  started as ``/.corral/ld.so --inhibit-cache --library-path /.corral/lib /.corral/bin/python3 -I -S
  /.corral/agent.pyc`` in ``/.corral``, with the loader's environment variables (``LD_PRELOAD``, ``LD_AUDIT``,
  ``GLIBC_TUNABLES``...) emptied: no ``PATH`` lookup, no ``ld.so.cache``, no preload, no library outside
  ``/.corral``, no ``PYTHON*`` variables, no ``site``, nothing read from the working directory. Commands the agent
  starts use the image's own loader, libraries and environment as usual (the agent puts the emptied variables back).

The runtime is built once per (agent source, build script, base image) by a short-lived container of the base image
that copies those files into a fresh host directory (``CORRAL_AGENT_RUNTIME_DIR/<hash>``), checks that the copy runs
without touching anything outside it, and is renamed into place atomically. It is self-contained, so workspaces of
any image (even one without Python) run the same agent.

What this does not stop: root inside a workspace can still ptrace or kill the running agent (it runs as root there,
as the workload does). That is why the host treats every frame as hostile (size caps, flow control: see
:mod:`corral.guest.client`) and why a killed agent is replaced by a fresh one from this read-only copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from importlib import resources
from pathlib import Path

from corral.errors import ProviderUnavailableError
from corral.guest.agent import LOADER_VARIABLES
from corral.providers._docker_engine import DockerAPIError, DockerEngine

__all__ = [
    "AGENT_COMMAND",
    "LOADER_VARIABLES",
    "RUNTIME_MOUNT",
    "SPAWNER_COMMAND",
    "AgentRuntime",
    "agent_environment",
    "agent_source",
]

log = logging.getLogger(__name__)

RUNTIME_MOUNT = "/.corral"
"""Where the runtime directory is mounted (read-only) in every workspace."""

AGENT_COMMAND = [
    f"{RUNTIME_MOUNT}/ld.so",
    "--inhibit-cache",
    "--library-path",
    f"{RUNTIME_MOUNT}/lib",
    f"{RUNTIME_MOUNT}/bin/python3",
    "-I",
    "-S",
    f"{RUNTIME_MOUNT}/agent.pyc",
]
"""How the agent is started: absolute paths into the read-only mount only. The agent runs from its bytecode,
compiled when the runtime is built: a script is compiled on every start otherwise (35-40 ms of the agent's 130 ms
start under gVisor, and a new agent starts on the first call after every resume)."""

SPAWNER_COMMAND = [f"{RUNTIME_MOUNT}/spawner"]
"""The container's main process (see ``corral/guest/spawner.c``)."""

# The variables of the container's environment that could steer the loader or libc of the agent's own process (the
# list glibc ignores for set-uid programs, and the locale): the agent starts with them empty (LC_ALL=C: the C locale
# is built into libc, so no locale file is read) and gives its commands their original values back.
RESTORE_VARIABLE = "CORRAL_AGENT_RESTORE_ENV"
"""Carries the original values of the variables above, as JSON, to the agent (which removes it again)."""


def agent_environment(container_env: list[str]) -> list[str]:
    """The ``Env`` of the agent's ``docker exec``, given the container's ``Config.Env``."""
    original = dict(item.split("=", 1) for item in container_env if "=" in item)
    kept = {name: original[name] for name in LOADER_VARIABLES if name in original}
    cleared = [f"{name}=" for name in LOADER_VARIABLES if name != "LC_ALL"]
    return [*cleared, "LC_ALL=C", f"{RESTORE_VARIABLE}={json.dumps(kept)}"]


BUILD_TIMEOUT_S = 120.0
COLLECT_AFTER_S = 3600.0
"""An unmounted runtime directory of another agent version is removed once it is this old (seconds)."""
WORKSPACE_LABEL = "corral.workspace.id"
"""The label every workspace container carries (``corral.providers.docker.LABEL_ID``)."""

# Runs inside a fresh container of the base image (trusted: nothing has run in it), with the new runtime directory
# mounted read-write at /.corral and agent.py already in it. stdlib only.
BUILD_SCRIPT = r"""
import os, runpy, shutil, subprocess, sys, sysconfig
out = "/.corral"
# Load the agent's module (not its main) so every shared object it needs is mapped, then read the map.
runpy.run_path(out + "/agent.py", run_name="corral_agent_probe")
import ctypes, glob  # noqa: the agent may use them (glob and shutil, imported above, only when an op needs them)
mapped = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith("/") and ".so" in parts[5]:
            mapped.add(parts[5])
os.makedirs(out + "/lib", exist_ok=True)
stdlib = sysconfig.get_paths()["stdlib"]
loader = None
for path in sorted(mapped):
    name = os.path.basename(path)
    if path.startswith(stdlib) or path.startswith("/usr/lib/corral/"):
        continue  # extension modules come with the stdlib copy; the gVisor shim is the image's, not ours
    if name.startswith("ld-linux"):
        loader = path
        continue
    shutil.copyfile(path, out + "/lib/" + name)
    folder = os.path.dirname(path)
    for alias in os.listdir(folder):  # the sonames (libz.so.1 -> libz.so.1.2.13) the loader asks for
        full = os.path.join(folder, alias)
        if alias != name and os.path.islink(full) and os.path.realpath(full) == os.path.realpath(path):
            os.symlink(name, out + "/lib/" + alias)
if loader is None:
    sys.exit("no dynamic loader found in /proc/self/maps")
with open(loader, "rb") as f:
    data = f.read()
if data.count(b"/etc/ld.so.preload") != 1:
    sys.exit("the loader does not name /etc/ld.so.preload exactly once; cannot disable preloading")
with open(out + "/ld.so", "wb") as f:
    f.write(data.replace(b"/etc/ld.so.preload", b"/.corral/nopreload"))
os.chmod(out + "/ld.so", 0o755)
os.makedirs(out + "/bin", exist_ok=True)
shutil.copyfile(os.path.realpath(sys.executable), out + "/bin/python3")
os.chmod(out + "/bin/python3", 0o755)
skip = shutil.ignore_patterns(
    "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__", "config-*",
    "pydoc_data", "dist-packages", "site-packages", "*_test*.so", "_test*.so",
)
# symlinks=False: a link in the stdlib (sitecustomize.py -> /etc/...) would point into the workspace; copy the file.
shutil.copytree(stdlib, out + "/lib/" + os.path.basename(stdlib), ignore=skip, symlinks=False)
# The copy must run on its own: every object the agent's interpreter maps lies inside /.corral.
probe = (
    "import runpy; runpy.run_path('/.corral/agent.py', run_name='corral_agent_probe'); import ctypes, glob, shutil;"
    "print(' '.join(l.split()[5] for l in open('/proc/self/maps') if len(l.split()) >= 6))"
)
probe += "; import sys; print('PREFIX=' + sys.prefix)"
# Run it where a hostile pyvenv.cfg waits, as a workspace could plant one in the agent's working directory.
os.makedirs("/tmp/corral-probe", exist_ok=True)
with open("/tmp/corral-probe/pyvenv.cfg", "w") as cfg:
    cfg.write("home = /tmp/corral-probe/bin\ninclude-system-site-packages = true\n")
cmd = [out + "/ld.so", "--inhibit-cache", "--library-path", out + "/lib", out + "/bin/python3", "-I", "-S", "-c", probe]
done = subprocess.run(cmd, capture_output=True, text=True, env={"LC_ALL": "C"}, cwd="/tmp/corral-probe")
if done.returncode != 0:
    sys.exit("the runtime does not start: " + done.stderr[-2000:])
outside = sorted({p for p in done.stdout.split() if p.startswith("/") and not p.startswith(out + "/")})
outside = [p for p in outside if not p.startswith(("/dev/", "/proc/", "/memfd:", "/[", "/SYSV"))]
if outside:
    sys.exit("the runtime maps files outside /.corral: " + ", ".join(outside))
if "PREFIX=" + out not in done.stdout.split():
    sys.exit("the runtime's interpreter does not find its own standard library first: " + done.stdout[-500:])
for folder, _, files in os.walk(out):
    for name in files:
        if os.path.islink(os.path.join(folder, name)) and os.readlink(os.path.join(folder, name)).startswith("/"):
            sys.exit("the runtime holds an absolute symlink: " + os.path.join(folder, name))
import py_compile
py_compile.compile(out + "/agent.py", cfile=out + "/agent.pyc", dfile=out + "/agent.py", doraise=True)
os.chmod(out + "/agent.pyc", 0o644)
print("ok")
"""


def agent_source() -> bytes:
    """The agent's source, as shipped in this package."""
    return resources.files("corral.guest").joinpath("agent.py").read_bytes()


def spawner_source() -> bytes:
    """The spawner's C source, as shipped in this package."""
    return resources.files("corral.guest").joinpath("spawner.c").read_bytes()


class AgentRuntime:
    """Builds (once) and locates the read-only agent runtime for one base image."""

    def __init__(self, engine: DockerEngine, *, image: str, root: Path, provider: str = "docker") -> None:
        self.engine = engine
        self.provider = provider
        self.image = image
        self.root = root
        self._path: str | None = None
        self._lock = asyncio.Lock()

    async def ensure(self) -> str:
        """The host directory to mount at ``/.corral``, built first if needed.

        Raises:
            ProviderUnavailableError: the base image is missing or the runtime cannot be built from it.
        """
        if self._path is not None and _present(self._path):
            return self._path
        # First call, or the directory went away under a long-running server (another Corral version on this host
        # collected it while no container mounted it): build it (again).
        async with self._lock:
            if self._path is None or not _present(self._path):
                self._path = await self._ensure()
                await self._collect_unused(Path(self._path))
        return self._path

    async def _ensure(self) -> str:
        try:
            image = await self.engine.inspect_image(self.image)
        except DockerAPIError as exc:
            raise ProviderUnavailableError(self.provider, exc.message) from exc
        if image is None:
            raise ProviderUnavailableError(
                self.provider,
                f"the agent runtime is built from the base image {self.image!r}, which is not present; "
                "run `corral image build` (make bootstrap does it)",
            )
        recipe = agent_source() + spawner_source() + BUILD_SCRIPT.encode() + str(image["Id"]).encode()
        digest = hashlib.sha256(recipe).hexdigest()[:16]
        final = self.root / digest
        if (final / "agent.py").is_file():
            await self._seal(final)
            return str(final)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        building = self.root / f".{digest}.building-{uuid.uuid4().hex[:8]}"
        building.mkdir(mode=0o755)
        try:
            (building / "agent.py").write_bytes(agent_source())
            await self._compile_spawner(building / "spawner")
            await self._run_build(building, str(image["Id"]))
            try:
                building.rename(final)
            except OSError:
                if not (final / "agent.py").is_file():  # not a concurrent build that got there first
                    raise
        finally:
            if building.exists():
                shutil.rmtree(building, ignore_errors=True)
        log.info("agent runtime built in %s from %s", final, self.image)
        await self._seal(final)
        return str(final)

    async def _collect_unused(self, current: Path) -> None:
        """Remove the runtimes of earlier agent versions that no workspace container mounts any more.

        Each agent version builds its own directory (25 MB); without this they pile up with every upgrade. A
        directory younger than :data:`COLLECT_AFTER_S` is kept even when unmounted, because another Corral process
        of that version may be about to create a container on it. Best effort: a failure is logged, never raised.
        """
        try:
            containers = await self.engine.list_containers([WORKSPACE_LABEL])
            sources = [str(m.get("Source", "")) for c in containers for m in c.get("Mounts") or []]
            for directory in await asyncio.to_thread(_unused_runtimes, self.root, current, sources):
                if _read_only_mount(directory):
                    proc = await asyncio.create_subprocess_exec(
                        "umount", str(directory), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
                    )
                    if await proc.wait() != 0:
                        continue  # still in use somewhere: leave it
                await asyncio.to_thread(shutil.rmtree, directory, True)
                log.info("removed the unused agent runtime %s", directory)
        except (DockerAPIError, OSError) as exc:
            log.warning("could not collect unused agent runtimes in %s: %s", self.root, exc)

    async def _seal(self, directory: Path) -> None:
        """Make ``directory`` a read-only mount on the host (a bind mount onto itself, remounted ``ro``).

        Docker's ``ReadOnly`` bind is not enough under gVisor 20240729: with directfs, an ``open(O_TRUNC)`` inside
        the sandbox answers EROFS but truncates the host file all the same, so one workspace could empty the
        agent's interpreter for every workspace (tests/security/test_hostile_agent.py). The host kernel refuses
        writes to a read-only mount whatever the sandbox does. Idempotent: an existing read-only mount is kept.

        Raises:
            ProviderUnavailableError: the mount cannot be made (Corral must run as root on the Docker host).
        """
        if _read_only_mount(directory):
            return
        for argv in (
            ["mount", "--bind", str(directory), str(directory)],
            ["mount", "-o", "remount,bind,ro", str(directory)],
        ):
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            _, err = await proc.communicate()
            if proc.returncode != 0 and not _read_only_mount(directory):
                raise ProviderUnavailableError(
                    self.provider,
                    f"cannot make the agent runtime {directory} a read-only mount ({' '.join(argv[:3])}: "
                    f"{err.decode(errors='replace').strip()}); Corral must run as root on the Docker host",
                )

    async def _compile_spawner(self, target: Path) -> None:
        """Compile spawner.c into ``target``: static, so it runs in any image and maps nothing from it.

        Raises:
            ProviderUnavailableError: no C compiler, or the compile fails (``make bootstrap`` installs gcc and
                libc6-dev).
        """
        source = target.with_name(".spawner.c")
        source.write_bytes(spawner_source())
        argv = ["gcc", "-static", "-Os", "-s", "-Wall", "-o", str(target), str(source)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            _, err = await asyncio.wait_for(proc.communicate(), BUILD_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise ProviderUnavailableError(
                self.provider, f"cannot compile the workspace spawner with gcc ({exc}); make bootstrap installs gcc"
            ) from exc
        finally:
            source.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise ProviderUnavailableError(
                self.provider,
                f"cannot compile the workspace spawner (gcc exit {proc.returncode}): "
                f"{err.decode(errors='replace').strip()[-2000:]}; make bootstrap installs gcc and libc6-dev",
            )

    async def _run_build(self, directory: Path, image_id: str) -> None:
        name = f"corral-agent-runtime-build-{uuid.uuid4().hex[:8]}"
        config = {
            "Image": image_id,  # the image inspected (and hashed) above, even if the tag moves meanwhile
            "Cmd": ["python3", "-I", "-S", "-c", BUILD_SCRIPT],
            "Entrypoint": [],
            "Env": [],
            "NetworkDisabled": True,
            "Labels": {"corral.agent-runtime": "build"},
            "HostConfig": {
                "NetworkMode": "none",
                "CapDrop": ["ALL"],
                "CapAdd": ["DAC_OVERRIDE", "FOWNER", "CHOWN"],
                "SecurityOpt": ["no-new-privileges:true"],
                "Mounts": [{"Type": "bind", "Source": str(directory), "Target": RUNTIME_MOUNT}],
            },
        }
        try:
            await self.engine.create_container(name, config)
            await self.engine.start_container(name)
            code = await self.engine.wait_container(name, timeout=BUILD_TIMEOUT_S)
            if code != 0:
                output = await self.engine.container_logs(name)
                raise ProviderUnavailableError(
                    self.provider, f"cannot build the agent runtime from {self.image!r} (exit {code}): {output.strip()}"
                )
        except DockerAPIError as exc:
            raise ProviderUnavailableError(self.provider, f"cannot build the agent runtime: {exc.message}") from exc
        finally:
            with contextlib.suppress(DockerAPIError):
                await self.engine.remove_container(name)
        if not os.access(directory / "ld.so", os.X_OK):
            raise ProviderUnavailableError(self.provider, "the agent runtime build produced no loader")


def _read_only_mount(directory: Path) -> bool:
    """Whether ``directory`` is itself a mount point mounted read-only (from /proc/self/mountinfo)."""
    target = os.path.realpath(directory)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    found = False
    for line in lines:  # the last mount on a point is the one in effect
        fields = line.split()
        if len(fields) > 5 and fields[4].encode().decode("unicode_escape") == target:
            found = "ro" in fields[5].split(",")
    return found


def _present(directory: str) -> bool:
    """Whether a runtime directory still holds its agent (one stat of a local file: cheap enough for the loop)."""
    return os.path.isfile(os.path.join(directory, "agent.py"))


def _unused_runtimes(root: Path, current: Path, mounted: list[str]) -> list[Path]:
    """Runtime directories under ``root`` other than ``current``, mounted by none of ``mounted`` (container mount
    sources) and older than :data:`COLLECT_AFTER_S`."""
    sources = {os.path.realpath(source) for source in mounted}
    keep = os.path.realpath(current)
    now = time.time()
    return [
        directory
        for directory in root.iterdir()
        if directory.is_dir()
        and os.path.realpath(directory) not in sources | {keep}
        and now - directory.stat().st_mtime >= COLLECT_AFTER_S
    ]
