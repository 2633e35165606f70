"""Server configuration. Every field is read from the environment variable named beside it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

from corral.values import ResourceLimits

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Corral's knobs, read from ``CORRAL_*`` variables; a few also take a name without the prefix
    (``WORKSPACE_DEFAULT_CPU``, ``E2B_API_KEY``)."""

    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="ignore", populate_by_name=True)

    data_dir: Path = Path("./data")
    """CORRAL_DATA_DIR: where the SQLite database and other state live."""

    database_url: str | None = None
    """CORRAL_DATABASE_URL: a SQLAlchemy URL (``postgresql://user:pw@host/db``). Default: SQLite in data_dir."""

    api_token: str | None = None
    """CORRAL_API_TOKEN: the bearer token every route but /healthz requires. Unset: a token is generated at start
    and written to ``data_dir/api-token`` (mode 0600), so the server never runs open by accident."""

    secret_key: SecretStr | None = None
    """CORRAL_SECRET_KEY: the secret that encrypts (AES-256-GCM) the repository credentials Corral must keep: a fixed
    ``repo_source`` URL's, and a provisioning session's until its checkout is done. Any string of 16+ characters
    (e.g. ``openssl rand -base64 32``). Unset: a key is generated once into ``data_dir/secret-key`` (mode 0600).
    Servers sharing one database need the same key; with another key, stored credentials must be given again."""

    deployment_mode: Literal["self-hosted", "managed"] = "self-hosted"
    """CORRAL_DEPLOYMENT_MODE: decides what ``provider: "auto"`` prefers (``managed``: E2B first)."""

    providers: str = "firecracker,gvisor,docker"
    """CORRAL_PROVIDERS: comma-separated providers to configure. ``fake`` is for tests only."""

    allow_docker_fallback: bool = False
    """CORRAL_ALLOW_DOCKER_FALLBACK: allow plain Docker (runc: it shares the host kernel, so isolation is reduced).
    True: auto selection may use it as the last resort and requests may name ``provider: "docker"``. False (the
    default): auto never uses it and a request naming it is refused with 403 ``provider_not_allowed``."""

    docker_host: str = "unix:///var/run/docker.sock"
    """CORRAL_DOCKER_HOST: the Docker engine to talk to (a unix socket URL)."""

    gvisor_runtime: str = "runsc"
    """CORRAL_GVISOR_RUNTIME: the dockerd runtime for isolated gVisor workspaces (runsc with --network=none)."""

    gvisor_net_runtime: str = "runsc-net"
    """CORRAL_GVISOR_NET_RUNTIME: the dockerd runtime for networked gVisor workspaces (runsc with --network=host,
    inside Docker's per-container network namespace)."""

    firecracker_bin: str = "firecracker"
    """CORRAL_FIRECRACKER_BIN: the firecracker binary (looked up on PATH unless absolute)."""

    firecracker_kernel: str | None = None
    """CORRAL_FIRECRACKER_KERNEL: the guest kernel (vmlinux) microVMs boot."""

    firecracker_rootfs: str | None = None
    """CORRAL_FIRECRACKER_ROOTFS: the base ext4 root filesystem of microVMs."""

    firecracker_manager_url: str | None = None
    """CORRAL_FIRECRACKER_MANAGER_URL: a standalone manager (``http://host:port`` or ``unix:/path``); unset, the
    manager runs inside ``corral serve``."""

    firecracker_state_dir: Path | None = None
    """CORRAL_FIRECRACKER_STATE_DIR: VM disks, sockets and metadata (default ``data_dir/firecracker``)."""

    firecracker_subnet: str = "172.31.0.0/16"
    """CORRAL_FIRECRACKER_SUBNET: private addresses for microVMs, one /30 each."""

    firecracker_egress_interface: str | None = None
    """CORRAL_FIRECRACKER_EGRESS_INTERFACE: where default-network VMs are NATed out (default: the default route's)."""

    firecracker_dns: str = ""
    """CORRAL_FIRECRACKER_DNS: comma-separated DNS servers handed to guests."""

    firecracker_netns: str | None = None
    """CORRAL_FIRECRACKER_NETNS: run VM networking inside this network namespace."""

    firecracker_max_vms: int = Field(32, ge=1)
    """CORRAL_FIRECRACKER_MAX_VMS: the most microVMs at once."""

    firecracker_warm_pool_size: int = Field(0, ge=0)
    """CORRAL_FIRECRACKER_WARM_POOL_SIZE: pre-cloned disks kept ready by the manager."""

    http_provider_url: str | None = None
    """CORRAL_HTTP_PROVIDER_URL: base URL of a custom backend serving docs/http-provider.md; enables ``http``."""

    http_provider_token: str | None = None
    """CORRAL_HTTP_PROVIDER_TOKEN: bearer token sent to that backend."""

    base_image: str = "corral/workspace:base"
    """CORRAL_BASE_IMAGE: the image workspaces start from unless a request names another."""

    default_cpu: str = Field("2", validation_alias=AliasChoices("WORKSPACE_DEFAULT_CPU", "CORRAL_DEFAULT_CPU"))
    """WORKSPACE_DEFAULT_CPU: CPUs per workspace when neither request nor agent type says."""

    default_memory: str = Field(
        "4G", validation_alias=AliasChoices("WORKSPACE_DEFAULT_MEMORY", "CORRAL_DEFAULT_MEMORY")
    )
    """WORKSPACE_DEFAULT_MEMORY: memory per workspace, e.g. ``4G``."""

    default_disk: str = Field("10G", validation_alias=AliasChoices("WORKSPACE_DEFAULT_DISK", "CORRAL_DEFAULT_DISK"))
    """WORKSPACE_DEFAULT_DISK: disk per workspace, e.g. ``10G``."""

    agent_runtime_dir: Path = Path("/var/lib/corral/agent-runtime")
    """CORRAL_AGENT_RUNTIME_DIR: where the read-only runtime of the in-workspace agent is built (one directory per
    agent version and base image; see corral.providers.agent_runtime). Must be on the Docker host."""

    snapshot_dir: Path = Path("/var/lib/corral/snapshots")
    """CORRAL_SNAPSHOT_DIR: where gVisor memory checkpoints of snapshots are kept (on the Docker host, ideally on the
    file system of Docker's data root, so restores hard-link them instead of copying)."""
    snapshot_storage_limit: str = "20g"
    """CORRAL_SNAPSHOT_STORAGE_LIMIT: the most bytes all snapshots together may hold on this host (e.g. "20g");
    a snapshot that would pass it is refused and removed."""
    pids_limit: int = 4096
    """CORRAL_PIDS_LIMIT: the most host tasks one workspace may hold (fork-bomb guard). Under gVisor's ptrace
    platform every thread of the sandbox counts, about 14 per process in the workspace (100 idle processes hold
    ~1,440), so 4096 leaves room for ~280 processes."""

    max_request_body: int = Field(1024 * 1024, ge=1024)
    """CORRAL_MAX_REQUEST_BODY: the largest JSON request body in bytes (agent tool calls take up to 11 MiB, file
    uploads stream and have no cap)."""

    max_concurrent_execs: int = Field(16, ge=1, le=1024)
    """CORRAL_MAX_CONCURRENT_EXECS: commands one workspace runs at once; more wait their turn."""

    max_queued_execs: int = Field(256, ge=0, le=100_000)
    """CORRAL_MAX_QUEUED_EXECS: commands one workspace keeps waiting beyond those; past that a request answers 429."""

    agent_idle_close_s: float = Field(60.0, ge=0)
    """CORRAL_AGENT_IDLE_CLOSE_S: seconds without a call after which a docker or gvisor workspace's agent is closed
    (0: never), once it has served a call: an idle gVisor workspace then holds about 14 MiB less host memory, and the
    next call starts a fresh agent (about 150 ms more, once). Agents started ahead of use (warm pools) wait for their
    first call."""

    exec_output_limit: int = 16 * 1024 * 1024
    """CORRAL_EXEC_OUTPUT_LIMIT: bytes of stdout (and of stderr) kept per exec; the rest is dropped and flagged."""

    disk_warn_ratio: float = 0.9
    """CORRAL_DISK_WARN_RATIO: where disk limits are only monitored, warn once usage passes this share."""

    disk_check_interval_s: float = 60.0
    """CORRAL_DISK_CHECK_INTERVAL_S: seconds between disk-usage checks where limits are only monitored."""

    metrics_interval_s: float = Field(5.0, gt=0)
    """CORRAL_METRICS_INTERVAL_S: seconds between CPU, memory and disk samples of each E2B sandbox
    (``get_metrics``); a request finding no sample this recent takes one at once."""

    metrics_samples: int = Field(720, ge=1, le=100_000)
    """CORRAL_METRICS_SAMPLES: samples kept per sandbox, the oldest dropped first (720 at 5 s: the last hour)."""

    health_interval_s: float = 30.0
    """CORRAL_HEALTH_INTERVAL_S: seconds between provider health checks."""

    warm_pool_size: int = Field(2, ge=0, le=100)
    """CORRAL_WARM_POOL_SIZE: warm workspaces kept for the default pool (default provider, image and limits, isolated
    network). 0 turns the default pool off."""

    warm_pool_growth: int = Field(4, ge=1, le=100)
    """CORRAL_WARM_POOL_GROWTH: a burst of requests (within 0.5 s) larger than a pool grows it to that many, up to this
    many times its size (at most 100), until 10 minutes after the last such burst; 1 keeps pools at their size.
    ``max_size`` in CORRAL_WARM_POOLS overrides it per pool."""

    e2b_warm_pool_size: int = Field(2, ge=0, le=100)
    """CORRAL_E2B_WARM_POOL_SIZE: warm workspaces kept for E2B's default sandbox (``Sandbox.create()``: the default
    provider, image and limits, networked as E2B sandboxes are by default). 0 turns this pool off."""

    warm_pools: str = "[]"
    """CORRAL_WARM_POOLS: extra pools as JSON, e.g. ``[{"provider": "gvisor", "size": 2, "max_size": 8,
    "network": "default", "resource_limits": {"cpu": "1", "memory": "1G"}, "image": "corral/workspace:base"}]``
    (``max_size``, how far a burst may grow the pool, defaults to CORRAL_WARM_POOL_GROWTH times ``size``)."""

    setup_pool_size: int = Field(1, ge=0, le=100)
    """CORRAL_SETUP_POOL_SIZE: warm workspaces kept restored from the newest setup snapshot of each agent type with
    ``snapshot_after_setup``, so its later sessions start in milliseconds instead of restoring on demand. A newer
    setup snapshot of the type replaces the pool; 0 turns these pools off."""

    warm_pool_drain_on_shutdown: bool = True
    """CORRAL_WARM_POOL_DRAIN_ON_SHUTDOWN: destroy warm workspaces on a clean shutdown (after a crash they are
    adopted back at the next start instead)."""

    workspace_ttl_s: float = Field(0.0, ge=0)
    """CORRAL_WORKSPACE_TTL_S: destroy workspaces this many seconds after creation; 0 = never (default)."""

    idle_timeout_s: float = Field(3600.0, ge=0)
    """CORRAL_IDLE_TIMEOUT_S: a session with no tool call for this long ends (its workspace is destroyed, as
    ending it does), and a workspace of no session with no exec or file call for this long is stopped (its disk is
    kept; resume brings it back); 0 = never. E2B sandboxes keep their own timeout instead."""

    idle_warning_s: float = Field(300.0, ge=0)
    """CORRAL_IDLE_WARNING_S: how long before the idle timeout strikes the CLI warns about it (the API gives every
    workspace and session its ``expires_at``; the CLI reads this variable from its own environment)."""

    failed_record_ttl_s: float = Field(3600.0, ge=0)
    """CORRAL_FAILED_RECORD_TTL_S: the reaper deletes the ``error`` record of a failed create kept with
    ``?keep_failed=true`` this many seconds after it failed; 0 = keep them until deleted by hand."""

    reaper_interval_s: float = Field(60.0, gt=0)
    """CORRAL_REAPER_INTERVAL_S: seconds between reaper sweeps (TTL, idle timeout, failed-create records)."""

    e2b_api_key: str | None = Field(None, validation_alias=AliasChoices("E2B_API_KEY", "CORRAL_E2B_API_KEY"))
    """E2B_API_KEY: enables the e2b provider."""

    e2b_domain: str | None = Field(None, validation_alias=AliasChoices("E2B_DOMAIN", "CORRAL_E2B_DOMAIN"))
    """E2B_DOMAIN: the E2B domain (default: the SDK's, e2b.app)."""

    e2b_api_url: str | None = Field(None, validation_alias=AliasChoices("E2B_API_URL", "CORRAL_E2B_API_URL"))
    """E2B_API_URL: the E2B control plane URL, e.g. another Corral's ``http://host:8000/e2b``."""

    e2b_sandbox_url: str | None = Field(
        None, validation_alias=AliasChoices("E2B_SANDBOX_URL", "CORRAL_E2B_SANDBOX_URL")
    )
    """E2B_SANDBOX_URL: the in-sandbox daemon (envd) URL, e.g. ``http://host:8000/e2b/envd``."""

    e2b_template: str = Field("base", validation_alias=AliasChoices("E2B_TEMPLATE", "CORRAL_E2B_TEMPLATE"))
    """E2B_TEMPLATE: the template e2b workspaces start from."""

    e2b_sandbox_timeout_s: int = Field(3600, ge=1, le=86400)
    """CORRAL_E2B_SANDBOX_TIMEOUT_S: lifetime E2B gives a sandbox before pausing it."""

    sandbox_domain: str | None = None
    """CORRAL_SANDBOX_DOMAIN: the domain of preview hosts. A request whose Host is ``{port}-{workspace id}.{domain}``
    is proxied to that port inside the workspace (what the E2B SDK's ``get_host(port)`` names), and the E2B API
    answers this domain as each sandbox's ``domain``. Point a wildcard DNS name (``*.{domain}``) at Corral. Unset:
    no host routing (the path route ``/api/v1/agent/workspaces/{id}/ports/{port}/...`` still works)."""

    egress_always_deny: str = "169.254.0.0/16,bridge"
    """CORRAL_EGRESS_ALWAYS_DENY: what every networked workspace is denied whatever its rules say, unless its
    ``allow_out`` names the address: comma-separated CIDR blocks, and ``bridge`` for its own bridge network (other
    workspaces, and the host's address there). The default also keeps cloud metadata services (169.254.169.254) out
    of reach. Empty: nothing beyond each workspace's rules."""

    egress_hosts_file: Path | None = None
    """CORRAL_EGRESS_HOSTS_FILE: an /etc/hosts-style file the egress proxy reads before DNS when it resolves a host
    name a workspace's ``allow_out`` lets through (internal names; re-read when it changes). Unset: DNS only."""

    web_assets_dir: Path = Path(__file__).resolve().parents[2] / "web" / "node_modules"
    """CORRAL_WEB_ASSETS_DIR: the ``node_modules`` directory holding the browser packages the server serves itself
    (xterm.js for the web console's terminal, Swagger UI for /docs), installed from web/package-lock.json by ``make
    bootstrap``. Default: ``web/node_modules`` of the source tree Corral runs from."""

    def default_limits(self) -> ResourceLimits:
        """Limits from WORKSPACE_DEFAULT_CPU / _MEMORY / _DISK."""
        return ResourceLimits.parse({"cpu": self.default_cpu, "memory": self.default_memory, "disk": self.default_disk})

    def sqlalchemy_url(self) -> str:
        """The async SQLAlchemy URL for the configured database."""
        url = self.database_url or f"sqlite:///{(self.data_dir / 'corral.db').resolve()}"
        if url.startswith("sqlite:///"):
            return "sqlite+aiosqlite:///" + url.removeprefix("sqlite:///")
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+asyncpg://" + url.removeprefix(prefix)
        return url

    def owner_id(self) -> str:
        """The label value marking runtime objects as this installation's (``corral.owner``).

        Derived from the database location (password left out), so every server sharing one database shares one
        owner, and a test server with its own SQLite file never touches another server's workspaces.
        """
        url = make_url(self.sqlalchemy_url())
        return hashlib.sha256(url.render_as_string(hide_password=True).encode()).hexdigest()[:16]

    def provider_names(self) -> list[str]:
        """The configured providers, in the order given."""
        return [p.strip() for p in self.providers.split(",") if p.strip()]
