"""Copying workspace data on the Docker host: volume contents and checkpoint directories.

Everything copied here was written by a workspace, so it is treated as hostile: the source is never followed (``cp
-a`` copies symlinks as symlinks, and nothing here opens a file by a path found inside the tree), the destination is
a directory Corral just created, and the source is never a volume mounted in a running container (a stopped or
paused container's volume, or a snapshot's own copy), so nothing can swap a path mid-copy.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

__all__ = ["copy_tree", "link_tree", "tree_size"]


async def copy_tree(source: Path, target: Path) -> None:
    """Copy the contents of ``source`` into the existing directory ``target``, keeping owners, modes, times, links.

    GNU ``cp -a`` with reflinks where the file system has them; a Python walk would be slower and would have to
    re-create every special case (hard links, sparse files, fifos) that ``cp`` already gets right.

    Raises:
        OSError: The copy failed; the message carries cp's own.
    """
    proc = await asyncio.create_subprocess_exec(
        "cp",
        "-a",
        "--reflink=auto",
        "--no-target-directory",
        f"{source}/.",
        str(target),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise OSError(f"copying {source} to {target} failed: {err.decode(errors='replace')[-500:].strip()}")


def link_tree(source: Path, target: Path) -> None:
    """Recreate ``source`` at ``target`` with hard links to its files (instant on one file system, copies across).

    Used for checkpoint images, which nothing modifies after they are written. They hold a workspace's memory, so
    directories are made 0700 and files set 0600: no other user of the host reads them.

    Raises:
        FileNotFoundError: ``source`` is not a directory (a checkpoint that was never written).
    """
    if not source.is_dir():
        raise FileNotFoundError(f"no checkpoint at {source}")
    for root, dirs, files in os.walk(source, followlinks=False):
        rel = Path(root).relative_to(source)
        (target / rel).mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in dirs:
            (target / rel / name).mkdir(mode=0o700, exist_ok=True)
        for name in files:
            src = Path(root) / name
            try:
                os.link(src, target / rel / name, follow_symlinks=False)
            except OSError:
                shutil.copy2(src, target / rel / name, follow_symlinks=False)
            os.chmod(target / rel / name, 0o600, follow_symlinks=False)


def tree_size(path: Path) -> int:
    """Bytes allocated under ``path`` (hard links and reflinks counted once per tree), 0 when it is missing."""
    total, seen = 0, set()
    for root, _, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total
