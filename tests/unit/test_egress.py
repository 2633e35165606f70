"""Egress rules without a workspace: parsing and its errors, host-name matching, the packet filter they render to,
and reading a host name out of a connection's first bytes."""

from __future__ import annotations

import ipaddress
import ssl
import subprocess

import pytest

from corral.egress import EgressPolicy, host_allowed, render_rules
from corral.egress.policy import parse_always_deny
from corral.egress.proxy import hello_host
from corral.errors import InvalidRequestError

pytestmark = pytest.mark.unit


def test_parse_sorts_entries_and_round_trips() -> None:
    """Addresses become networks, names are lowercased, duplicates go, and to_json/from_json give the same policy."""
    policy = EgressPolicy.parse(
        allow_out=["10.0.0.1", "10.0.0.1/32", "API.Example.com.", "*.corral.test"], deny_out=["0.0.0.0/0"]
    )
    assert [str(n) for n in policy.allow_networks] == ["10.0.0.1/32"]
    assert policy.allow_hosts == ("api.example.com", "*.corral.test")
    assert policy.needs_proxy and policy.denies_everything
    assert EgressPolicy.from_json(policy.to_json()) == policy


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"deny_out": ["example.com"]}, "host names are allowed only in allow_out"),
        ({"allow_out": ["not a host!"]}, "'not a host!' is neither an IP address"),
        ({"allow_out": ["*"]}, "'*' is neither"),
        ({"allow_out": "10.0.0.1"}, "allow_out: must be a list of strings"),
        ({"allow_out": ["10.0.0.1"] * 300}, "at most 256 entries"),
        ({"dns_servers": ["::1"]}, "'::1' is not an IPv4 address"),
        ({"dns_servers": ["1.1.1.1"] * 11}, "at most 10 entries"),
    ],
)
def test_bad_rules_name_what_is_wrong(kwargs: dict[str, object], fragment: str) -> None:
    """Each malformed input is refused with a message naming the field and the rule."""
    with pytest.raises(InvalidRequestError) as caught:
        EgressPolicy.parse(**kwargs)  # type: ignore[arg-type]
    assert fragment in caught.value.message


def test_allow_internet_access_false_denies_everything() -> None:
    """E2B's flag is the same as denying 0.0.0.0/0; nothing denied means nothing is restricted."""
    assert EgressPolicy.parse(allow_internet_access=False).denies_everything
    assert not EgressPolicy.parse(allow_out=["example.com"]).restricts


def test_host_matching_follows_e2b() -> None:
    """Exact names match in any case and with a trailing dot; ``*.`` matches subdomains at any depth, not the apex."""
    policy = EgressPolicy.parse(allow_out=["api.example.com", "*.corral.test"], deny_out=["0.0.0.0/0"])
    assert host_allowed(policy, "API.example.com.")
    assert host_allowed(policy, "a.b.corral.test")
    assert not host_allowed(policy, "corral.test")
    assert not host_allowed(policy, "evilcorral.test")
    assert not host_allowed(policy, "example.com")
    assert not host_allowed(policy, "")


def test_rendered_rules_are_accepted_by_iptables_restore() -> None:
    """The rules parse with the real ``iptables-restore --test``: allowed before denied, DNS opened for host names,
    TCP to denied addresses redirected to the proxy, and IPv6 closed when everything is denied."""
    policy = EgressPolicy.parse(
        allow_out=["10.1.0.0/16", "example.com"], deny_out=["0.0.0.0/0"], dns_servers=["192.0.2.53"]
    )
    v4 = render_rules(policy, version=4, proxy_port=4242)
    lines = v4.splitlines()
    assert lines.index("-A OUTPUT -d 10.1.0.0/16 -j ACCEPT") < lines.index(
        "-A OUTPUT -d 0.0.0.0/0 -p tcp -j REJECT --reject-with tcp-reset"
    )
    assert "-A OUTPUT -d 192.0.2.53 -p udp --dport 53 -j ACCEPT" in lines
    assert "-A OUTPUT -d 0.0.0.0/0 -p tcp -j REDIRECT --to-ports 4242" in lines
    v6 = render_rules(policy, version=6, proxy_port=4242)
    assert "-A OUTPUT -d ::/0 -p tcp -j REJECT --reject-with tcp-reset" in v6
    assert "REDIRECT" not in v6
    for command, rules in (("iptables-restore", v4), ("ip6tables-restore", v6)):
        proc = subprocess.run([command, "--test"], input=rules, text=True, capture_output=True, check=False)
        assert proc.returncode == 0, proc.stderr


def test_no_rules_render_empty_tables() -> None:
    """Lifting the rules renders tables with nothing in them (everything allowed)."""
    assert "-A " not in render_rules(EgressPolicy(), version=4, proxy_port=None)


def test_host_from_http_and_tls() -> None:
    """The Host header (port dropped) of an HTTP request, the SNI of a real TLS ClientHello, and nothing otherwise."""
    assert hello_host(b"GET / HTTP/1.1\r\nhost: Example.com:8080\r\n\r\n") == "Example.com"
    assert hello_host(b"GET / HTTP/1.1\r\nUser-Agent: x\r\n\r\n") is None
    assert hello_host(b"SSH-2.0-OpenSSH\r\n") is None
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="api.corral.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert hello_host(hello) == "api.corral.test"
    assert hello_host(hello[:20]) is None  # cut short: no name, no crash


def test_always_denied_networks_are_rejected_after_the_allowed_ones() -> None:
    """What is always denied is rejected even with no rules, after allowed addresses (allow wins) and after the
    workspace's own nameservers, which stay reachable."""
    base = [ipaddress.ip_network("172.17.0.0/16"), ipaddress.ip_network("169.254.0.0/16")]
    rules = render_rules(
        EgressPolicy.parse(allow_out=["172.17.0.9"]), version=4, proxy_port=None, nameservers=["172.17.0.1"],
        base_deny=base,
    ).splitlines()  # fmt: skip
    allow = rules.index("-A OUTPUT -d 172.17.0.9/32 -j ACCEPT")
    dns = rules.index("-A OUTPUT -d 172.17.0.1 -p udp --dport 53 -j ACCEPT")
    reject = rules.index("-A OUTPUT -d 172.17.0.0/16 -p tcp -j REJECT --reject-with tcp-reset")
    assert allow < reject and dns < reject
    assert "-A OUTPUT -d 169.254.0.0/16 -j REJECT --reject-with icmp-admin-prohibited" in rules
    assert "REDIRECT" not in "\n".join(rules)


def test_always_deny_setting_is_checked() -> None:
    """CORRAL_EGRESS_ALWAYS_DENY takes CIDR blocks and ``bridge``; anything else is a startup error naming it."""
    assert parse_always_deny(" 169.254.0.0/16, bridge ,") == ("169.254.0.0/16", "bridge")
    assert parse_always_deny("") == ()
    with pytest.raises(ValueError, match="'lan' is neither a CIDR block nor 'bridge'"):
        parse_always_deny("10.0.0.0/8,lan")


@pytest.mark.parametrize("entry", ["fe80::1%eth0", "fe80::1%a\n-I OUTPUT 1 -j ACCEPT\n#", "10.1", "2130706433",
                                   "0x7f000001", "host.123"])  # fmt: skip
def test_addresses_in_disguise_are_refused(entry: str) -> None:
    """An IPv6 zone (whose text would reach the rules), and names the resolver reads as addresses, are refused."""
    with pytest.raises(InvalidRequestError):
        EgressPolicy.parse(allow_out=[entry])


def test_only_replies_ride_on_established_flows() -> None:
    """Flows the workspace opened are checked packet by packet (tightened rules cut them); only replies to flows
    opened into it are let through as established."""
    rules = render_rules(EgressPolicy.parse(deny_out=["0.0.0.0/0"]), version=4, proxy_port=None)
    assert "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT" in rules.splitlines()
