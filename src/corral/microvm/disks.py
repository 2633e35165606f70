"""Block devices of microVMs: sparse ext4 files, copy-on-write clones of the base rootfs, and growing them.

* :func:`create_ext4` makes a sparse file of the requested size (``truncate``) and formats it as ext4, optionally
  filled from a directory (``mkfs.ext4 -d``), so a 10 GiB disk costs only the blocks written.
* :func:`clone` copies the base rootfs with ``cp --reflink=auto --sparse=always``: on a file system with reflinks
  (XFS, btrfs) the clone shares every block with the base until written (copy-on-write, constant time); elsewhere
  (ext4) only the blocks in use are copied and holes stay holes. :func:`reflink_supported` says which applies.
* :func:`grow` enlarges a file system image to the workspace's disk size (``truncate`` + ``e2fsck -fp`` +
  ``resize2fs``); shrinking below what the base image holds is refused.

Every VM's disk is one file that stays where it is across stop and resume: Firecracker attaches it as the root
drive of each new VM process. All tools come from e2fsprogs and coreutils; nothing is mounted on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from corral.errors import CorralError, ResourceLimitError

__all__ = [
    "DiskError",
    "DiskInfo",
    "clone",
    "create_ext4",
    "disk_info",
    "grow",
    "mkfs_argv",
    "reflink_supported",
    "remove",
]

MIB = 1024 * 1024


class DiskError(CorralError):
    """A disk tool failed; the message holds the command and its output."""

    code = "disk_operation_failed"
    http_status = 500


@dataclass(frozen=True, slots=True)
class DiskInfo:
    """A disk file's apparent size and the bytes it really occupies."""

    path: str
    size_bytes: int
    allocated_bytes: int


async def _run(*argv: str, ok: tuple[int, ...] = (0,)) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace").strip()
    if proc.returncode not in ok:
        raise DiskError(f"`{shlex.join(argv)}` failed with status {proc.returncode}: {text}", details={"argv": argv})
    return text


def disk_info(path: str | Path) -> DiskInfo:
    """Apparent size and allocated bytes (``st_blocks * 512``) of a disk file."""
    st = os.stat(path)
    return DiskInfo(str(path), st.st_size, st.st_blocks * 512)


def mkfs_argv(path: str | Path, *, label: str = "corral-root", source_dir: str | Path | None = None) -> list[str]:
    """The ``mkfs.ext4`` command for an image file: no reserved blocks, lazy init (fast on sparse files)."""
    argv = ["mkfs.ext4", "-F", "-q", "-L", label, "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1"]
    if source_dir is not None:
        argv += ["-d", str(source_dir)]
    return [*argv, str(path)]


async def create_ext4(path: str | Path, size_bytes: int, *, source_dir: str | Path | None = None,
                      label: str = "corral-root") -> DiskInfo:  # fmt: skip
    """A sparse file of ``size_bytes`` formatted as ext4 (filled from ``source_dir`` when given).

    The file is written beside its final name and renamed into place, so a crash never leaves half an image.
    """
    if size_bytes < MIB or size_bytes % 4096:
        raise ValueError(f"disk size {size_bytes} must be a multiple of 4096 and at least 1 MiB")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        os.truncate(tmp, size_bytes)
        await _run(*mkfs_argv(tmp, label=label, source_dir=source_dir))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return disk_info(target)


async def clone(base: str | Path, path: str | Path, size_bytes: int | None = None) -> DiskInfo:
    """Copy-on-write clone of ``base`` at ``path``, grown to ``size_bytes`` when larger than the base.

    Raises:
        ResourceLimitError: ``size_bytes`` is smaller than the base image (its files would not fit).
    """
    base_size = os.stat(base).st_size
    if size_bytes is not None and size_bytes < base_size:
        raise ResourceLimitError(
            f"firecracker: a disk of {size_bytes} bytes cannot hold the base root filesystem ({base_size} bytes); "
            f"ask for at least {-(-base_size // MIB)}M",
            details={"requested": size_bytes, "minimum": base_size},
        )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        await _run("cp", "--reflink=auto", "--sparse=always", str(base), tmp)
        if size_bytes is not None and size_bytes > base_size:
            await grow(tmp, size_bytes)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return disk_info(target)


async def grow(path: str | Path, size_bytes: int) -> DiskInfo:
    """Enlarge the file to ``size_bytes`` (sparse) and the ext4 file system in it to fill it. Never shrinks."""
    current = os.stat(path).st_size
    if size_bytes < current:
        raise ResourceLimitError(
            f"firecracker: disk {path} is {current} bytes; shrinking it to {size_bytes} is not supported",
            details={"current": current, "requested": size_bytes},
        )
    if size_bytes > current:
        os.truncate(path, size_bytes)
        await _run("e2fsck", "-f", "-p", str(path), ok=(0, 1))  # 1: problems found and fixed
        await _run("resize2fs", str(path))
    return disk_info(path)


def _reflink_probe(directory: str | Path) -> bool:
    Path(directory).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".reflink-probe.") as tmp:
        src = os.path.join(tmp, "a")
        with open(src, "wb") as fh:
            fh.write(b"x" * 4096)
        done = subprocess.run(["cp", "--reflink=always", src, os.path.join(tmp, "b")], capture_output=True, check=False)
        return done.returncode == 0


async def reflink_supported(directory: str | Path) -> bool:
    """Whether ``cp --reflink=always`` works in ``directory`` (so clones are copy-on-write, not copies)."""
    return await asyncio.to_thread(_reflink_probe, directory)


def remove(path: str | Path) -> bool:
    """Delete a disk file; False when it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
