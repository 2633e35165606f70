"""Building the microVM root filesystem: an ext4 image of the workspace base image, plus Corral's init and agent.

The source is the same Debian tree the containers use: ``docker export`` of a container created (never started)
from ``corral/workspace:base``, or any directory (an ``mmdebstrap`` output, a test tree). The builder adds

* ``/sbin/corral-init``: :mod:`corral.microvm.guest_init`, PID 1 of the VM (the manager boots with
  ``init=/sbin/corral-init``); ``/sbin/init`` points at it when the tree has no init of its own;
* ``/usr/lib/corral/agent.py``: the guest agent :mod:`corral.guest.agent`, unchanged, which init starts for every
  vsock connection on port 1024;
* ``/workspace``, the mount points init uses, and ``/etc/corral-rootfs.json`` describing the build,

then writes a sparse ext4 file sized to the content plus headroom with ``mkfs.ext4 -d`` (no loop mount, no root
needed for that step). Each VM's disk is a copy-on-write clone of this image grown to the workspace's disk size
(:mod:`corral.microvm.disks`). A sidecar ``<image>.json`` records the recipe, so ``if_missing=True`` rebuilds only
when the source image or Corral's guest files changed.

The guest kernel is not built here: Firecracker boots an uncompressed ``vmlinux`` given by
``CORRAL_FIRECRACKER_KERNEL`` (see the README for where to get one).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from corral.microvm import disks

__all__ = [
    "AGENT_PATH",
    "INIT_PATH",
    "RootfsBuild",
    "build_rootfs",
    "build_rootfs_sync",
    "guest_files_hash",
    "install_guest_files",
]

INIT_PATH = "/sbin/corral-init"
AGENT_PATH = "/usr/lib/corral/agent.py"
MIB = 1024 * 1024
HEADROOM_BYTES = 256 * MIB
"""Free space left in the base image (each VM's disk is grown to its own size anyway)."""

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RootfsBuild:
    """What was built."""

    path: str
    size_bytes: int
    allocated_bytes: int
    source: str
    recipe: str
    built: bool
    """False when ``if_missing`` found an up-to-date image and left it alone."""


def _guest_sources() -> tuple[bytes, bytes]:
    init = resources.files("corral.microvm").joinpath("guest_init.py").read_bytes()
    agent = resources.files("corral.guest").joinpath("agent.py").read_bytes()
    return init, agent


def guest_files_hash() -> str:
    """A short hash of the init and agent sources baked into images."""
    init, agent = _guest_sources()
    return hashlib.sha256(init + b"\0" + agent).hexdigest()[:16]


def install_guest_files(root: str | Path, *, source: str) -> None:
    """Add init, agent, mount points and the build description to the tree at ``root``."""
    tree = Path(root)
    init, agent = _guest_sources()
    for rel, data, mode in ((INIT_PATH, init, 0o755), (AGENT_PATH, agent, 0o644)):
        target = tree / rel.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
    sbin_init = tree / "sbin" / "init"
    if not sbin_init.exists() and not sbin_init.is_symlink():
        sbin_init.symlink_to("corral-init")
    for rel, mode in (("workspace", 0o755), ("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("run", 0o755),
                      ("tmp", 0o1777), ("root", 0o700)):  # fmt: skip
        path = tree / rel
        path.mkdir(exist_ok=True)
        path.chmod(mode)
    etc = tree / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "hostname").write_text("workspace\n")
    (etc / "corral-rootfs.json").write_text(json.dumps({"source": source, "guest_files": guest_files_hash()}) + "\n")


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512 + 256  # inode and dirent overhead
            except OSError:
                continue
    return total


def _image_id(image: str) -> str:
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"image {image} is not present ({done.stderr.strip()}); build it with `corral image build`")
    return done.stdout.strip()


def _export_image(image: str, into: Path) -> None:
    """``docker export`` of a created-not-started container of ``image``, unpacked into ``into``."""
    created = subprocess.run(["docker", "create", image, "/bin/true"], capture_output=True, text=True, check=False)
    if created.returncode != 0:
        raise RuntimeError(f"docker create {image} failed: {created.stderr.strip()}")
    container = created.stdout.strip()
    try:
        with subprocess.Popen(["docker", "export", container], stdout=subprocess.PIPE) as export:
            untar = subprocess.run(
                ["tar", "-x", "--numeric-owner", "-C", str(into)], stdin=export.stdout, capture_output=True,
                check=False,
            )  # fmt: skip
            export.wait()
        if export.returncode != 0 or untar.returncode != 0:
            raise RuntimeError(
                f"exporting {image} failed (docker export {export.returncode}, tar {untar.returncode}): "
                f"{untar.stderr.decode(errors='replace').strip()}"
            )
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)


def _read_sidecar(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def build_rootfs(
    output: str | Path,
    *,
    image: str | None = "corral/workspace:base",
    source_dir: str | Path | None = None,
    size_bytes: int | None = None,
    if_missing: bool = False,
    progress: Progress = lambda line: None,
) -> RootfsBuild:
    """:func:`build_rootfs_sync` in a worker thread."""
    return await asyncio.to_thread(
        build_rootfs_sync,
        output,
        image=image,
        source_dir=source_dir,
        size_bytes=size_bytes,
        if_missing=if_missing,
        progress=progress,
    )


def build_rootfs_sync(
    output: str | Path,
    *,
    image: str | None = "corral/workspace:base",
    source_dir: str | Path | None = None,
    size_bytes: int | None = None,
    if_missing: bool = False,
    progress: Progress = lambda line: None,
) -> RootfsBuild:
    """Build ``output`` from ``source_dir`` (a directory tree) or else from the Docker ``image``.

    Raises:
        RuntimeError: the image is missing, export failed, or the tree has no ``python3`` (init and agent need it).
        ValueError: neither a source directory nor an image was given, or ``size_bytes`` is too small.
    """
    target = Path(output)
    if source_dir is not None:
        source = f"dir:{Path(source_dir).resolve()}"
    elif image is not None:
        source = f"image:{image}@{_image_id(image)}"
    else:
        raise ValueError("give a source directory or an image")
    recipe = hashlib.sha256(f"{source}|{guest_files_hash()}|{size_bytes}".encode()).hexdigest()[:16]
    sidecar = target.with_name(target.name + ".json")
    if if_missing and target.is_file():
        previous = _read_sidecar(sidecar)
        if previous is not None and previous.get("recipe") == recipe:
            info = disks.disk_info(target)
            progress(f"rootfs {target} is up to date ({recipe})")
            return RootfsBuild(str(target), info.size_bytes, info.allocated_bytes, source, recipe, built=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".rootfs-", dir=target.parent) as tmp:
        tree = Path(tmp) / "tree"
        if source_dir is not None:
            progress(f"copying {source_dir}")
            shutil.copytree(source_dir, tree, symlinks=True)
        else:
            assert image is not None
            tree.mkdir()
            progress(f"exporting {image}")
            _export_image(image, tree)
        if not (tree / "usr" / "bin" / "python3").exists() and not (tree / "usr" / "bin" / "python3").is_symlink():
            raise RuntimeError(f"{source} has no /usr/bin/python3, which the VM's init and agent need")
        install_guest_files(tree, source=source)
        needed = _tree_bytes(tree)
        size = size_bytes or needed + needed // 5 + HEADROOM_BYTES
        size = -(-size // MIB) * MIB
        if size < needed:
            raise ValueError(f"size {size_bytes} is smaller than the tree ({needed} bytes)")
        progress(f"writing {target} ({size // MIB} MiB, {needed // MIB} MiB of files)")
        image_file = Path(tmp) / "rootfs.ext4"
        with image_file.open("wb") as fh:
            fh.truncate(size)
        mkfs = subprocess.run(disks.mkfs_argv(image_file, source_dir=tree), capture_output=True, text=True, check=False)
        if mkfs.returncode != 0:
            raise RuntimeError(f"mkfs.ext4 failed with status {mkfs.returncode}: {mkfs.stderr.strip()}")
        os.replace(image_file, target)
        info = disks.disk_info(target)
    build = RootfsBuild(str(target), info.size_bytes, info.allocated_bytes, source, recipe, built=True)
    sidecar.write_text(json.dumps(asdict(build), indent=2) + "\n")
    return build
