"""Egress rules of a networked workspace: what they mean, how they are checked, and the packet filter they become.

The shape is E2B's (``allow_out`` / ``deny_out`` / ``dns_servers``), and so is the meaning:

* ``deny_out`` holds IPv4/IPv6 addresses and CIDR blocks; ``0.0.0.0/0`` means *all traffic* (IPv6 included).
* ``allow_out`` holds addresses, CIDR blocks and host names (``example.com``, or ``*.example.com`` for every
  subdomain at any depth, not the apex). An allowed entry always wins over a denied one.
* Nothing denied means everything is allowed, and ``allow_out`` then changes nothing.
* When ``allow_out`` names a host, the DNS servers in ``dns_servers`` may be reached (default: the workspace's own
  nameservers, from its resolv.conf), so the workspace can look names up.

Enforcement (see :mod:`corral.egress.controller`) is a packet filter inside the workspace's network namespace:
addresses are matched by ``iptables``/``ip6tables``; TCP to a denied address is redirected, when host names are
allowed, to Corral's name-checking proxy, which lets a connection through only if its TLS SNI or HTTP ``Host``
names an allowed host, and then dials *that name* (so naming an allowed host cannot reach another address). Every
other packet to a denied address is rejected at once (TCP reset, ICMP unreachable), not dropped.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.errors import InvalidRequestError

__all__ = ["ALL_TRAFFIC", "EGRESS_MARK", "EgressPolicy", "Network", "host_allowed", "parse_always_deny", "render_rules"]

ALL_TRAFFIC = "0.0.0.0/0"
"""E2B's sentinel for every destination."""

EGRESS_MARK = 0xC0E5
"""The socket mark of the proxy's own connections: the filter lets them out. Setting a mark takes CAP_NET_ADMIN,
which no workspace process holds."""

MAX_ENTRIES = 256
"""Entries per list: enough for real allow lists, and a bound on the rules one request can make."""

MAX_DNS_SERVERS = 10

_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Validated egress rules. Build one with :meth:`parse`; ``to_json`` gives back what was asked for."""

    allow_networks: tuple[Network, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    deny_networks: tuple[Network, ...] = ()
    dns_servers: tuple[ipaddress.IPv4Address, ...] | None = None
    """``None``: the workspace's own nameservers; ``()``: none."""

    @classmethod
    def parse(
        cls,
        *,
        allow_out: object = None,
        deny_out: object = None,
        dns_servers: object = None,
        allow_internet_access: bool | None = None,
        field_prefix: str = "",
    ) -> EgressPolicy:
        """Check and normalise rules as a client sent them.

        Args:
            allow_out: A list of addresses, CIDR blocks and host names, or None.
            deny_out: A list of addresses and CIDR blocks, or None.
            dns_servers: A list of IPv4 addresses (at most 10), or None for the workspace's nameservers.
            allow_internet_access: False adds ``0.0.0.0/0`` to ``deny_out``, as E2B's flag does.
            field_prefix: Prepended to field names in error messages (``"network."``).

        Raises:
            InvalidRequestError: An entry is not an address, a CIDR block or (in ``allow_out``) a host name; a list
                is too long or not a list of strings.
        """
        allow = _strings(allow_out, field_prefix + "allow_out")
        deny = _strings(deny_out, field_prefix + "deny_out")
        allow_networks: list[Network] = []
        allow_hosts: list[str] = []
        for entry in allow:
            network = _network(entry)
            if network is not None:
                allow_networks.append(network)
            else:
                allow_hosts.append(_host(entry, field_prefix + "allow_out"))
        deny_networks: list[Network] = []
        for entry in deny:
            network = _network(entry)
            if network is None:
                raise InvalidRequestError(
                    f"{field_prefix}deny_out: {entry!r} is not an IP address or CIDR block "
                    "(host names are allowed only in allow_out)",
                    details={"field": field_prefix + "deny_out", "value": entry},
                )
            deny_networks.append(network)
        if allow_internet_access is False:
            deny_networks.append(ipaddress.ip_network(ALL_TRAFFIC))
        servers: tuple[ipaddress.IPv4Address, ...] | None = None
        if dns_servers is not None:
            names = _strings(dns_servers, field_prefix + "dns_servers", limit=MAX_DNS_SERVERS)
            parsed = []
            for name in names:
                try:
                    parsed.append(ipaddress.IPv4Address(name))
                except ValueError:
                    raise InvalidRequestError(
                        f"{field_prefix}dns_servers: {name!r} is not an IPv4 address",
                        details={"field": field_prefix + "dns_servers", "value": name},
                    ) from None
            servers = tuple(parsed)
        return cls(
            allow_networks=tuple(dict.fromkeys(allow_networks)),
            allow_hosts=tuple(dict.fromkeys(allow_hosts)),
            deny_networks=tuple(dict.fromkeys(deny_networks)),
            dns_servers=servers,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EgressPolicy:
        """The policy :meth:`to_json` stored."""
        return cls.parse(
            allow_out=data.get("allow_out", []), deny_out=data.get("deny_out", []), dns_servers=data.get("dns_servers")
        )

    def to_json(self) -> dict[str, Any]:
        """The rules as lists of strings (``dns_servers`` left out when it is the default)."""
        data: dict[str, Any] = {
            "allow_out": [str(n) for n in self.allow_networks] + list(self.allow_hosts),
            "deny_out": [str(n) for n in self.deny_networks],
        }
        if self.dns_servers is not None:
            data["dns_servers"] = [str(s) for s in self.dns_servers]
        return data

    @property
    def empty(self) -> bool:
        """Whether there are no rules at all (allowed addresses still matter: they open what is always denied)."""
        return not (self.allow_networks or self.allow_hosts or self.deny_networks or self.dns_servers is not None)

    @property
    def restricts(self) -> bool:
        """Whether anything is denied at all (nothing denied: every destination is allowed)."""
        return bool(self.deny_networks)

    @property
    def needs_proxy(self) -> bool:
        """Whether connections to denied addresses go through the name-checking proxy."""
        return self.restricts and bool(self.allow_hosts)

    @property
    def denies_everything(self) -> bool:
        """Whether ``0.0.0.0/0`` is denied (which also denies all IPv6)."""
        return any(n.prefixlen == 0 for n in self.deny_networks)


def host_allowed(policy: EgressPolicy, name: str) -> bool:
    """Whether ``name`` (an SNI or Host header, any case, optional trailing dot) matches an allowed host name:
    exactly, or under a ``*.`` entry at any depth (not the apex)."""
    name = name.lower().rstrip(".")
    if not name:
        return False
    for entry in policy.allow_hosts:
        if entry.startswith("*."):
            if name.endswith(entry[1:]):
                return True
        elif name == entry:
            return True
    return False


def render_rules(
    policy: EgressPolicy,
    *,
    version: int,
    proxy_port: int | None,
    nameservers: Sequence[str] = (),
    base_deny: Sequence[Network] = (),
) -> str:
    """The ``iptables-restore`` (``version`` 4) or ``ip6tables-restore`` (6) input that enforces ``policy`` in a
    workspace's network namespace, replacing its ``filter`` and ``nat`` tables whole.

    Args:
        policy: The rules.
        version: 4 or 6.
        proxy_port: Where the name-checking proxy listens on the namespace's loopback (IPv4 only), or None.
        nameservers: The workspace's own nameservers, allowed when ``policy.dns_servers`` is None and the policy
            allows host names, and always when ``base_deny`` is in force.
        base_deny: What every networked workspace is denied whatever its rules say (other workspaces, the host's
            bridge address, link-local metadata services), unless ``allow_out`` names it by address.
    """
    lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
    nat = ["*nat", *(f":{chain} ACCEPT [0:0]" for chain in ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"))]
    base = [n for n in base_deny if n.version == version]
    if policy.restricts or base:
        allow = [n for n in policy.allow_networks if n.version == version]
        deny = [n for n in policy.deny_networks if n.version == version]
        if version == 6 and policy.denies_everything:
            deny = [ipaddress.ip_network("::/0")]
        loopback = "127.0.0.0/8" if version == 4 else "::1/128"
        lines += [
            "-A OUTPUT -o lo -j ACCEPT",
            # A redirected connection still names its first route's device here: accept it by its new address.
            f"-A OUTPUT -d {loopback} -j ACCEPT",
            # Replies to connections made *into* the workspace (its preview ports), and the rest of flows already
            # let through.
            # (REPLY direction only: a flow the workspace opened is checked packet by packet, so tightened rules cut
            # it at once instead of letting an open tunnel live on).
            "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT",
            f"-A OUTPUT -m mark --mark {EGRESS_MARK:#x} -j ACCEPT",
        ]
        lines += [f"-A OUTPUT -d {n} -j ACCEPT" for n in allow]
        servers = list(nameservers) if base else []
        if policy.allow_hosts:
            servers += [str(s) for s in policy.dns_servers] if policy.dns_servers is not None else list(nameservers)
        dns = [s for s in dict.fromkeys(servers) if ipaddress.ip_address(s).version == version]
        for server in dns:
            lines += [f"-A OUTPUT -d {server} -p {proto} --dport 53 -j ACCEPT" for proto in ("udp", "tcp")]
        if deny and version == 4 and proxy_port is not None and policy.needs_proxy:
            # Outside the filter: the proxy's own sockets (marked) and allowed addresses go out directly; any other
            # TCP to a denied address is handed to the proxy, which checks the name it is for.
            nat += [
                "-A OUTPUT -o lo -j RETURN",
                f"-A OUTPUT -m mark --mark {EGRESS_MARK:#x} -j RETURN",
                *(f"-A OUTPUT -d {n} -j RETURN" for n in allow),
                *(f"-A OUTPUT -d {s} -p tcp --dport 53 -j RETURN" for s in dns),  # DNS over TCP is no name to check
                *(f"-A OUTPUT -d {n} -p tcp -j REDIRECT --to-ports {proxy_port}" for n in deny),
            ]
        reject_tcp = "tcp-reset"
        unreachable = "icmp-admin-prohibited" if version == 4 else "icmp6-adm-prohibited"
        for n in dict.fromkeys([*deny, *base]):
            lines += [
                f"-A OUTPUT -d {n} -p tcp -j REJECT --reject-with {reject_tcp}",
                f"-A OUTPUT -d {n} -j REJECT --reject-with {unreachable}",
            ]
    return "\n".join([*lines, "COMMIT", *nat, "COMMIT", ""])


def parse_always_deny(text: str) -> tuple[str, ...]:
    """``CORRAL_EGRESS_ALWAYS_DENY``: comma-separated CIDR blocks, and ``bridge`` for the workspace's own bridge
    network (other workspaces and the host's address on it).

    Raises:
        ValueError: An entry is neither.
    """
    entries = tuple(e.strip() for e in text.split(",") if e.strip())
    for entry in entries:
        if entry != "bridge" and _network(entry) is None:
            raise ValueError(f"CORRAL_EGRESS_ALWAYS_DENY: {entry!r} is neither a CIDR block nor 'bridge'")
    return entries


# --- parsing helpers ---


def _numeric(name: str) -> bool:
    """Whether a name is an address in disguise ("10.1", "2130706433", "0x7f000001") or ends in a numeric label,
    which the resolver would read as an address rather than look up."""
    try:
        socket.inet_aton(name)
    except OSError:
        return name.rsplit(".", 1)[-1].isdigit()
    return True


def _strings(value: object, field: str, limit: int = MAX_ENTRIES) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(f"{field}: must be a list of strings", details={"field": field})
    if len(value) > limit:
        raise InvalidRequestError(
            f"{field}: at most {limit} entries, got {len(value)}", details={"field": field, "limit": limit}
        )
    return [v.strip() for v in value]


_ADDRESS_CHARS = re.compile(r"^[0-9a-fA-F:./]+$")


def _network(entry: str) -> Network | None:
    if not _ADDRESS_CHARS.match(entry):  # e.g. an IPv6 zone ("fe80::1%eth0"), which would reach the rules' text
        return None
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None


def _host(entry: str, field: str) -> str:
    name = entry.lower().rstrip(".")
    labels = name[2:].split(".") if name.startswith("*.") else name.split(".")
    if len(name) > 253 or not all(_HOST_LABEL.match(label) for label in labels) or _numeric(name):
        raise InvalidRequestError(
            f"{field}: {entry!r} is neither an IP address, a CIDR block nor a host name "
            "(host names may start with '*.' for every subdomain)",
            details={"field": field, "value": entry},
        )
    return name
