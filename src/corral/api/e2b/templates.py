"""E2B's template build API under ``/e2b``: the unmodified SDK's ``Template.build`` builds images on the local Docker
engine.

What the SDK does, and what answers it here:

1. ``POST /v3/templates`` (``name`` as ``name`` or ``name:tag``, extra ``tags``) registers a build and answers its
   ``templateID`` and ``buildID``. The template's id *is* its name: E2B accepts either everywhere, and a name needs
   no table to map it, so nothing but Docker holds the state.
2. For each ``copy`` step, ``GET /templates/{id}/files/{hash}`` answers whether that archive is already here and a
   signed URL (this same path with ``?signature=``) the SDK ``PUT``\\ s the tar archive to. Archives live in a
   directory of the server's data dir until the build that uses them ends.
3. ``POST /v2/templates/{id}/builds/{build_id}`` starts the build with the SDK's steps (``RUN``, ``COPY``, ``ENV``,
   ``WORKDIR``, ``USER``; ``pip_install``, ``apt_install``, ``git_clone``... are ``RUN`` steps, and
   ``from_dockerfile`` turns a Dockerfile into the same steps on the SDK's side).
4. ``GET /templates/{id}/builds/{build_id}/status?logsOffset=`` answers the status and the log entries from that
   offset (at most 100 a call); the SDK polls it until ``ready`` or ``error``.

Also served: ``GET /templates/aliases/{alias}`` (``Template.exists``), ``POST /templates/tags`` and
``DELETE /templates/tags`` (``Template.assign_tags``/``remove_tags``), ``GET /templates/{id}/tags``
(``Template.get_tags``) and ``DELETE /templates/{id}``.

How a build runs: one container from the base image (``sleep`` keeps it alive), each step a ``docker exec`` in it
(``COPY`` streams the rewritten archive into ``tar -x``), then one ``docker commit``: one new layer, no intermediate
images, and the container is removed whatever happens. The base must be an image on this host, since Corral never
pulls from a registry: ``fromImage`` names one (``e2bdev/base``, E2B's base, is Corral's ``CORRAL_BASE_IMAGE`` unless
an image of that name is present), ``fromTemplate`` a template built here (``base`` is ``CORRAL_BASE_IMAGE``). A
missing base fails the build request with a message saying how to load one. Steps run as ``user`` in ``/home/user``
unless a ``USER``/``WORKDIR`` step says otherwise (E2B's defaults; root and ``/`` when the image has no ``user``);
``ENV`` values reach later steps and the image. ``USER`` and ``WORKDIR`` shape the build, and the start command: the
image itself keeps its base's user, as Corral's workspaces need. A start command (``set_start_cmd``, or a
Dockerfile's ``CMD``/``ENTRYPOINT``) is kept on the image and started in every new sandbox of the template (in its own
session, as the template's last user in its last working directory, with the sandbox's ``envs``; its output goes to
``~/.corral-start.log``); the create answers once the ready command succeeds, or fails after
:data:`READY_TIMEOUT_S` and removes the sandbox. E2B runs them once, at build time, and snapshots the running
sandbox; Corral runs them at each E2B create, so a ready command should pass quickly (a Dockerfile's ``CMD`` comes
with a 20 s wait). Corral's own API starts no start command.

Where templates live: image ``corral-templates/<name>:<tag>`` for each of the template's tags (``default`` unless the
build names others), labelled with the template and build ids; the build status and its last
:data:`MAX_LOG_ENTRIES` log entries live in memory (a build's status after a restart is ``ready`` when its image
exists). ``Sandbox.create("<name>")`` or ``Sandbox.create("<name>:<tag>")`` starts a sandbox from that image, and a
Corral workspace uses it as any image: ``base_image: corral-templates/<name>:<tag>``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import posixpath
import re
import secrets
import shlex
import shutil
import tarfile
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from corral.api.e2b._errors import E2BApiError, e2b_error, json_body, status_of
from corral.api.e2b._state import E2BState
from corral.egress.controller import restrict_container
from corral.egress.policy import parse_always_deny
from corral.errors import CorralError, InvalidRequestError
from corral.orchestrator.service import WorkspaceService
from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.providers.base import ExecRequest

__all__ = [
    "DEFAULT_TAG",
    "TEMPLATE_REPO",
    "BuildSpec",
    "StartCommand",
    "Step",
    "TemplateImage",
    "TemplateRef",
    "TemplatesState",
    "parse_build_start",
    "parse_tags",
    "parse_template_name",
    "resolve_template",
    "rewrite_copy_archive",
    "run_start_command",
    "templates_routers",
]

log = logging.getLogger(__name__)

TEMPLATE_REPO: Final = "corral-templates"
"""The repository of built templates' images: ``corral-templates/<name>:<tag>``."""
DEFAULT_TAG: Final = "default"
"""The tag a build gets when it names none (E2B's)."""
LABEL_TEMPLATE: Final = "corral.e2b.template"
LABEL_BUILD: Final = "corral.e2b.build"
MAX_LOG_ENTRIES: Final = 2000
"""Log entries kept per build; older ones are dropped (offsets stay absolute)."""
MAX_LOG_LINE: Final = 4096
MAX_FINISHED_BUILDS: Final = 100
"""Finished builds whose status stays in memory."""
STATUS_PAGE: Final = 100
"""Log entries per status answer (E2B's)."""
MAX_UPLOAD_BYTES: Final = 4 * 1024**3
"""The largest archive a copy step may upload."""
BUILD_TIMEOUT_S: Final = 3600.0
READY_TIMEOUT_S: Final = 45.0
"""How long a sandbox's create waits for the template's ready command to succeed (under the SDK's 60 s request
timeout)."""
MAX_COMMAND: Final = 16 * 1024
LABEL_START: Final = "corral.e2b.start-cmd"
LABEL_READY: Final = "corral.e2b.ready-cmd"
LABEL_USER: Final = "corral.e2b.user"
LABEL_WORKDIR: Final = "corral.e2b.workdir"
START_LOG: Final = ".corral-start.log"
"""In the start user's home: the start command's output."""
E2B_BASE_IMAGES: Final = ("e2bdev/base", "e2bdev/base:latest")
DEFAULT_TEMPLATE: Final = "base"
E2B_USER: Final = "user"
E2B_HOME: Final = "/home/user"
StepType = Literal["RUN", "COPY", "ENV", "WORKDIR", "USER"]
_STEP_TYPES: Final = ("RUN", "COPY", "ENV", "WORKDIR", "USER")
# A Docker repository path component: what a template name becomes in `corral-templates/<name>`.
_NAME = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_HASH = re.compile(r"^[0-9a-f]{64}$")
_BUILD_ID = re.compile(r"^[0-9a-f-]{36}$")
_ACCOUNT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEEPALIVE: Final = ["/bin/sh", "-c", "while :; do sleep 3600; done"]
# Resolves "user[:group]" to numeric ids inside the build container (names are the image's, not the host's).
_OWNER_SCRIPT: Final = r"""
u="$1"; g="$2"
case "$u" in *[!0-9]*) uid=$(id -u "$u") || exit 3;; *) uid=$u;; esac
if [ -z "$g" ]; then
  case "$u" in *[!0-9]*) gid=$(id -g "$u") || exit 3;; *) gid=$u;; esac
else
  case "$g" in
    *[!0-9]*) gid=$(sed -n "s/^$g:[^:]*:\([0-9]*\):.*/\1/p" /etc/group | head -n 1); [ -n "$gid" ] || exit 4;;
    *) gid=$g;;
  esac
fi
echo "$uid $gid"
"""


# --- values and parsing -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TemplateRef:
    """A template name with one of its tags."""

    name: str
    tag: str = DEFAULT_TAG

    @property
    def image(self) -> str:
        """The Docker image holding this tag of the template."""
        return f"{TEMPLATE_REPO}/{self.name}:{self.tag}"


@dataclass(frozen=True, slots=True)
class Step:
    """One build step as the SDK sends it."""

    type: StepType
    args: tuple[str, ...]
    files_hash: str | None = None


@dataclass(frozen=True, slots=True)
class BuildSpec:
    """A validated ``TemplateBuildStartV2``: where the build starts from and its steps."""

    from_image: str | None
    from_template: str | None
    steps: tuple[Step, ...]
    start_cmd: str | None = None
    ready_cmd: str | None = None


@dataclass(frozen=True, slots=True)
class StartCommand:
    """What a sandbox of a template runs when it starts (``set_start_cmd``/``set_ready_cmd``), as whom and where."""

    start: str | None
    ready: str | None
    user: str
    workdir: str


@dataclass(frozen=True, slots=True)
class TemplateImage:
    """The image a ``templateID`` names, and the start command of the template built here it may be."""

    image: str
    start: StartCommand | None = None


def parse_template_name(value: object, *, field_name: str = "name") -> TemplateRef:
    """``name`` or ``name:tag`` as a :class:`TemplateRef`.

    Raises:
        InvalidRequestError: not a string, or the name or tag breaks the rules the message states.
    """
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{field_name}: a template name is required ('name' or 'name:tag')")
    name, sep, tag = value.partition(":")
    if not _NAME.match(name) or len(name) > 64:
        raise InvalidRequestError(
            f"{field_name}: template name {name!r} is invalid; use 1-64 lowercase letters and digits, separated by "
            "single '.' or '_', '__', or dashes (e.g. 'my-template')",
            details={"field": field_name},
        )
    return TemplateRef(name, parse_tags([tag], field_name=field_name)[0] if sep else DEFAULT_TAG)


def parse_tags(value: object, *, field_name: str = "tags") -> list[str]:
    """A list of tags, each valid, without duplicates (first kept).

    Raises:
        InvalidRequestError: not a list of strings, or a tag breaks the rules the message states.
    """
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise InvalidRequestError(f"{field_name}: must be a list of tag strings")
    tags: list[str] = []
    for tag in value:
        if not _TAG.match(tag):
            raise InvalidRequestError(
                f"{field_name}: tag {tag!r} is invalid; use 1-128 letters, digits, '_', '.' or '-', not starting "
                "with '.' or '-' (e.g. 'v1.2', 'stable')",
                details={"field": field_name},
            )
        if tag not in tags:
            tags.append(tag)
    return tags


def _step(index: int, raw: object) -> Step:
    where = f"steps[{index}]"
    if not isinstance(raw, Mapping):
        raise InvalidRequestError(f"{where}: must be an object with 'type' and 'args'")
    kind = raw.get("type")
    if kind not in _STEP_TYPES:
        raise InvalidRequestError(f"{where}.type: {kind!r} is not a step type; allowed: {', '.join(_STEP_TYPES)}")
    args = raw.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise InvalidRequestError(f"{where}.args: must be a list of strings")
    counts = {"RUN": (1, 2), "COPY": (2, 4), "WORKDIR": (1, 1), "USER": (1, 1), "ENV": (2, 10_000)}
    low, high = counts[kind]
    if not low <= len(args) <= high or (kind == "ENV" and len(args) % 2):
        shape = "name/value pairs" if kind == "ENV" else f"{low} to {high} arguments"
        raise InvalidRequestError(f"{where}: a {kind} step takes {shape}, got {len(args)}")
    if kind == "COPY":
        args = [*args, "", ""][:4]  # src, dest, owner, mode: the SDK sends all four, a Dockerfile's COPY too
    files_hash = raw.get("filesHash")
    _check_args(where, kind, args, files_hash)
    return Step(kind, tuple(args), files_hash if kind == "COPY" else None)


def _check_args(where: str, kind: str, args: list[str], files_hash: object) -> None:
    """What each step type requires of its arguments."""
    if kind == "COPY":
        if not isinstance(files_hash, str) or not _HASH.match(files_hash):
            raise InvalidRequestError(f"{where}.filesHash: a COPY step needs the 64-hex-digit hash of its files")
        if args[3] and not re.fullmatch(r"0?[0-7]{3,4}", args[3]):
            raise InvalidRequestError(f"{where}: mode {args[3]!r} is not an octal file mode (e.g. '0755')")
        owner = args[2].split(":") if args[2] else []
        if len(owner) > 2 or not all(_ACCOUNT.match(part) for part in owner):
            raise InvalidRequestError(f"{where}: owner {args[2]!r} is not 'user' or 'user:group'")
    elif kind == "USER" and not _ACCOUNT.match(args[0]):
        raise InvalidRequestError(f"{where}: {args[0]!r} is not a user name")
    elif kind == "RUN" and len(args) == 2 and args[1] and not _ACCOUNT.match(args[1]):
        raise InvalidRequestError(f"{where}: {args[1]!r} is not a user name")
    elif kind == "ENV":
        bad = [k for k in args[::2] if not _ENV_KEY.match(k)]
        if bad:
            raise InvalidRequestError(f"{where}: {bad[0]!r} is not an environment variable name")
    elif kind == "WORKDIR" and not args[0]:
        raise InvalidRequestError(f"{where}: WORKDIR needs a path")


def parse_build_start(body: Mapping[str, Any]) -> BuildSpec:
    """Validate a ``TemplateBuildStartV2`` body.

    Raises:
        InvalidRequestError: what is wrong with it, and what is allowed.
    """
    registry = body.get("fromImageRegistry")
    if registry:
        kind = registry.get("type") if isinstance(registry, Mapping) else None
        raise InvalidRequestError(
            f"fromImageRegistry: Corral never pulls from a registry ({kind or 'credentials'} given); load the image "
            "on the host with `docker load` and use from_image(name) without credentials"
        )
    commands = {key: body.get(key) or None for key in ("startCmd", "readyCmd")}
    for key, command in commands.items():
        if command is not None and (not isinstance(command, str) or len(command) > MAX_COMMAND or "\x00" in command):
            raise InvalidRequestError(f"{key}: must be a shell command of at most {MAX_COMMAND} characters")
    from_image, from_template = body.get("fromImage"), body.get("fromTemplate")
    if (from_image is None) == (from_template is None):
        raise InvalidRequestError("fromImage, fromTemplate: give exactly one base (from_image or from_template)")
    for key, value in (("fromImage", from_image), ("fromTemplate", from_template)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InvalidRequestError(f"{key}: must be a non-empty string")
    steps = body.get("steps") or []
    if not isinstance(steps, list):
        raise InvalidRequestError("steps: must be a list")
    parsed = tuple(_step(i, s) for i, s in enumerate(steps))
    return BuildSpec(from_image, from_template, parsed, commands["startCmd"], commands["readyCmd"])


def _join(workdir: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(workdir, path))


def rewrite_copy_archive(
    upload: Path, out: Path, dest: str, *, into_dir: bool, uid: int, gid: int, mode: int | None
) -> int:
    """Rewrite the SDK's archive of a ``copy`` (paths relative to the build context) into one that extracts at ``/``
    with Docker's ``COPY`` semantics; returns the number of entries.

    A directory among the sources copies its contents into ``dest``; a file goes to ``dest`` itself, or into it when
    ``dest`` is a directory (``into_dir``: it ends with ``/`` or is one in the image) or there are several sources.
    Every entry is owned by ``uid:gid``; ``mode``, when given, applies to files and directories.

    Raises:
        InvalidRequestError: the archive is not a tar file, or holds an entry that is no file, directory or link, or a
            path outside the context.
    """
    try:
        with tarfile.open(upload, "r|*") as source:  # two streaming passes: gzip seeks backwards badly
            names = [_member_name(m) for m in source]
        with tarfile.open(upload, "r|*") as source, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as target:
            present = set(names)
            roots = {n for n in names if posixpath.dirname(n) not in present}
            if not roots:
                raise InvalidRequestError("copy: the uploaded archive is empty")
            kinds: dict[str, bool] = {}
            mapped: dict[str, str] = {}
            count = 0
            for member in source:
                name = _member_name(member)
                root = next(r for r in _ancestors(name) if r in roots)
                if root == name:
                    kinds[root] = member.isdir()
                if kinds.get(root, False):
                    relative = posixpath.relpath(name, root)
                    path = dest if relative == "." else posixpath.join(dest, relative)
                elif into_dir or len(roots) > 1:
                    path = posixpath.join(dest, posixpath.relpath(name, posixpath.dirname(root) or "."))
                else:
                    path = dest if name == root else posixpath.join(dest, posixpath.relpath(name, root))
                path = posixpath.normpath(path).lstrip("/") or "."
                mapped[name] = path
                copy = tarfile.TarInfo(path)
                copy.type, copy.size, copy.mtime = member.type, member.size, member.mtime
                copy.mode = member.mode if mode is None or member.issym() or member.islnk() else mode
                copy.uid, copy.gid, copy.uname, copy.gname = uid, gid, "", ""
                if member.issym():
                    copy.linkname = member.linkname
                elif member.islnk():
                    linked = mapped.get(posixpath.normpath(member.linkname))
                    if linked is None:
                        raise InvalidRequestError(f"copy: hard link {name!r} points outside the copied files")
                    copy.linkname = linked
                target.addfile(copy, source.extractfile(member) if member.isreg() else None)
                count += 1
    except tarfile.TarError as exc:
        raise InvalidRequestError(f"copy: the uploaded archive is not a readable tar file ({exc})") from exc
    return count


def _member_name(member: tarfile.TarInfo) -> str:
    name = posixpath.normpath(member.name)
    if name.startswith(("/", "../")) or name == "..":
        raise InvalidRequestError(f"copy: archive entry {member.name!r} is outside the build context")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise InvalidRequestError(f"copy: archive entry {member.name!r} is not a file, directory or link")
    return name


def _ancestors(name: str) -> Iterable[str]:
    """``name`` and its parents, nearest first."""
    while name:
        yield name
        parent = posixpath.dirname(name)
        if parent == name:
            break
        name = parent


# --- builds -------------------------------------------------------------------------------------------------------


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(slots=True)
class Build:
    """One build's progress, in memory: its status and its last :data:`MAX_LOG_ENTRIES` log entries."""

    template: TemplateRef
    build_id: str
    tags: list[str]
    cpu_count: int | None = None
    memory_mb: int | None = None
    status: Literal["waiting", "building", "ready", "error"] = "waiting"
    reason: dict[str, Any] | None = None
    entries: deque[dict[str, str]] = field(default_factory=lambda: deque(maxlen=MAX_LOG_ENTRIES))
    dropped: int = 0
    """Entries pushed out of ``entries``: the offset of its first one."""
    finished_at: float | None = None
    hashes: frozenset[str] = frozenset()
    """The archives its copy steps use."""
    _partial: str = ""

    def log(self, message: str, *, level: str = "info", step: str | None = None) -> None:
        """Add one log entry (cut to :data:`MAX_LOG_LINE` characters)."""
        if len(self.entries) == self.entries.maxlen:
            self.dropped += 1
        entry = {"timestamp": _now_iso(), "level": level, "message": message[:MAX_LOG_LINE]}
        if step is not None:
            entry["step"] = step
        self.entries.append(entry)

    def output(self, data: bytes, step: str) -> None:
        """A command's output, logged a line at a time."""
        text = self._partial + data.decode(errors="replace")
        *lines, self._partial = text.split("\n")
        if len(self._partial) > MAX_LOG_LINE:
            lines.append(self._partial)
            self._partial = ""
        for line in lines:
            self.log(line.rstrip("\r"), step=step)

    def flush(self, step: str) -> None:
        """Log what is left of a command's output after its last newline."""
        if self._partial:
            self.log(self._partial, step=step)
            self._partial = ""

    def fail(self, message: str, step: str) -> None:
        """End the build in error."""
        self.log(message, level="error", step=step)
        self.status = "error"
        self.reason = {"message": message, "step": step, "logEntries": list(self.entries)[-20:]}

    def page(self, offset: int, limit: int, level: str | None) -> list[dict[str, str]]:
        """Entries from absolute ``offset`` on, at most ``limit``, at or above ``level``."""
        order = ("debug", "info", "warn", "error")
        floor = order.index(level) if level in order else 0
        start = max(0, offset - self.dropped)
        selected = [e for e in list(self.entries)[start:] if order.index(e["level"]) >= floor]
        return selected[:limit]


class _StepFailedError(Exception):
    def __init__(self, message: str, step: str) -> None:
        super().__init__(message)
        self.message = message
        self.step = step


@dataclass(slots=True)
class _Context:
    """What later steps inherit from earlier ones."""

    user: str
    workdir: str
    env: dict[str, str]
    has_e2b_user: bool


class TemplatesState:
    """The template API's state for one app: the Docker engine, builds in flight, uploaded archives."""

    def __init__(
        self,
        engine: DockerEngine,
        upload_dir: Path,
        base_image: str,
        *,
        owner: str,
        runtime: str | None = None,
        always_deny: tuple[str, ...] = (),
    ) -> None:
        self.engine = engine
        self.runtime = runtime
        self.always_deny = always_deny
        """CORRAL_EGRESS_ALWAYS_DENY: build steps reach the internet, not other workspaces or the host."""
        """The dockerd runtime of build containers: gVisor's networked one when registered (steps are code to
        contain, as a workspace's commands are), else Docker's default."""
        self.owner = owner
        """This installation's ``corral.owner``: its build containers are named with it, so a server removes only its
        own leftovers (templates themselves are the host's images, shared by every server on the engine)."""
        # No labels on build containers: `docker commit` would copy them onto the template's image.
        self._container_prefix = f"corral-e2b-build-{owner}-"
        self.upload_dir = upload_dir
        self.base_image = base_image
        self._key = secrets.token_bytes(32)  # upload URLs are good for this server's lifetime
        self.builds: dict[str, Build] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._tag_lock = asyncio.Lock()  # tags move between images: one move at a time

    # --- uploads --------------------------------------------------------------------------------------------------

    def signature(self, template_id: str, files_hash: str) -> str:
        """The signature of the upload URL of one archive."""
        digest = hmac.new(self._key, f"{template_id}/{files_hash}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    def upload_path(self, template_id: str, files_hash: str) -> Path:
        """Where an uploaded archive is kept until its build ends."""
        return self.upload_dir / template_id / f"{files_hash}.tar"

    def release(self, build: Build) -> None:
        """Delete the archives of a finished build that no other build of the template waits for or uses."""
        others = [b for b in self.builds.values() if b.template.name == build.template.name and b.finished_at is None]
        kept = set().union(*(b.hashes for b in others if b.status == "building"))
        if any(b.status == "waiting" for b in others):
            return  # a build still being requested may be about to use any archive here
        for files_hash in build.hashes - kept:
            self.upload_path(build.template.name, files_hash).unlink(missing_ok=True)

    # --- builds ---------------------------------------------------------------------------------------------------

    def register(self, build: Build) -> None:
        """Remember a new build; forget the oldest finished ones past :data:`MAX_FINISHED_BUILDS`."""
        self.builds[build.build_id] = build
        finished = sorted(
            (b for b in self.builds.values() if b.finished_at is not None), key=lambda b: b.finished_at or 0
        )
        for old in finished[: max(0, len(finished) - MAX_FINISHED_BUILDS)]:
            del self.builds[old.build_id]

    def start(self, build: Build, spec: BuildSpec, base: str) -> None:
        """Run the build in the background."""
        build.status = "building"
        build.hashes = frozenset(s.files_hash for s in spec.steps if s.files_hash is not None)
        task = asyncio.create_task(self._run(build, spec, base), name=f"e2b-template-build-{build.build_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def resolve_base(self, spec: BuildSpec) -> str:
        """The id of the image a build starts from, which must be on this host.

        Raises:
            InvalidRequestError: no such image or template here, saying how to get one.
        """
        if spec.from_template is not None:
            if spec.from_template == DEFAULT_TEMPLATE:
                name = self.base_image
            else:
                name = parse_template_name(spec.from_template, field_name="fromTemplate").image
            image = await self.engine.inspect_image(name)
            if image is None:
                raise InvalidRequestError(
                    f"fromTemplate: template {spec.from_template!r} does not exist on this server (image {name!r} "
                    "is not present); build it first, or use from_image with an image on this host"
                )
            return str(image["Id"])
        assert spec.from_image is not None
        image = await self.engine.inspect_image(spec.from_image)
        if image is None and spec.from_image in E2B_BASE_IMAGES:
            image = await self.engine.inspect_image(self.base_image)
        if image is None:
            raise InvalidRequestError(
                f"fromImage: image {spec.from_image!r} is not present on this host, and Corral never pulls from a "
                "registry. Load it where dockerd runs (`docker save IMAGE > image.tar` elsewhere, then "
                "`docker load -i image.tar`), or build Corral's base image with `corral image build` and use "
                f"from_template('base'); `docker images` lists what is present",
                details={"field": "fromImage", "image": spec.from_image},
            )
        return str(image["Id"])

    async def _run(self, build: Build, spec: BuildSpec, base: str) -> None:
        container = f"{self._container_prefix}{build.build_id}"
        failure: tuple[str, str] | None = None
        try:
            async with asyncio.timeout(BUILD_TIMEOUT_S):
                await self._build(build, spec, base, container)
        except _StepFailedError as exc:
            failure = (exc.message, exc.step)
        except TimeoutError:
            failure = (f"the build took longer than {BUILD_TIMEOUT_S:.0f} s and was stopped", "finalize")
        except (DockerAPIError, CorralError, OSError) as exc:
            failure = (f"the build failed: {exc}", "finalize")
        except Exception as exc:
            log.exception("template build %s failed", build.build_id)
            failure = (f"the build failed unexpectedly ({type(exc).__name__}); see the server log", "finalize")
        finally:
            try:
                await self.engine.remove_container(container)
            except DockerAPIError as exc:  # the next server start removes it (remove_leftovers)
                log.warning("could not remove build container %s: %s", container, exc)
            build.finished_at = time.time()
            self.release(build)
        # Only now, with the container gone: whoever sees the build end sees nothing of it left.
        if failure is not None:
            build.fail(*failure)
        else:
            build.status = "ready"
            build.log("Build finished")

    async def _build(self, build: Build, spec: BuildSpec, base: str, container: str) -> None:
        build.log(f"Starting from {spec.from_image or spec.from_template}", step="base")
        host_config: dict[str, Any] = {"Init": True, "PidsLimit": 4096}
        if self.runtime is not None:
            host_config["Runtime"] = self.runtime
        if build.cpu_count:
            host_config["NanoCpus"] = build.cpu_count * 1_000_000_000
        if build.memory_mb:
            host_config["Memory"] = host_config["MemorySwap"] = build.memory_mb * 1024 * 1024
        config = {
            "Image": base,
            "Entrypoint": [],
            "Cmd": _KEEPALIVE,
            "User": "root",
            "WorkingDir": "/",
            "HostConfig": host_config,
        }
        try:
            await self.engine.create_container(container, config)
            await self.engine.start_container(container)
            info = await self.engine.inspect_container(container)
        except DockerAPIError as exc:
            raise _StepFailedError(f"cannot start a build container from the base image: {exc}", "base") from exc
        try:
            await restrict_container(info or {}, self.always_deny)
        except OSError as exc:
            log.warning("build container %s: egress rules could not be put in force: %s", container, exc)
            raise _StepFailedError(
                "cannot restrict the build container's network (see the server log)", "base"
            ) from exc
        has_user = await self._exec(container, ["id", "-u", E2B_USER], build=None) == 0
        ctx = _Context(E2B_USER if has_user else "root", E2B_HOME if has_user else "/", {}, has_user)
        for index, step in enumerate(spec.steps):
            name = str(index + 1)  # the SDK's stack traces: 0 is the base, then one per step
            build.log(f"[{name}/{len(spec.steps)}] {step.type} {' '.join(step.args)}"[:MAX_LOG_LINE], step=name)
            await self._step(build, container, step, ctx, name)
        build.log("Saving the template image", step="finalize")
        await self._commit(build, spec, container, base, ctx)

    async def _step(self, build: Build, container: str, step: Step, ctx: _Context, name: str) -> None:
        if step.type == "RUN":
            user = step.args[1] if len(step.args) > 1 and step.args[1] else ctx.user
            # All output on stderr: it reaches the log a frame at a time, as it is written.
            code = await self._exec(
                container, ["/bin/sh", "-c", "exec 1>&2\n" + step.args[0]], build=build, step=name, user=user,
                workdir=ctx.workdir, env=ctx.env,
            )  # fmt: skip
            if code != 0:
                raise _StepFailedError(f"step {name}: the command exited with {code}: {step.args[0]}"[:2000], name)
        elif step.type == "ENV":
            ctx.env.update(zip(step.args[::2], step.args[1::2], strict=True))
        elif step.type == "WORKDIR":
            path = _join(ctx.workdir, step.args[0])
            if await self._exec(container, ["mkdir", "-p", path], build=build, step=name) != 0:
                raise _StepFailedError(f"step {name}: cannot create the working directory {path}", name)
            ctx.workdir = path
        elif step.type == "USER":
            user = step.args[0]
            if await self._exec(container, ["id", "-u", user], build=None) == 0:
                ctx.user = user
            elif user == E2B_USER:  # from_dockerfile ends with USER user; an image without it builds as root
                build.log(f"the image has no user {E2B_USER!r}; later steps run as root", level="warn", step=name)
                ctx.user = "root"
            else:
                raise _StepFailedError(f"step {name}: user {user!r} does not exist in the image", name)
        else:
            await self._copy(build, container, step, ctx, name)

    async def _copy(self, build: Build, container: str, step: Step, ctx: _Context, name: str) -> None:
        assert step.files_hash is not None
        upload = self.upload_path(build.template.name, step.files_hash)
        if not upload.is_file():
            raise _StepFailedError(f"step {name}: the files of COPY {step.args[0]} were not uploaded", name)
        src, dest, owner, mode = (*step.args, "", "")[:4]
        dest_path = _join(ctx.workdir, dest)
        into_dir = dest.endswith("/") or await self._exec(container, ["test", "-d", dest_path], build=None) == 0
        user, _, group = (owner or ctx.user).partition(":")
        out = bytearray()
        if await self._exec(container, ["/bin/sh", "-c", _OWNER_SCRIPT, "owner", user, group], build=None, out=out):
            raise _StepFailedError(f"step {name}: owner {owner or ctx.user!r} does not exist in the image", name)
        uid, gid = (int(part) for part in out.decode().split())
        rewritten = upload.with_suffix(".copy.tar")
        try:
            count = await asyncio.to_thread(
                rewrite_copy_archive, upload, rewritten, dest_path, into_dir=into_dir, uid=uid, gid=gid,
                mode=int(mode, 8) if mode else None,
            )  # fmt: skip
        except InvalidRequestError as exc:
            raise _StepFailedError(f"step {name}: {exc.message}", name) from exc
        try:
            code = await self._exec(
                container, ["tar", "-x", "-p", "--numeric-owner", "-C", "/", "-f", "-"], build=build, step=name,
                stdin=rewritten,
            )  # fmt: skip
        finally:
            rewritten.unlink(missing_ok=True)
        if code != 0:
            raise _StepFailedError(f"step {name}: extracting the files of COPY {src} failed (tar exit {code})", name)
        build.log(f"copied {count} entries to {dest_path}", step=name)

    async def _exec(
        self,
        container: str,
        cmd: list[str],
        *,
        build: Build | None,
        step: str = "",
        user: str = "root",
        workdir: str = "/",
        env: Mapping[str, str] | None = None,
        stdin: Path | None = None,
        out: bytearray | None = None,
    ) -> int:
        """Run ``cmd`` in the build container; its output goes to the build's log (or nowhere) and, up to 64 KiB of
        stdout, to ``out``. Returns the exit code."""

        def on_output(data: bytes) -> None:
            if build is not None:
                build.output(data, step)

        stream = await self.engine.exec_attached(
            container, cmd, on_stderr=on_output, user=user, working_dir=workdir,
            env=[f"{k}={v}" for k, v in (env or {}).items()],
        )  # fmt: skip
        try:
            if stdin is not None:
                with stdin.open("rb") as source:
                    while chunk := await asyncio.to_thread(source.read, 256 * 1024):
                        stream.writer.write(chunk)
                        await stream.writer.drain()
            stream.writer.write_eof()
            while True:
                try:
                    data = await stream.readexactly(4096)
                except asyncio.IncompleteReadError as exc:
                    data = exc.partial
                    done = True
                else:
                    done = False
                if out is not None and len(out) < 65536:
                    out += data
                on_output(data)
                if done:
                    break
        finally:
            stream.writer.close()
            if build is not None:
                build.flush(step)
        deadline = time.monotonic() + 30
        while True:
            result = await self.engine.request("GET", f"/exec/{stream.exec_id}/json")
            if not result.get("Running") or time.monotonic() > deadline:
                return int(result.get("ExitCode") if result.get("ExitCode") is not None else -1)
            await asyncio.sleep(0.05)

    async def _commit(self, build: Build, spec: BuildSpec, container: str, base: str, ctx: _Context) -> None:
        base_config = dict((await self.engine.inspect_image(base) or {}).get("Config") or {})
        env = list(base_config.get("Env") or [])
        for key, value in ctx.env.items():
            env = [e for e in env if not e.startswith(f"{key}=")] + [f"{key}={value}"]
        labels = {**(base_config.get("Labels") or {}), LABEL_TEMPLATE: build.template.name, LABEL_BUILD: build.build_id}
        # A template built on another one starts as it says, or as its base did.
        start = {
            LABEL_START: spec.start_cmd,
            LABEL_READY: spec.ready_cmd,
            LABEL_USER: ctx.user,
            LABEL_WORKDIR: ctx.workdir,
        }
        labels |= {key: value for key, value in start.items() if value is not None}
        config = {**base_config, "Env": env, "Labels": labels}
        first, *others = build.tags
        async with self._tag_lock:
            previous = await self._tagged_images(build.template.name, build.tags)
            result = await self.engine.request(
                "POST",
                "/commit",
                params={"container": container, "repo": f"{TEMPLATE_REPO}/{build.template.name}", "tag": first},
                body=config,
                timeout=600.0,
            )
            image_id = str(result["Id"])
            try:
                for tag in others:
                    await self._tag(image_id, TemplateRef(build.template.name, tag))
            except DockerAPIError:
                await self.engine.remove_image(image_id, force=True)
                raise
            await self._drop_untagged(previous - {image_id})

    # --- images ---------------------------------------------------------------------------------------------------

    async def _tag(self, image: str, ref: TemplateRef) -> None:
        await self.engine.request(
            "POST", f"/images/{image}/tag", params={"repo": f"{TEMPLATE_REPO}/{ref.name}", "tag": ref.tag}
        )

    async def _tagged_images(self, name: str, tags: Iterable[str]) -> set[str]:
        """Ids of the images now holding these tags of a template."""
        ids = set()
        for tag in tags:
            image = await self.engine.inspect_image(TemplateRef(name, tag).image)
            if image is not None:
                ids.add(str(image["Id"]))
        return ids

    async def _drop_untagged(self, image_ids: Iterable[str]) -> None:
        """Remove the images that moving tags left without any (they would be dangling)."""
        for image_id in image_ids:
            image = await self.engine.inspect_image(image_id)
            if image is not None and not image.get("RepoTags"):
                try:
                    await self.engine.remove_image(image_id)
                except DockerAPIError as exc:  # a sandbox still runs on it: it goes with the last tag's container
                    log.warning("template image %s is untagged but still in use: %s", image_id, exc)

    async def images(self, name: str) -> list[dict[str, Any]]:
        """The images of a template (one per build still holding a tag)."""
        return await self.engine.list_images([f"{LABEL_TEMPLATE}={name}"])

    async def tags(self, name: str) -> list[dict[str, Any]]:
        """``TemplateTag`` for every tag of a template, newest build first."""
        repo = f"{TEMPLATE_REPO}/{name}:"
        out = []
        for image in sorted(await self.images(name), key=lambda i: -int(i.get("Created") or 0)):
            created = datetime.fromtimestamp(int(image.get("Created") or 0), UTC).isoformat()
            build_id = (image.get("Labels") or {}).get(LABEL_BUILD, "")
            for ref in image.get("RepoTags") or []:
                if ref.startswith(repo):
                    out.append({"tag": ref.removeprefix(repo), "buildID": build_id, "createdAt": created})
        return out

    async def assign(self, target: TemplateRef, tags: list[str]) -> str:
        """Point ``tags`` at the build ``target`` names; returns that build's id.

        Raises:
            E2BApiError: 404 when ``target`` does not exist.
        """
        async with self._tag_lock:
            image = await self.engine.inspect_image(target.image)
            if image is None:
                raise E2BApiError(404, f"template '{target.name}' has no tag '{target.tag}'")
            previous = await self._tagged_images(target.name, tags)
            for tag in tags:
                await self._tag(str(image["Id"]), TemplateRef(target.name, tag))
            await self._drop_untagged(previous - {str(image["Id"])})
        return str(((image.get("Config") or {}).get("Labels") or {}).get(LABEL_BUILD, ""))

    async def untag(self, name: str, tags: list[str]) -> None:
        """Remove tags of a template; a build left without tags goes with them.

        Raises:
            E2BApiError: 404 when the template lacks one of ``tags`` (then none is removed).
        """
        async with self._tag_lock:
            for tag in tags:
                if await self.engine.inspect_image(TemplateRef(name, tag).image) is None:
                    raise E2BApiError(404, f"template '{name}' has no tag '{tag}'")
            for tag in tags:
                await self._remove_ref(TemplateRef(name, tag).image)

    async def delete(self, name: str) -> None:
        """Remove every image of a template.

        Raises:
            E2BApiError: 404 when there is none; 409 when a sandbox still uses one.
        """
        async with self._tag_lock:
            images = await self.images(name)
            if not images:
                raise E2BApiError(404, f"template '{name}' not found")
            for image in images:
                for ref in image.get("RepoTags") or []:
                    await self._remove_ref(ref)

    async def _remove_ref(self, ref: str) -> None:
        try:
            await self.engine.remove_image(ref)
        except DockerAPIError as exc:
            if exc.status == 409:
                raise E2BApiError(
                    409, f"{ref} is used by a sandbox or another image ({exc.message}); kill its sandboxes first"
                ) from exc
            raise

    async def remove_leftovers(self) -> None:
        """Remove build containers a previous server left behind (it stopped mid-build)."""
        with contextlib.suppress(DockerAPIError):
            filters = json.dumps({"name": [f"^/{self._container_prefix}"]})
            found = await self.engine.request("GET", "/containers/json", params={"all": "true", "filters": filters})
            for info in found or []:
                await self.engine.remove_container(str(info["Id"]))

    async def aclose(self) -> None:
        """Stop the builds in flight (their containers are removed) and close the engine."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.engine.aclose()


async def resolve_template(docker_host: str, template: str) -> TemplateImage:
    """The image a sandbox's ``templateID`` names: the template built here (``name`` or ``name:tag``) when there is
    one, with its start command, else ``template`` itself (an image on the host)."""
    try:
        ref = parse_template_name(template)
    except InvalidRequestError:
        return TemplateImage(template)
    engine = DockerEngine.from_url(docker_host)
    try:
        image = await engine.inspect_image(ref.image)
    except DockerAPIError:
        image = None
    finally:
        await engine.aclose()
    if image is None:
        return TemplateImage(template)
    labels = (image.get("Config") or {}).get("Labels") or {}
    start, ready = labels.get(LABEL_START), labels.get(LABEL_READY)
    if not start and not ready:
        return TemplateImage(ref.image)
    user, workdir = labels.get(LABEL_USER) or E2B_USER, labels.get(LABEL_WORKDIR) or E2B_HOME
    return TemplateImage(ref.image, StartCommand(start or None, ready or None, user, workdir))


async def run_start_command(
    service: WorkspaceService, workspace_id: str, start: StartCommand, envs: Mapping[str, str]
) -> None:
    """Start a template's start command in a new sandbox (in its own session, so it outlives the call; its output
    goes to ``~/.corral-start.log``) and wait until its ready command succeeds; on failure the sandbox is destroyed.

    Raises:
        E2BApiError: 500 when the start command cannot be started or the ready command does not succeed within
            :data:`READY_TIMEOUT_S` (the message shows the end of the start command's output).
    """
    try:
        await _start_and_wait(service, workspace_id, start, envs)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(service.destroy(workspace_id))
        raise


async def _start_and_wait(
    service: WorkspaceService, workspace_id: str, start: StartCommand, envs: Mapping[str, str]
) -> None:
    def request(command: str, timeout_s: float) -> ExecRequest:
        return ExecRequest(command, cwd=start.workdir, env=dict(envs), user=start.user, timeout_s=timeout_s)

    if start.start is not None:
        # The command's process group ends with the exec: answer only once the daemon has its own session (it
        # writes its pid file after setsid), or it may be killed with the group before it left.
        daemon = 'echo $$ > "$1"; exec /bin/sh -c "$2"'
        launch = (
            f'pid="$HOME/{START_LOG}.pid"; rm -f "$pid"; '
            f'setsid /bin/sh -c {shlex.quote(daemon)} start "$pid" {shlex.quote(start.start)} '
            f'> "$HOME/{START_LOG}" 2>&1 < /dev/null & '
            'i=0; while [ ! -s "$pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done; [ -s "$pid" ]'
        )
        launched = await service.exec(workspace_id, request(launch, 30))
        if launched.exit_code != 0:
            detail = launched.stderr.decode(errors="replace")[-1000:]
            raise E2BApiError(500, f"the template's start command could not be started: {detail}")
    if start.ready is None:
        return
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        remaining = deadline - time.monotonic()
        checked = await service.exec(workspace_id, request(start.ready, max(1.0, min(remaining, 30))))
        if checked.exit_code == 0:
            return
        if time.monotonic() >= deadline:
            tail = await service.exec(workspace_id, request(f'tail -c 1000 "$HOME/{START_LOG}" 2>/dev/null', 10))
            output = tail.stdout.decode(errors="replace").strip()
            raise E2BApiError(
                500,
                f"the template's ready command did not succeed within {READY_TIMEOUT_S:.0f} s ({start.ready!r} "
                f"exited with {checked.exit_code}); the start command's output: {output or '(none)'}",
            )
        await asyncio.sleep(0.5)  # each check is a process in the sandbox: poll, but not in a tight loop


# --- the routers --------------------------------------------------------------------------------------------------


def _templates(request: Request) -> TemplatesState:
    state: TemplatesState = request.app.state.e2b_templates
    return state


def _answer_errors(handler: Callable[[Request], Coroutine[Any, Any, Response]]) -> Callable[..., Any]:
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except E2BApiError as exc:
            return e2b_error(exc.status, exc.message)
        except CorralError as exc:
            return e2b_error(status_of(exc), exc.message)
        except DockerAPIError as exc:
            return e2b_error(500, f"the Docker engine failed: {exc}")

    return route


class _TemplateRoute(APIRoute):
    """Checks the API key (as the control plane does) and answers every failure in E2B's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = _answer_errors(super().get_route_handler())

        async def route(request: Request) -> Response:
            key = request.headers.get("x-api-key")
            if key is None:
                scheme, _, token = request.headers.get("authorization", "").partition(" ")
                key = token.strip() if scheme.lower() == "bearer" else None
            e2b: E2BState = request.app.state.e2b
            if key is None or not e2b.api_key_matches(key):
                return e2b_error(401, "Invalid API key: send X-API-KEY: <CORRAL_API_TOKEN>")
            response: Response = await handler(request)
            return response

        return route


class _UploadRoute(APIRoute):
    """Checks the upload URL's signature instead of an API key (the SDK sends none to it)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler: Callable[[Request], Coroutine[Any, Any, Response]] = _answer_errors(super().get_route_handler())
        return handler


def _optional_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError(f"{key}: must be a non-negative integer")
    return value


async def request_build(request: Request) -> JSONResponse:
    """``POST /v3/templates``: register a build of ``name`` (``name:tag``) with ``tags``."""
    body = await json_body(request)
    ref = parse_template_name(body.get("name") or body.get("alias"))
    extra = parse_tags(body.get("tags") or [])
    given = body.get("name") or body.get("alias") or ""
    tags = parse_tags(([ref.tag] if ":" in given else []) + extra) or [DEFAULT_TAG]
    build = Build(
        ref, str(uuid.uuid4()), tags, cpu_count=_optional_int(body, "cpuCount"),
        memory_mb=_optional_int(body, "memoryMB"),
    )  # fmt: skip
    _templates(request).register(build)
    build.log(f"Build {build.build_id} of template {ref.name} with tags {', '.join(tags)} registered")
    answer = {
        "templateID": ref.name,
        "buildID": build.build_id,
        "public": False,
        "names": [ref.name],
        "tags": tags,
        "aliases": [ref.name],
    }
    return JSONResponse(answer, status_code=202)


def _build_of(state: TemplatesState, template_id: str, build_id: str) -> Build | None:
    build = state.builds.get(build_id)
    return build if build is not None and build.template.name == template_id else None


async def upload_link(request: Request) -> JSONResponse:
    """``GET /templates/{id}/files/{hash}``: whether the archive is here, and the signed URL to ``PUT`` it to."""
    template_id, files_hash = request.path_params["template_id"], request.path_params["files_hash"]
    state = _templates(request)
    _check_upload_target(state, template_id, files_hash)
    url = request.url.replace(query=f"signature={state.signature(template_id, files_hash)}")
    present = state.upload_path(template_id, files_hash).is_file()
    return JSONResponse({"present": present, "url": str(url)}, status_code=201)


def _check_upload_target(state: TemplatesState, template_id: str, files_hash: str) -> None:
    if not _HASH.match(files_hash):
        raise E2BApiError(400, f"files hash {files_hash!r} is not 64 lowercase hex digits")
    if not any(b.template.name == template_id and b.status == "waiting" for b in state.builds.values()):
        raise E2BApiError(404, f"template '{template_id}' has no build waiting for files; request a build first")


async def upload(request: Request) -> Response:
    """``PUT`` of a signed upload URL: the archive of a ``copy`` step, kept until its build ends."""
    template_id, files_hash = request.path_params["template_id"], request.path_params["files_hash"]
    state = _templates(request)
    given = request.query_params.get("signature", "")
    if not hmac.compare_digest(given.encode(), state.signature(template_id, files_hash).encode()):
        raise E2BApiError(403, "the upload URL's signature is missing or wrong; ask GET /templates/{id}/files/{hash}")
    _check_upload_target(state, template_id, files_hash)
    path = state.upload_path(template_id, files_hash)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{files_hash}.{secrets.token_hex(4)}.part")
    size = 0
    try:
        with partial.open("wb") as sink:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_UPLOAD_BYTES:
                    raise E2BApiError(413, f"the archive is larger than {MAX_UPLOAD_BYTES} bytes")
                await asyncio.to_thread(sink.write, chunk)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return Response(status_code=200)


async def start_build(request: Request) -> Response:
    """``POST /v2/templates/{id}/builds/{build_id}``: validate the steps and the base, then build in the background."""
    template_id, build_id = request.path_params["template_id"], request.path_params["build_id"]
    state = _templates(request)
    build = _build_of(state, template_id, build_id)
    if build is None:
        raise E2BApiError(404, f"build '{build_id}' of template '{template_id}' not found; request a build first")
    if build.status != "waiting":
        raise E2BApiError(409, f"build '{build_id}' was already started ({build.status})")
    try:
        spec = parse_build_start(await json_body(request))
        for index, step in enumerate(spec.steps):
            if step.files_hash is not None and not state.upload_path(template_id, step.files_hash).is_file():
                raise InvalidRequestError(
                    f"steps[{index}]: the files of COPY {step.args[0]} (hash {step.files_hash}) were not uploaded"
                )
        base = await state.resolve_base(spec)
    except CorralError as exc:  # the build ends here: its status says why, as the SDK's answer does
        build.fail(exc.message, "base")
        build.finished_at = time.time()
        state.release(build)
        raise
    state.start(build, spec, base)
    return Response(status_code=202)


async def build_status(request: Request) -> JSONResponse:
    """``GET /templates/{id}/builds/{build_id}/status``: status and log entries from ``logsOffset``."""
    template_id, build_id = request.path_params["template_id"], request.path_params["build_id"]
    state = _templates(request)
    try:
        offset = int(request.query_params.get("logsOffset", "0"))
        limit = int(request.query_params.get("limit", str(STATUS_PAGE)))
    except ValueError:
        raise InvalidRequestError("logsOffset, limit: must be integers") from None
    if offset < 0 or not 0 < limit <= STATUS_PAGE:
        raise InvalidRequestError(f"logsOffset must be >= 0 and limit 1 to {STATUS_PAGE}")
    answer: dict[str, Any] = {"templateID": template_id, "buildID": build_id, "logs": [], "logEntries": []}
    build = _build_of(state, template_id, build_id)
    if build is None:
        # Known from its image after a restart (the logs are gone), else unknown.
        if not _BUILD_ID.match(build_id) or not any(
            (i.get("Labels") or {}).get(LABEL_BUILD) == build_id for i in await state.images(template_id)
        ):
            raise E2BApiError(404, f"build '{build_id}' of template '{template_id}' not found")
        return JSONResponse({**answer, "status": "ready"})
    answer |= {"status": build.status, "logEntries": build.page(offset, limit, request.query_params.get("level"))}
    if build.reason is not None:
        answer["reason"] = build.reason
    return JSONResponse(answer)


async def alias(request: Request) -> JSONResponse:
    """``GET /templates/aliases/{alias}``: 200 when a template of that name is built here (``Template.exists``)."""
    name = request.path_params["alias"]
    parse_template_name(name, field_name="alias")
    if ":" in name or not await _templates(request).images(name):
        raise E2BApiError(404, f"template '{name}' not found")
    return JSONResponse({"templateID": name, "public": False})


async def list_tags(request: Request) -> JSONResponse:
    """``GET /templates/{id}/tags``: every tag of a template."""
    name = parse_template_name(request.path_params["template_id"], field_name="templateID").name
    tags = await _templates(request).tags(name)
    if not tags:
        raise E2BApiError(404, f"template '{name}' not found")
    return JSONResponse(tags)


async def assign_tags(request: Request) -> JSONResponse:
    """``POST /templates/tags``: point tags at the build ``target`` (``name:tag``) names."""
    body = await json_body(request)
    target = parse_template_name(body.get("target"), field_name="target")
    tags = parse_tags(body.get("tags"))
    if not tags:
        raise InvalidRequestError("tags: name at least one tag to assign")
    build_id = await _templates(request).assign(target, tags)
    return JSONResponse({"tags": tags, "buildID": build_id}, status_code=201)


async def remove_tags(request: Request) -> Response:
    """``DELETE /templates/tags``: remove tags of the template ``name``."""
    body = await json_body(request)
    ref = parse_template_name(body.get("name"))
    tags = parse_tags(body.get("tags"))
    if not tags:
        raise InvalidRequestError("tags: name at least one tag to remove")
    await _templates(request).untag(ref.name, tags)
    return Response(status_code=204)


SnapshotDelete = Callable[[str, Request], Awaitable[Response]]
"""The control plane's ``DELETE /templates/{id}`` of snapshots (E2B deletes a snapshot as a template)."""


def _delete_route(delete_snapshots: SnapshotDelete) -> Callable[[Request], Awaitable[Response]]:
    async def delete_template(request: Request) -> Response:
        """``DELETE /templates/{id}``: remove the template and every build of it; an id that is no template built
        here goes on to ``delete_snapshots``."""
        template_id = request.path_params["template_id"]
        state = _templates(request)
        try:
            name = parse_template_name(template_id, field_name="templateID").name
        except InvalidRequestError:
            name = None
        if name is None or ":" in template_id or not await state.images(name):
            try:
                return await delete_snapshots(template_id, request)
            except E2BApiError as exc:
                if exc.status == 404:
                    raise E2BApiError(404, f"template or snapshot {template_id!r} doesn't exist") from exc
                raise
        await state.delete(name)
        return Response(status_code=204)

    return delete_template


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = app.state.service.settings
    upload_dir = Path(settings.data_dir) / "e2b-template-uploads"
    await asyncio.to_thread(shutil.rmtree, upload_dir, True)  # archives of builds that never ran
    upload_dir.mkdir(parents=True, exist_ok=True)
    engine = DockerEngine.from_url(settings.docker_host)
    runtime: str | None = settings.gvisor_net_runtime
    try:
        if runtime not in ((await engine.info()).get("Runtimes") or {}):
            log.warning("template builds run under Docker's default runtime: dockerd has no %r runtime", runtime)
            runtime = None
    except DockerAPIError:
        runtime = None  # builds fail later, saying the engine is unreachable
    state = TemplatesState(
        engine,
        upload_dir,
        settings.base_image,
        owner=settings.owner_id(),
        runtime=runtime,
        always_deny=parse_always_deny(settings.egress_always_deny),
    )
    app.state.e2b_templates = state
    await state.remove_leftovers()
    try:
        yield
    finally:
        await state.aclose()


def templates_routers(delete_snapshots: SnapshotDelete) -> list[APIRouter]:
    """The template routes (API key) and the signed upload route; include both in the ``/e2b`` router before the
    control plane's. ``DELETE /templates/{id}`` of an id that is no template built here is ``delete_snapshots``."""
    router = APIRouter(route_class=_TemplateRoute, lifespan=_lifespan)
    router.add_api_route("/v3/templates", request_build, methods=["POST"])
    # Fixed paths before /templates/{template_id}/...
    router.add_api_route("/templates/tags", assign_tags, methods=["POST"])
    router.add_api_route("/templates/tags", remove_tags, methods=["DELETE"])
    router.add_api_route("/templates/aliases/{alias}", alias, methods=["GET"])
    router.add_api_route("/templates/{template_id}/files/{files_hash}", upload_link, methods=["GET"])
    router.add_api_route("/v2/templates/{template_id}/builds/{build_id}", start_build, methods=["POST"])
    router.add_api_route("/templates/{template_id}/builds/{build_id}/status", build_status, methods=["GET"])
    router.add_api_route("/templates/{template_id}/tags", list_tags, methods=["GET"])
    router.add_api_route("/templates/{template_id:path}", _delete_route(delete_snapshots), methods=["DELETE"])
    uploads = APIRouter(route_class=_UploadRoute)
    uploads.add_api_route("/templates/{template_id}/files/{files_hash}", upload, methods=["PUT"])
    return [router, uploads]
