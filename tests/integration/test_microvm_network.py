"""Real TAP devices, addresses and iptables rules, made inside a network namespace each test creates.

The host namespace is never touched: every command runs under ``ip netns exec``, and each test checks afterwards
that the host holds no TAP device of the manager's prefix and no ``corral-fc:`` rule, and that its namespace is gone.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest

from corral.microvm.network import HostNetwork, NetworkConfig
from corral.testing.microvm import Netns, corral_network_objects

pytestmark = pytest.mark.integration


@pytest.fixture
def netns() -> Iterator[Netns]:
    """A namespace for this test; deleted afterwards, with the host checked for leftovers."""
    before = corral_network_objects()
    ns = Netns.create()
    yield ns
    ns.delete()
    assert not ns.exists()
    assert corral_network_objects() == before == []


@pytest.fixture
async def net(netns: Netns) -> AsyncIterator[HostNetwork]:
    """A HostNetwork working in the test's namespace; every lease it still holds is torn down afterwards."""
    network = HostNetwork(NetworkConfig(netns=netns.name))
    yield network
    await network.cleanup_orphans(set())


def _addresses(netns: Netns, dev: str) -> list[str]:
    out = netns.run("ip", "-o", "-4", "addr", "show", "dev", dev).stdout
    return [line.split()[3] for line in out.splitlines()]


async def test_default_mode_tap_address_and_nat(netns: Netns, net: HostNetwork) -> None:
    """Default mode: a TAP with the host end of the /30, MASQUERADE for the guest, and FORWARD accepts."""
    lease = await net.setup("vm-default", "default")
    assert lease.tap in netns.links()
    assert _addresses(netns, lease.tap) == [f"{lease.host_ip}/30"]
    assert "tun" in netns.run("ip", "-d", "link", "show", lease.tap).stdout
    nat = [r for r in netns.iptables("nat") if "corral-fc:vm-default" in r]
    assert nat == [
        f'-A POSTROUTING -s {lease.guest_ip}/32 ! -o {lease.tap} -m comment --comment "corral-fc:vm-default" '
        "-j MASQUERADE"
    ]
    forward = [r for r in netns.iptables() if "corral-fc:vm-default" in r]
    assert forward == [
        f'-A FORWARD -i {lease.tap} -m comment --comment "corral-fc:vm-default" -j ACCEPT',
        f"-A FORWARD -o {lease.tap} -m conntrack --ctstate RELATED,ESTABLISHED -m comment "
        '--comment "corral-fc:vm-default" -j ACCEPT',
    ]
    assert netns.run("sysctl", "-n", "net.ipv4.ip_forward").stdout.strip() == "1"
    await net.teardown(lease)
    assert netns.links() == ["lo"]
    assert [r for r in netns.iptables() + netns.iptables("nat") if "corral-fc" in r] == []


async def test_isolated_mode_has_no_nat(netns: Netns, net: HostNetwork) -> None:
    """Isolated mode: no NAT rule at all, forwarding dropped both ways, input only to the host end."""
    lease = await net.setup("vm-iso", "isolated")
    assert [r for r in netns.iptables("nat") if "corral-fc" in r] == []
    assert sorted(r for r in netns.iptables() if "corral-fc" in r) == sorted([
        f'-A FORWARD -i {lease.tap} -m comment --comment "corral-fc:vm-iso" -j DROP',
        f'-A FORWARD -o {lease.tap} -m comment --comment "corral-fc:vm-iso" -j DROP',
        f'-A INPUT ! -d {lease.host_ip}/32 -i {lease.tap} -m comment --comment "corral-fc:vm-iso" -j DROP',
    ])  # fmt: skip
    await net.teardown(lease)
    assert [r for r in netns.iptables() if "corral-fc" in r] == []


async def test_concurrent_setups_get_distinct_taps_and_addresses(netns: Netns, net: HostNetwork) -> None:
    """Ten simultaneous setups get ten TAP devices and ten /30s, and all are removed again."""
    leases = await asyncio.gather(*(net.setup(f"vm{i}", "default" if i % 2 else "isolated") for i in range(10)))
    assert len({lease.tap for lease in leases}) == 10
    assert len({lease.guest_ip for lease in leases}) == 10
    assert sorted(netns.links()) == sorted(["lo", *(lease.tap for lease in leases)])
    for lease in leases:
        assert _addresses(netns, lease.tap) == [f"{lease.host_ip}/30"]
    await asyncio.gather(*(net.teardown(lease) for lease in leases))
    assert netns.links() == ["lo"]
    assert [r for r in netns.iptables() + netns.iptables("nat") if "corral-fc" in r] == []


async def test_orphans_of_a_crashed_manager_are_cleaned_and_leases_restored(netns: Netns) -> None:
    """A new HostNetwork removes objects no lease holds and recreates a kept lease's missing TAP device."""
    first = HostNetwork(NetworkConfig(netns=netns.name))
    kept = await first.setup("kept", "default")
    await first.setup("orphan", "isolated")
    netns.run("ip", "link", "del", kept.tap)  # e.g. the host rebooted
    second = HostNetwork(NetworkConfig(netns=netns.name))
    second.allocator.reserve("kept", kept.index)
    removed = await second.cleanup_orphans({"kept"})
    assert any("corral-fc:orphan" in r for r in removed)
    await second.restore(kept)
    assert sorted(netns.links()) == ["fctap0", "lo"]
    assert len(await second.rules_of("kept")) == 3
    await second.teardown(kept)
    assert netns.links() == ["lo"]


async def test_guest_init_configures_eth0_from_the_ip_argument(netns: Netns) -> None:
    """The VM init's ioctl network setup gives eth0 its address, brings it up and adds the default route."""
    netns.run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")  # the guest's virtio-net NIC
    netns.run("ip", "link", "set", "peer0", "up")
    script = (
        "from corral.microvm.guest_init import configure_interface, parse_ip_arg;"
        "c = parse_ip_arg('172.31.0.6::172.31.0.5:255.255.255.252:ws:eth0:off');"
        "print(configure_interface(c)); print(configure_interface(c))"
    )
    done = netns.run(sys.executable, "-c", script)
    assert done.stdout.split() == ["True", "False"], "the second call must see the address and change nothing"
    assert netns.run("ip", "-o", "-4", "addr", "show", "dev", "eth0").stdout.split()[3] == "172.31.0.6/30"
    assert "UP" in netns.run("ip", "link", "show", "eth0").stdout
    assert netns.run("ip", "route", "show", "default").stdout.split()[:5] == [
        "default", "via", "172.31.0.5", "dev", "eth0",
    ]  # fmt: skip


def test_namespace_commands_never_reach_the_host() -> None:
    """Sanity of the harness: a link made in a test namespace is not visible in the host namespace."""
    ns = Netns.create()
    try:
        ns.run("ip", "tuntap", "add", "dev", "fctap999", "mode", "tap")
        assert "fctap999" in ns.links()
        host = subprocess.run(["ip", "link", "show", "fctap999"], capture_output=True, check=False)
        assert host.returncode != 0
    finally:
        ns.delete()
    assert corral_network_objects() == []
