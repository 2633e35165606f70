"""Server configuration. Every field is read from the environment variable named beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Corral's knobs. Names follow the seeds where they name one (``WORKSPACE_DEFAULT_CPU``), else ``CORRAL_*``."""

    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="ignore", populate_by_name=True)

    data_dir: Path = Path("./data")
    """CORRAL_DATA_DIR: where the SQLite database and other state live."""

    database_url: str | None = None
    """CORRAL_DATABASE_URL: a SQLAlchemy URL (``postgresql://user:pw@host/db``). Default: SQLite in data_dir."""

    api_token: str | None = None
    """CORRAL_API_TOKEN: the bearer token every route but /healthz requires. Unset: a token is generated at start
    and written to ``data_dir/api-token`` (mode 0600), so the server never runs open by accident."""

    deployment_mode: Literal["self-hosted", "managed"] = "self-hosted"
    """CORRAL_DEPLOYMENT_MODE: decides what ``provider: "auto"`` prefers (seed 000)."""

    providers: str = "gvisor,docker"
    """CORRAL_PROVIDERS: comma-separated providers to configure. ``fake`` is for tests only."""

    allow_docker_fallback: bool = True
    """CORRAL_ALLOW_DOCKER_FALLBACK: let auto selection use plain Docker (runc, reduced isolation) as the last
    resort. Set false to forbid it."""

    docker_host: str = "unix:///var/run/docker.sock"
    """CORRAL_DOCKER_HOST: the Docker engine to talk to (a unix socket URL)."""

    gvisor_runtime: str = "runsc"
    """CORRAL_GVISOR_RUNTIME: the dockerd runtime for isolated gVisor workspaces (runsc with --network=none)."""

    gvisor_net_runtime: str = "runsc-net"
    """CORRAL_GVISOR_NET_RUNTIME: the dockerd runtime for networked gVisor workspaces (runsc with --network=host,
    inside Docker's per-container network namespace)."""

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

    pids_limit: int = 1024
    """CORRAL_PIDS_LIMIT: the most processes one workspace may hold (fork-bomb guard)."""

    exec_output_limit: int = 16 * 1024 * 1024
    """CORRAL_EXEC_OUTPUT_LIMIT: bytes of stdout (and of stderr) kept per exec; the rest is dropped and flagged."""

    disk_warn_ratio: float = 0.9
    """CORRAL_DISK_WARN_RATIO: where disk limits are only monitored, warn once usage passes this share."""

    disk_check_interval_s: float = 60.0
    """CORRAL_DISK_CHECK_INTERVAL_S: seconds between disk-usage checks where limits are only monitored."""

    health_interval_s: float = 30.0
    """CORRAL_HEALTH_INTERVAL_S: seconds between provider health checks."""

    e2b_api_key: str | None = Field(None, validation_alias=AliasChoices("E2B_API_KEY", "CORRAL_E2B_API_KEY"))
    """E2B_API_KEY: enables the e2b provider."""

    def sqlalchemy_url(self) -> str:
        """The async SQLAlchemy URL for the configured database."""
        url = self.database_url or f"sqlite:///{(self.data_dir / 'corral.db').resolve()}"
        if url.startswith("sqlite:///"):
            return "sqlite+aiosqlite:///" + url.removeprefix("sqlite:///")
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+asyncpg://" + url.removeprefix(prefix)
        return url

    def provider_names(self) -> list[str]:
        """The configured providers, in the order given."""
        return [p.strip() for p in self.providers.split(",") if p.strip()]
