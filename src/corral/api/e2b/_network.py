"""E2B's network options on create and ``update_network``, as Corral egress rules (:mod:`corral.egress`).

* ``allow_internet_access: false`` with nothing in ``allowOut`` gives an *isolated* workspace: no network at all,
  the strongest form of "deny everything". Such a sandbox cannot be given rules later (it has no network to filter);
  ``update_network`` says so.
* Any other ``denyOut`` (or ``allow_internet_access: false`` with ``allowOut``) gives a networked workspace with the
  rules in force inside its network namespace from before the create answers.
* ``dnsServers`` defaults to the workspace's own nameservers (E2B's default, 8.8.8.8, would be a server on the
  internet); host names in ``allowOut`` are matched by TLS SNI or HTTP ``Host`` (any port) and dialled by name.
* Per-host request transforms (``rules``), a SOCKS5 ``egressProxy`` and ``httpsPorts`` are not supported: asking
  for them is a 400 that says so, never a silent no-op.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.api.e2b._errors import E2BApiError
from corral.egress import ALL_TRAFFIC, EgressPolicy
from corral.errors import InvalidRequestError
from corral.store import WorkspaceRecord

__all__ = ["egress_of_create", "egress_of_update", "isolated", "network_json"]

_UNSUPPORTED = {
    "rules": "per-host request transforms (network.rules) are not supported by Corral",
    "egressProxy": "a SOCKS5 egress proxy (network.egressProxy) is not supported by Corral",
}


def _network(body: Mapping[str, Any]) -> Mapping[str, Any]:
    network = body.get("network")
    if network is None:
        return {}
    if not isinstance(network, Mapping):
        raise E2BApiError(400, "network: must be an object")
    for key, message in _UNSUPPORTED.items():
        if network.get(key):
            raise E2BApiError(400, message)
    if network.get("httpsPorts"):
        raise E2BApiError(400, "network.httpsPorts: preview ports are served over plain HTTP by Corral")
    return network


def _policy(network: Mapping[str, Any], allow_internet_access: object) -> EgressPolicy:
    if allow_internet_access is not None and not isinstance(allow_internet_access, bool):
        raise E2BApiError(400, "allow_internet_access: must be a boolean")
    try:
        return EgressPolicy.parse(
            allow_out=network.get("allowOut"),
            deny_out=network.get("denyOut"),
            dns_servers=network.get("dnsServers"),
            allow_internet_access=allow_internet_access,
            field_prefix="network.",
        )
    except InvalidRequestError as exc:
        raise E2BApiError(400, exc.message) from exc


def isolated(body: Mapping[str, Any]) -> bool:
    """Whether a create asks for no network at all: everything denied and nothing allowed."""
    network = _network(body)
    policy = _policy(network, body.get("allow_internet_access"))
    return policy.denies_everything and not policy.allow_networks and not policy.allow_hosts


def egress_of_create(body: Mapping[str, Any]) -> EgressPolicy | None:
    """The rules a create asks for (None: none, or an isolated sandbox, which needs none)."""
    if isolated(body):
        return None
    policy = _policy(_network(body), body.get("allow_internet_access"))
    return None if policy.empty else policy


def egress_of_update(body: Mapping[str, Any]) -> EgressPolicy:
    """The rules an ``update_network`` body sets: they replace the old ones whole (what it leaves out is cleared)."""
    wrapped = {"network": body}
    _network(wrapped)
    flag = body.get("allow_internet_access", body.get("allowInternetAccess"))
    return _policy(body, flag)


def network_json(record: WorkspaceRecord, *, allow_public_traffic: bool) -> dict[str, Any]:
    """``SandboxNetworkConfig`` as the sandbox detail shows it."""
    stored = record.metadata.get("egress")
    rules: dict[str, Any] = dict(stored) if isinstance(stored, Mapping) else {}
    if record.network != "default":
        rules = {"deny_out": [ALL_TRAFFIC]}
    network: dict[str, Any] = {
        "allowPublicTraffic": allow_public_traffic,
        "allowOut": list(rules.get("allow_out", [])),
        "denyOut": list(rules.get("deny_out", [])),
    }
    if "dns_servers" in rules:
        network["dnsServers"] = list(rules["dns_servers"])
    return network
