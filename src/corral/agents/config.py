"""An agent type's workspace configuration: what every session of that type starts with.

``parse_workspace_config`` validates the API's JSON and reports every problem at once (one 400 that names each
invalid tool with the valid list, each malformed limit, an unknown repo source, a fixed source without url...). A new
agent type without configuration gets :data:`DISABLED` (``enabled = false``).

A fixed repository URL's credential is write-only: the stored config keeps the URL masked
(``https://***@git.example/org/repo.git``) beside ``sealed_url``, the full URL encrypted by the agent service
(:mod:`corral.credentials`). ``to_json()`` (every API answer) never includes ``sealed_url``; only the store's copy
does (``to_json(include_sealed=True)``), and only a stored config may carry it (``config_from_json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from corral.credentials import redact_url, split_url
from corral.errors import InvalidRequestError
from corral.providers.base import ResourceLimits
from corral.tools.policy import VALID_TOOLS

__all__ = [
    "DISABLED",
    "VALID_TOOLS",
    "RepoSource",
    "WorkspaceConfig",
    "parse_workspace_config",
    "validate_repo_url",
]

REPO_SOURCE_TYPES = ("task_context", "fixed", "none")
DEFAULT_SETUP_TIMEOUT_S = 300.0
_FIELDS = {
    "enabled", "provider", "container_type", "repo_source", "tools", "resource_limits", "checkout_on_start",
    "base_image", "setup_commands", "setup_timeout_s", "network", "snapshot_after_setup",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class RepoSource:
    """Where the repository comes from: the task's context, a fixed URL, or nowhere."""

    type: Literal["task_context", "fixed", "none"] = "none"
    url: str | None = None
    """The URL as shown: its credential, if it has one, masked as ``***``."""
    branch: str | None = None
    sealed_url: str | None = None
    """The full URL with its credential, sealed (AES-GCM) by the agent service; None when the URL has none."""


@dataclass(frozen=True, slots=True)
class WorkspaceConfig:
    """A validated workspace configuration. ``resource_limits`` keeps the raw spelling; None means the defaults."""

    enabled: bool = False
    provider: str = "auto"
    container_type: Literal["agent_workspace", "mcp_server"] = "agent_workspace"
    repo_source: RepoSource = field(default_factory=RepoSource)
    tools: tuple[str, ...] = VALID_TOOLS
    resource_limits: Mapping[str, str] | None = None
    checkout_on_start: bool = True
    base_image: str | None = None
    setup_commands: tuple[str, ...] = ()
    setup_timeout_s: float = DEFAULT_SETUP_TIMEOUT_S
    network: Literal["isolated", "default"] = "isolated"
    snapshot_after_setup: bool = False
    """Set up once, start many: the first session of a (repository, commit, setup, image, limits) snapshots its
    workspace after checkout and setup; later ones restore from that snapshot instead of running them again."""

    def to_json(self, *, include_sealed: bool = False) -> dict[str, Any]:
        """The API spelling; ``include_sealed`` adds the sealed credential, for the store's copy only."""
        source = self.repo_source
        repo_source: dict[str, Any] = {
            "type": source.type,
            "url": redact_url(source.url) if source.url is not None else None,
            "branch": source.branch,
        }
        if include_sealed and source.sealed_url is not None:
            repo_source["sealed_url"] = source.sealed_url
        return {
            "enabled": self.enabled,
            "provider": self.provider,
            "container_type": self.container_type,
            "repo_source": repo_source,
            "tools": list(self.tools),
            "resource_limits": dict(self.resource_limits) if self.resource_limits is not None else None,
            "checkout_on_start": self.checkout_on_start,
            "base_image": self.base_image,
            "setup_commands": list(self.setup_commands),
            "setup_timeout_s": self.setup_timeout_s,
            "network": self.network,
            "snapshot_after_setup": self.snapshot_after_setup,
        }


DISABLED = WorkspaceConfig()


def validate_repo_url(url: str, *, field_name: str) -> str | None:
    """The problem with a repository URL, or None. Only http(s) is cloned (no ssh, file or ext:: transports)."""
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # a malformed port or IPv6 address
        valid = False
    shown = redact_url(url)  # the message goes back to the client and maybe into logs
    if not valid:
        return f"{field_name}: {shown!r} is not an http(s) repository URL (only http:// and https:// are cloned)"
    if split_url(url).fetch_url is not None:
        # git cannot clone these (it appends /info/refs after the query), and a secret in the URL it fetches would show
        # in the host's process list (git-remote-http's argv).
        return (
            f"{field_name}: {shown!r} carries a credential in its query or fragment; git cannot clone such a URL. "
            "Put the credential in the URL's user part instead, e.g. https://x-access-token:TOKEN@host/org/repo.git"
        )
    return None


def parse_workspace_config(
    raw: object, *, default_limits: ResourceLimits, allow_sealed: bool = False
) -> WorkspaceConfig:
    """Validate the workspace-config JSON; every problem is reported in one InvalidRequestError.

    ``allow_sealed`` accepts ``repo_source.sealed_url``, which only the stored copy carries (clients never see one,
    so they cannot send one).
    """
    if not isinstance(raw, Mapping):
        raise InvalidRequestError("workspace config must be a JSON object")
    problems: list[str] = []
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        problems.append(f"unknown field(s) {unknown}; allowed: {', '.join(sorted(_FIELDS))}")
    for name in ("enabled", "checkout_on_start", "snapshot_after_setup"):
        if name in raw and not isinstance(raw[name], bool):
            problems.append(f"{name}: must be true or false, got {raw[name]!r}")
    tools = _parse_tools(raw.get("tools", list(VALID_TOOLS)), problems)
    repo = _parse_repo_source(raw.get("repo_source"), problems, allow_sealed=allow_sealed)
    limits = _parse_limits(raw.get("resource_limits"), default_limits, problems)
    commands = raw.get("setup_commands", [])
    if not isinstance(commands, list) or not all(isinstance(c, str) and c.strip() for c in commands):
        problems.append("setup_commands: must be a list of non-empty command strings")
        commands = []
    timeout = raw.get("setup_timeout_s", DEFAULT_SETUP_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 86400:
        problems.append(f"setup_timeout_s: must be a number of seconds between 0 and 86400, got {timeout!r}")
        timeout = DEFAULT_SETUP_TIMEOUT_S
    problems += _scalar_problems(raw)
    if problems:
        raise InvalidRequestError("invalid workspace config: " + "; ".join(problems), details={"problems": problems})
    return WorkspaceConfig(
        enabled=bool(raw.get("enabled", False)),
        provider=str(raw.get("provider", "auto")),
        container_type=raw.get("container_type", "agent_workspace"),
        repo_source=repo,
        tools=tools,
        resource_limits=limits,
        checkout_on_start=bool(raw.get("checkout_on_start", True)),
        base_image=raw.get("base_image"),
        setup_commands=tuple(commands),
        setup_timeout_s=float(timeout),
        network=raw.get("network", "isolated"),
        snapshot_after_setup=bool(raw.get("snapshot_after_setup", False)),
    )


def _parse_tools(tools: object, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        problems.append(f"tools: must be a list of tool names; valid tools: {', '.join(VALID_TOOLS)}")
        return ()
    invalid = [t for t in tools if t not in VALID_TOOLS]
    if invalid:
        problems.append(f"tools: invalid tool name(s) {invalid}; valid tools: {', '.join(VALID_TOOLS)}")
    return tuple(dict.fromkeys(tools))


def _parse_limits(limits: object, defaults: ResourceLimits, problems: list[str]) -> dict[str, str] | None:
    if limits is None:
        return None
    if not isinstance(limits, Mapping):
        problems.append('resource_limits: must be an object like {"cpu": "2", "memory": "4G", "disk": "10G"}')
        return None
    try:
        ResourceLimits.parse(limits, defaults=defaults)
    except InvalidRequestError as exc:
        problems.extend(exc.details.get("problems", [exc.message]))
    return {str(k): str(v) for k, v in limits.items()}


def _scalar_problems(raw: Mapping[str, Any]) -> list[str]:
    problems = []
    provider = raw.get("provider", "auto")
    if not isinstance(provider, str) or not provider:
        problems.append('provider: must be a provider name or "auto"')
    container_type = raw.get("container_type", "agent_workspace")
    if container_type not in ("agent_workspace", "mcp_server"):
        problems.append(f"container_type: {container_type!r} is not allowed; use 'agent_workspace' or 'mcp_server'")
    network = raw.get("network", "isolated")
    if network not in ("isolated", "default"):
        problems.append(f"network: {network!r} is not allowed; use 'isolated' or 'default'")
    base_image = raw.get("base_image")
    if base_image is not None and (not isinstance(base_image, str) or not base_image.strip()):
        problems.append("base_image: must be a non-empty image name or null")
    return problems


def _parse_repo_source(raw: object, problems: list[str], *, allow_sealed: bool) -> RepoSource:
    if raw is None:
        return RepoSource()
    if not isinstance(raw, Mapping):
        problems.append('repo_source: must be an object like {"type": "task_context"}')
        return RepoSource()
    extra = sorted(set(raw) - {"type", "url", "branch", *(("sealed_url",) if allow_sealed else ())})
    if extra:
        problems.append(f"repo_source: unknown field(s) {extra}; allowed: type, url, branch")
    kind = raw.get("type", "none")
    if kind not in REPO_SOURCE_TYPES:
        problems.append(f"repo_source.type: {kind!r} is not allowed; use one of {', '.join(REPO_SOURCE_TYPES)}")
        return RepoSource()
    url, branch = raw.get("url"), raw.get("branch")
    if url is not None and not isinstance(url, str):
        problems.append("repo_source.url: must be a string")
        url = None
    if branch is not None and (not isinstance(branch, str) or not branch.strip() or branch.startswith("-")):
        problems.append(f"repo_source.branch: {branch!r} is not a branch name")
        branch = None
    if kind == "fixed" and not url:
        problems.append("repo_source.url: a fixed repository source needs a url")
    if url and (problem := validate_repo_url(url, field_name="repo_source.url")):
        problems.append(problem)
    sealed = raw.get("sealed_url") if allow_sealed else None
    return RepoSource(type=kind, url=url or None, branch=branch, sealed_url=sealed if isinstance(sealed, str) else None)


def config_from_json(raw: Mapping[str, Any] | None) -> WorkspaceConfig:
    """Rebuild a stored (already valid) config, sealed credential included; empty or missing is :data:`DISABLED`."""
    if not raw:
        return DISABLED
    return parse_workspace_config(raw, default_limits=ResourceLimits(), allow_sealed=True)
