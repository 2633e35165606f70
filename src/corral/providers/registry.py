"""Provider names mapped to lazy imports, install hints and their place in auto selection (fsspec's
``known_implementations``).

A provider module is imported only when the provider is configured, so a missing optional SDK (``e2b``) costs
nothing until someone asks for that provider, and then the error says which pip command fixes it. Everything Corral
knows about a provider by its name is here: the rest of the code asks the registry (or the provider's
capabilities), so a third-party provider joins auto selection by :func:`register_provider` alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.errors import ProviderNotFoundError, ProviderUnavailableError

if TYPE_CHECKING:
    from corral.providers.base import WorkspaceProvider
    from corral.settings import Settings

__all__ = ["KNOWN_PROVIDERS", "PROVIDER_NAMES", "ProviderEntry", "build_provider", "register_provider"]

PROVIDER_NAMES = ("docker", "e2b", "fake", "firecracker", "gvisor", "http")
"""Every provider name the API knows, implemented here or not."""


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    """Where a provider's factory lives, what to install when its import fails, and how auto selection ranks it."""

    module: str
    factory: str
    install_hint: str | None = None
    auto_rank: int | None = None
    """Its place in auto selection for agent workspaces, lowest first; None: auto never picks it."""
    mcp_rank: int | None = None
    """Its place for MCP servers (long-lived, light), when it differs from ``auto_rank``."""
    managed_rank: int | None = None
    """Its place in a managed deployment (CORRAL_DEPLOYMENT_MODE=managed with E2B_API_KEY), ahead of the rest."""
    reduced_isolation: bool = False
    """It shares the host kernel: used only when the operator allows it (CORRAL_ALLOW_DOCKER_FALLBACK)."""

    def rank(self, container_type: str, *, managed: bool) -> int | None:
        """Where auto selection places this provider for a container type; None: not at all."""
        if managed and self.managed_rank is not None:
            return self.managed_rank
        if container_type == "mcp_server" and self.mcp_rank is not None:
            return self.mcp_rank
        return self.auto_rank


KNOWN_PROVIDERS: dict[str, ProviderEntry] = {
    # Agent workspaces prefer a microVM (the strongest isolation), MCP servers gVisor (lighter for long-lived
    # processes); a custom HTTP backend after both; plain runc last, and only when allowed.
    "firecracker": ProviderEntry("corral.providers.firecracker", "from_settings", auto_rank=10, mcp_rank=20),
    "gvisor": ProviderEntry("corral.providers.factories", "gvisor", auto_rank=20, mcp_rank=10),
    "http": ProviderEntry("corral.providers.http", "from_settings", auto_rank=30),
    "docker": ProviderEntry("corral.providers.factories", "docker", auto_rank=90, reduced_isolation=True),
    # E2B's cloud comes first in managed deployments (no local resources used), and is not chosen otherwise.
    "e2b": ProviderEntry("corral.providers.e2b", "from_settings", install_hint="'corral[e2b]'", managed_rank=0),
    "fake": ProviderEntry("corral.providers.factories", "fake"),  # a test double: never chosen by auto
}


def register_provider(name: str, entry: ProviderEntry) -> None:
    """Make a provider known by ``name`` (a third-party backend): configurable with CORRAL_PROVIDERS, and chosen
    by auto selection according to its ranks."""
    KNOWN_PROVIDERS[name] = entry


def build_provider(name: str, settings: Settings) -> WorkspaceProvider:
    """Instantiate the provider registered under ``name`` from ``settings``.

    Raises:
        ProviderNotFoundError: unknown name; the message lists the known ones.
        ProviderUnavailableError: the provider's optional dependency is not installed.
    """
    entry = KNOWN_PROVIDERS.get(name)
    if entry is None:
        raise ProviderNotFoundError(
            f"unknown provider {name!r}; known providers: {', '.join(sorted(KNOWN_PROVIDERS))}",
            details={"provider": name, "allowed": sorted(KNOWN_PROVIDERS)},
        )
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        hint = f"; install it with `pip install {entry.install_hint}`" if entry.install_hint else ""
        raise ProviderUnavailableError(name, f"cannot import {entry.module}: {exc}{hint}") from exc
    factory: Callable[[Settings], WorkspaceProvider] = getattr(module, entry.factory)
    return factory(settings)
