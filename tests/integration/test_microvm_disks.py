"""Sparse ext4 disks, clones and growth with the real e2fsprogs, and the rootfs builder on a small tree.

Images are inspected with ``debugfs`` and ``dumpe2fs``, so nothing is mounted on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from corral.errors import ResourceLimitError
from corral.microvm import disks
from corral.microvm.rootfs import AGENT_PATH, INIT_PATH, build_rootfs, guest_files_hash

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
GIB = 1024 * MIB


def debugfs(image: Path | str, request: str, *, writable: bool = False) -> str:
    """Run one debugfs request against an image (read-only unless ``writable``)."""
    argv = ["debugfs", *(["-w"] if writable else []), "-R", request, str(image)]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def block_count(image: Path | str) -> int:
    """The ext4 file system's size in bytes, from its superblock."""
    header = subprocess.run(["dumpe2fs", "-h", str(image)], capture_output=True, text=True, check=True).stdout
    fields = dict(line.split(":", 1) for line in header.splitlines() if ":" in line)
    return int(fields["Block count"]) * int(fields["Block size"])


async def test_create_ext4_is_sparse_and_filled_from_a_directory(tmp_path: Path) -> None:
    """A 10 GiB image holds the directory's files and occupies a few MiB on the host."""
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "motd").write_text("hello from the image\n")
    info = await disks.create_ext4(tmp_path / "disk.ext4", 10 * GIB, source_dir=tree)
    assert info.size_bytes == 10 * GIB
    assert info.allocated_bytes < 200 * MIB
    assert block_count(info.path) == 10 * GIB
    assert debugfs(info.path, "cat /etc/motd") == "hello from the image\n"
    assert [name for name in _names(tmp_path) if name.startswith(".")] == [], "a temporary file was left"


async def test_clone_grows_and_shares_nothing_written_later(tmp_path: Path) -> None:
    """A clone grown to 2 GiB keeps the base's files and its file system fills the new size; the base is unchanged."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "base.txt").write_text("base\n")
    base = await disks.create_ext4(tmp_path / "base.ext4", 64 * MIB, source_dir=tree)
    clone = await disks.clone(base.path, tmp_path / "vm" / "rootfs.ext4", 2 * GIB)
    assert clone.size_bytes == 2 * GIB
    assert block_count(clone.path) == 2 * GIB
    assert clone.allocated_bytes < 100 * MIB
    assert debugfs(clone.path, "cat /base.txt") == "base\n"
    debugfs(clone.path, "rm /base.txt", writable=True)
    assert debugfs(base.path, "cat /base.txt") == "base\n"
    assert block_count(base.path) == 64 * MIB


async def test_clone_refuses_a_disk_smaller_than_the_base(tmp_path: Path) -> None:
    """Asking for less than the base image is a resource limit error naming the minimum, and leaves no file."""
    base = await disks.create_ext4(tmp_path / "base.ext4", 64 * MIB)
    with pytest.raises(ResourceLimitError, match="at least 64M"):
        await disks.clone(base.path, tmp_path / "small.ext4", 32 * MIB)
    assert _names(tmp_path) == ["base.ext4"]
    with pytest.raises(ResourceLimitError, match="shrinking"):
        await disks.grow(base.path, 32 * MIB)


async def test_reflink_probe_and_remove(tmp_path: Path) -> None:
    """The reflink probe answers for this file system without leaving files, and remove is idempotent."""
    supported = await disks.reflink_supported(tmp_path)
    assert isinstance(supported, bool)
    assert _names(tmp_path) == []
    path = tmp_path / "x.ext4"
    path.write_bytes(b"x")
    assert disks.remove(path) is True
    assert disks.remove(path) is False


async def test_rootfs_builder_on_a_small_tree(tmp_path: Path) -> None:
    """The builder adds init, agent, mount points and a description, and writes a sparse ext4 with them."""
    tree = tmp_path / "tree"
    (tree / "usr" / "bin").mkdir(parents=True)
    (tree / "usr" / "bin" / "python3").write_text("#!/bin/sh\n")
    (tree / "etc").mkdir()
    (tree / "etc" / "os-release").write_text("ID=tiny\n")
    output = tmp_path / "out" / "rootfs.ext4"
    build = await build_rootfs(output, source_dir=tree)
    assert build.built
    assert build.size_bytes >= 256 * MIB
    assert build.allocated_bytes < 64 * MIB
    init = debugfs(output, f"cat {INIT_PATH}")
    assert init.startswith("#!/usr/bin/python3 -I")
    assert "AgentListener" in init
    assert "class Agent" in debugfs(output, f"cat {AGENT_PATH}")
    assert "0100755" in debugfs(output, f"stat {INIT_PATH}") or "Mode:  0755" in debugfs(output, f"stat {INIT_PATH}")
    listing = debugfs(output, "ls -l /")
    for name in ("workspace", "proc", "sys", "dev", "run", "tmp", "etc", "usr", "sbin"):
        assert f" {name}" in listing
    assert debugfs(output, "stat /sbin/init").count('Fast link dest: "corral-init"') == 1
    description = json.loads(debugfs(output, "cat /etc/corral-rootfs.json"))
    assert description == {"source": f"dir:{tree.resolve()}", "guest_files": guest_files_hash()}
    sidecar = json.loads((tmp_path / "out" / "rootfs.ext4.json").read_text())
    assert sidecar["recipe"] == build.recipe
    again = await build_rootfs(output, source_dir=tree, if_missing=True)
    assert not again.built
    assert _names(tmp_path / "out") == ["rootfs.ext4", "rootfs.ext4.json"]


async def test_rootfs_builder_needs_python(tmp_path: Path) -> None:
    """A tree without /usr/bin/python3 is refused: the VM's init and agent are Python."""
    tree = tmp_path / "tree"
    tree.mkdir()
    with pytest.raises(RuntimeError, match="no /usr/bin/python3"):
        await build_rootfs(tmp_path / "rootfs.ext4", source_dir=tree)
    assert _names(tmp_path) == ["tree"]
