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

__all__ = ["BASE_PACKAGES", "USER_HOME", "USER_ID", "USER_NAME", "build_base_image", "recipe_hash"]

SUITE = "bookworm"
BASE_PACKAGES = (
    "bash", "coreutils", "git", "grep", "ripgrep", "findutils", "procps", "ca-certificates", "python3",
    "diffutils", "patch", "less", "sed", "tar", "gzip", "xz-utils", "file",
    # What E2B's base template has, which E2B programs assume (the README's "The base image").
    "python3-pip", "python3-venv", "python-is-python3", "nodejs", "npm", "curl", "build-essential", "jq", "unzip",
    "sudo",
    # An editor for `corral workspaces shell` and the console's terminal: vim-tiny is Debian's small `vi`.
    "vim-tiny",
)  # fmt: skip
# E2B's default user: uid/gid 1000 with a home and passwordless sudo. Native workspaces still run as root in
# /workspace (IMAGE_CHANGES); E2B sandboxes run as this user in its home.
USER_NAME = "user"
USER_ID = 1000
USER_HOME = "/home/user"
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV HOME=/root",
    "WORKDIR /workspace",
    'CMD ["sleep", "infinity"]',
)
RECIPE_LABEL = "corral.image.recipe"

# gVisor release 20240729 (the runsc `make bootstrap` installs) answers EBADF to xattr calls on symlinks that live on
# the host-backed root filesystem, and `ls -l` asks for every entry's "security.selinux": it prints "Bad file
# descriptor" for each symlink. This preloaded shim answers ENOTSUP (no xattrs here) instead, which is what ls, cp -a
# and Python's copy2 expect. It is compiled on the host (same glibc as the image) and listed in /etc/ld.so.preload;
# under runc, and for files, it changes nothing. (The statx shim bookworm's runsc 20221219 needed is gone: that
# release failed coreutils' AT_NO_AUTOMOUNT, this one does not.)
SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static int is_symlink(const char *path) {
    struct stat st;
    return path != 0 && lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}
ssize_t lgetxattr(const char *path, const char *name, void *value, size_t size) {
    if (is_symlink(path)) { errno = ENOTSUP; return -1; }
    return syscall(SYS_lgetxattr, path, name, value, size);
}
ssize_t llistxattr(const char *path, char *list, size_t size) {
    if (is_symlink(path)) { errno = ENOTSUP; return -1; }
    return syscall(SYS_llistxattr, path, list, size);
}
ssize_t getxattr(const char *path, const char *name, void *value, size_t size) {
    ssize_t r = syscall(SYS_getxattr, path, name, value, size);
    if (r < 0 && errno == EBADF && is_symlink(path)) errno = ENOTSUP;
    return r;
}
ssize_t listxattr(const char *path, char *list, size_t size) {
    ssize_t r = syscall(SYS_listxattr, path, list, size);
    if (r < 0 && errno == EBADF && is_symlink(path)) errno = ENOTSUP;
    return r;
}
"""
SHIM_PATH = "/usr/lib/corral/gvisor-shim.so"
# gVisor mounts an in-memory tmpfs over /tmp at boot when the image's /tmp looks empty (runsc 20240729 checks the
# directory's link count, so only a subdirectory counts), and a stop would lose it. A directory there keeps /tmp on
# the container's disk like every other directory (the README's "gVisor notes").
TMP_KEEP = "/tmp/.corral"  # noqa: S108 - a directory inside the image, not a temporary file of ours


def recipe_hash() -> str:
    """A short hash of everything that decides the image's content."""
    recipe = json.dumps(
        [SUITE, BASE_PACKAGES, IMAGE_CHANGES, SHIM_SOURCE, SHIM_PATH, TMP_KEEP, _user_hooks(), _login_hooks()]
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def _login_hooks() -> list[str]:
    """mmdebstrap customize hooks that make a non-interactive login shell (``bash -l -c``) start no process.

    The E2B SDK runs every command as ``/bin/bash -l -c CMD``, and under gVisor each fork and exec in the login files
    costs about 10 ms, more than the command often does. Debian's login files start two: ``$(id -u)`` in
    /etc/profile, and ``mesg n`` in root's ~/.profile. bash knows its uid (``$EUID``); other shells reading
    /etc/profile (dash has no ``EUID``) still ask ``id``. ``mesg`` only acts on a terminal (it looks at stdout and
    stdin here, stderr being redirected), so it runs only when one of those is a terminal. Nothing else changes:
    PATH, umask, /etc/profile.d and ~/.bashrc for interactive shells are as Debian has them. Each hook fails the
    build when its line is no longer there, rather than leaving the fork in silently.
    """
    profile, root_profile = '"$1/etc/profile"', '"$1/root/.profile"'
    mesg = "mesg n 2> /dev/null || true"
    return [
        f'grep -q \'"$(id -u)"\' {profile} && sed -i \'s/"$(id -u)"/"${{EUID:-$(id -u)}}"/\' {profile}',
        f"grep -qx '{mesg}' {root_profile} && "
        f"sed -i 's#^{mesg}$#if [ -t 0 ] || [ -t 1 ]; then {mesg}; fi#' {root_profile}",
    ]


def _user_hooks() -> list[str]:
    """mmdebstrap customize hooks that add E2B's ``user`` with a home and passwordless sudo."""
    sudoers = f"/etc/sudoers.d/{USER_NAME}"
    return [
        f'chroot "$1" groupadd --gid {USER_ID} {USER_NAME}',
        f'chroot "$1" useradd --uid {USER_ID} --gid {USER_ID} --create-home --home-dir {USER_HOME} '
        f"--shell /bin/bash {USER_NAME}",
        f'echo "{USER_NAME} ALL=(ALL:ALL) NOPASSWD: ALL" > "$1{sudoers}" && chmod 0440 "$1{sudoers}"',
    ]


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
        shim = Path(tmp) / Path(SHIM_PATH).name
        progress("compiling the xattr shim for gVisor")
        (Path(tmp) / "gvisor-shim.c").write_text(SHIM_SOURCE)
        _run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(Path(tmp) / "gvisor-shim.c")], progress)
        progress(f"building root filesystem ({SUITE}, {len(BASE_PACKAGES)} packages) with mmdebstrap")
        hooks = [
            f'mkdir -p "$1{Path(SHIM_PATH).parent}"',
            f"copy-in {shim} {Path(SHIM_PATH).parent}",
            f'echo {SHIM_PATH} > "$1/etc/ld.so.preload"',
            # mmdebstrap's own /tmp cleanup is skipped below (it would remove the directory): done here instead.
            f'rm -rf "$1"/tmp/* && mkdir -p "$1{TMP_KEEP}" && echo "keeps /tmp on disk under gVisor" '
            f'> "$1{TMP_KEEP}/README"',
            *_user_hooks(),
            *_login_hooks(),
        ]
        _run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--skip=cleanup/tmp",
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
