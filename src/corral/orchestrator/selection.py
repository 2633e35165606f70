"""Which provider serves ``provider: "auto"``, as a pure function of settings and health.

The preference order is the providers' ranks in the registry (:mod:`corral.providers.registry`):

* managed deployment with an E2B key: e2b first (no local resources used);
* then the self-hosted order, by container type: agent workspaces prefer firecracker (a microVM: the strongest
  isolation), MCP servers prefer gvisor (lighter for long-lived processes); a custom HTTP backend after both;
* plain docker last, and only when the operator allows it (it shares the host kernel);
* a third-party provider where its registered rank puts it.

Only configured providers are considered. :func:`fallback_chain` keeps unhealthy ones in the list (they are skipped
with their reason recorded) so an all-fail error can name every provider.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from corral.providers.registry import KNOWN_PROVIDERS
from corral.settings import Settings

__all__ = ["SelectionInputs", "fallback_chain", "preference_order"]


@dataclass(frozen=True, slots=True)
class SelectionInputs:
    """What selection depends on."""

    deployment_mode: Literal["self-hosted", "managed"]
    e2b_configured: bool
    allow_docker: bool
    configured: tuple[str, ...]

    @classmethod
    def of(cls, settings: Settings, configured: Iterable[str]) -> SelectionInputs:
        """What selection depends on, from settings and the configured providers' names."""
        return cls(
            deployment_mode=settings.deployment_mode,
            e2b_configured=bool(settings.e2b_api_key),
            allow_docker=settings.allow_docker_fallback,
            configured=tuple(configured),
        )


def preference_order(inputs: SelectionInputs, container_type: str) -> list[str]:
    """Every configured provider auto may use for this container type, best first (health not considered).

    The order comes from each provider's registry entry (:class:`~corral.providers.registry.ProviderEntry`); plain
    runc and other providers that reduce isolation only while the operator allows them.
    """
    managed = inputs.deployment_mode == "managed" and inputs.e2b_configured
    ranked: list[tuple[int, int, str]] = []
    for position, name in enumerate(inputs.configured):
        entry = KNOWN_PROVIDERS.get(name)
        if entry is None or (entry.reduced_isolation and not inputs.allow_docker):
            continue
        rank = entry.rank(container_type, managed=managed)
        if rank is not None:
            ranked.append((rank, position, name))
    return [name for _, _, name in sorted(ranked)]


def fallback_chain(inputs: SelectionInputs, container_type: str, healthy: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split the preference order into (healthy providers to try in order, unhealthy ones to report as skipped)."""
    healthy_set = set(healthy)
    order = preference_order(inputs, container_type)
    return [p for p in order if p in healthy_set], [p for p in order if p not in healthy_set]
