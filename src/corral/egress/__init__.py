"""Egress rules for networked workspaces: E2B-shaped allow/deny lists enforced inside each workspace's network
namespace (see :mod:`corral.egress.policy` for the meaning, :mod:`corral.egress.controller` for the enforcement)."""

from corral.egress.controller import EgressController, nameservers_of
from corral.egress.policy import ALL_TRAFFIC, EgressPolicy, host_allowed, render_rules

__all__ = ["ALL_TRAFFIC", "EgressController", "EgressPolicy", "host_allowed", "nameservers_of", "render_rules"]
