"""Building the workspace base image ``corral/workspace:base`` from Debian packages.

No registry can be reached from Corral's machines, so the image is made from Debian's archive: ``mmdebstrap``
builds a minimal root filesystem with the packages below and ``docker import`` turns it into an image. The image
carries a label with a hash of this recipe; ``build(if_missing=True)`` rebuilds only when the label differs, so a
repeated ``make bootstrap`` costs one ``docker image inspect``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["BASE_PACKAGES", "build_base_image", "recipe_hash"]

SUITE = "bookworm"
BASE_PACKAGES = (
    "bash", "coreutils", "git", "grep", "ripgrep", "findutils", "procps", "ca-certificates", "python3",
    "diffutils", "patch", "less", "sed", "tar", "gzip", "xz-utils", "file",
)  # fmt: skip
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV HOME=/root",
    "WORKDIR /workspace",
    'CMD ["sleep", "infinity"]',
)
RECIPE_LABEL = "corral.image.recipe"

# gVisor release 20221219 (Debian bookworm's runsc) rejects statx() calls carrying AT_NO_AUTOMOUNT with EINVAL, and
# coreutils 9.1 passes that flag, so `ls` and `stat` fail on every path inside a gVisor workspace. This preloaded
# shim drops the flag, which means nothing in a container without automount points. It is compiled on the host
# (same glibc as the image) and listed in /etc/ld.so.preload; under runc it changes nothing.
STATX_SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
"""
SHIM_PATH = "/usr/lib/corral/statx-shim.so"


def recipe_hash() -> str:
    """A short hash of everything that decides the image's content."""
    recipe = json.dumps([SUITE, BASE_PACKAGES, IMAGE_CHANGES, STATX_SHIM_SOURCE, SHIM_PATH])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def _current_recipe(tag: str) -> str | None:
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    labels = json.loads(proc.stdout or "null") or {}
    return str(labels.get(RECIPE_LABEL)) if RECIPE_LABEL in labels else ""


def build_base_image(
    tag: str = "corral/workspace:base",
    *,
    if_missing: bool = False,
    progress: Callable[[str], None] = print,
) -> bool:
    """Build the image; returns False when ``if_missing`` and an up-to-date image is already there.

    Raises:
        RuntimeError: mmdebstrap or docker import failed; the message holds the tail of their output.
    """
    want = recipe_hash()
    if if_missing and _current_recipe(tag) == want:
        return False
    previous = _image_id(tag)
    with tempfile.TemporaryDirectory(prefix="corral-image-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        shim = Path(tmp) / "statx-shim.so"
        progress("compiling the statx shim for gVisor")
        (Path(tmp) / "statx-shim.c").write_text(STATX_SHIM_SOURCE)
        _run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(Path(tmp) / "statx-shim.c")], progress)
        progress(f"building root filesystem ({SUITE}, {len(BASE_PACKAGES)} packages) with mmdebstrap")
        hooks = [
            f'mkdir -p "$1{Path(SHIM_PATH).parent}"',
            f"copy-in {shim} {Path(SHIM_PATH).parent}",
            f'echo {SHIM_PATH} > "$1/etc/ld.so.preload"',
        ]
        _run(
            [
                "mmdebstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                *(f"--customize-hook={hook}" for hook in hooks),
                SUITE,
                str(rootfs),
            ],
            progress,
        )
        progress(f"importing {rootfs.stat().st_size // 2**20} MiB root filesystem as {tag}")
        changes = [*IMAGE_CHANGES, f"LABEL {RECIPE_LABEL}={want}"]
        _run(["docker", "import", *(arg for c in changes for arg in ("--change", c)), str(rootfs), tag], progress)
    if previous is not None and previous != _image_id(tag):
        # The old image lost its tag; remove it unless a container still uses it.
        subprocess.run(["docker", "image", "rm", previous], capture_output=True, check=False)
    progress(f"built {tag}")
    return True


def _image_id(tag: str) -> str | None:
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _run(argv: list[str], progress: Callable[[str], None]) -> None:
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            tail = [*tail[-19:], line]
            if line.startswith(("I: ", "E: ", "W: ")) or "sha256:" in line:
                progress(f"  {line}")
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed with exit code {proc.returncode}:\n" + "\n".join(tail))
