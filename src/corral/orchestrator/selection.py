"""Which provider serves ``provider: "auto"`` (seed 000), as a pure function of settings and health.

The preference order:

* managed deployment with an E2B key: e2b first (no local resources used);
* then the self-hosted order, by container type: agent workspaces prefer firecracker (a microVM: the strongest
  isolation), MCP servers prefer gvisor (lighter for long-lived processes);
* plain docker last, and only when the operator allows it (it shares the host kernel).

Only configured providers are considered. :func:`fallback_chain` keeps unhealthy ones in the list (they are skipped
with their reason recorded) so an all-fail error can name every provider.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["AUTO_ELIGIBLE", "SelectionInputs", "fallback_chain", "preference_order"]

AUTO_ELIGIBLE = ("e2b", "firecracker", "gvisor", "docker", "http")
"""Providers auto selection may use; ``fake`` never is."""


@dataclass(frozen=True, slots=True)
class SelectionInputs:
    """What selection depends on."""

    deployment_mode: Literal["self-hosted", "managed"]
    e2b_configured: bool
    allow_docker: bool
    configured: tuple[str, ...]


def preference_order(inputs: SelectionInputs, container_type: str) -> list[str]:
    """Every provider auto may use for this container type, best first (health not considered)."""
    self_hosted = ["gvisor", "firecracker"] if container_type == "mcp_server" else ["firecracker", "gvisor"]
    order = ["e2b", *self_hosted] if inputs.deployment_mode == "managed" and inputs.e2b_configured else self_hosted
    order.append("http")
    if inputs.allow_docker:
        order.append("docker")
    return [name for name in order if name in inputs.configured]


def fallback_chain(inputs: SelectionInputs, container_type: str, healthy: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split the preference order into (healthy providers to try in order, unhealthy ones to report as skipped)."""
    healthy_set = set(healthy)
    order = preference_order(inputs, container_type)
    return [p for p in order if p in healthy_set], [p for p in order if p not in healthy_set]
