"""Provider names mapped to lazy imports and install hints (fsspec's ``known_implementations``).

A provider module is imported only when the provider is configured, so a missing optional SDK (``e2b``) costs
nothing until someone asks for that provider, and then the error says which pip command fixes it.
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

__all__ = ["KNOWN_PROVIDERS", "PROVIDER_NAMES", "ProviderEntry", "build_provider"]

PROVIDER_NAMES = ("docker", "e2b", "fake", "firecracker", "gvisor", "http")
"""Every provider name of the public contract (DESIGN.md), implemented here or not."""


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    """Where a provider's factory lives and what to install when its import fails."""

    module: str
    factory: str
    install_hint: str | None = None


KNOWN_PROVIDERS: dict[str, ProviderEntry] = {
    "docker": ProviderEntry("corral.providers.factories", "docker"),
    "gvisor": ProviderEntry("corral.providers.factories", "gvisor"),
    "fake": ProviderEntry("corral.providers.factories", "fake"),
    "firecracker": ProviderEntry("corral.providers.firecracker", "from_settings"),
    "http": ProviderEntry("corral.providers.http", "from_settings"),
    "e2b": ProviderEntry("corral.providers.e2b", "from_settings", install_hint="'corral[e2b]'"),
}


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
