"""IP allocation, leases, and the exact commands HostNetwork runs (against a recording runner, no real network)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from corral.errors import ResourceLimitError
from corral.microvm.network import CommandResult, HostNetwork, IpAllocator, Lease, NetworkConfig, NetworkError

pytestmark = pytest.mark.unit


class Recorder:
    """A command runner double: records argv, answers ``iptables -S`` from ``rules`` and fails on request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.rules: dict[str, list[str]] = {"filter": ["-P FORWARD ACCEPT"], "nat": []}
        self.links: set[str] = set()
        self.fail_on: str | None = None
        self.forwarding = "1"

    async def __call__(self, argv: Sequence[str]) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        cmd = argv[4:] if argv[:3] == ("ip", "netns", "exec") else argv
        if self.fail_on is not None and self.fail_on in " ".join(cmd):
            return CommandResult(argv, 2, "", "simulated failure")
        out = ""
        if cmd[:3] == ("ip", "link", "show"):
            return CommandResult(argv, 0 if cmd[-1] in self.links else 1, "", "")
        if cmd[:3] == ("ip", "-o", "link"):
            out = "".join(f"{i}: {name}: <UP>\n" for i, name in enumerate(sorted(self.links)))
        elif cmd[:3] == ("ip", "tuntap", "add"):
            self.links.add(cmd[4])
        elif cmd[:3] == ("ip", "link", "del"):
            self.links.discard(cmd[-1])
        elif cmd[0] == "iptables":
            table = cmd[cmd.index("-t") + 1] if "-t" in cmd else "filter"
            action = next(a for a in cmd if a in ("-A", "-I", "-D", "-S"))
            rule = list(cmd[cmd.index(action) + 1 :])
            if action == "-S":
                out = "\n".join(self.rules[table]) + "\n"
            elif action == "-I":
                del rule[1]  # the position
                self.rules[table].insert(1, _listing(rule))
            elif action == "-A":
                self.rules[table].append(_listing(rule))
            else:
                self.rules[table].remove(_listing(rule))
        elif cmd[:2] == ("sysctl", "-n"):
            out = self.forwarding + "\n"
        elif cmd[:2] == ("sysctl", "-q"):
            self.forwarding = "1"
        elif cmd[:5] == ("ip", "-o", "-4", "route", "show"):
            out = ""
        return CommandResult(argv, 0, out, "")

    def commands(self) -> list[str]:
        """Calls without the netns prefix and the read-only ones, as strings."""
        return [
            " ".join(c[4:] if c[:3] == ("ip", "netns", "exec") else c)
            for c in self.calls
            if "-S" not in c and "show" not in c and "-n" not in c[:6]
        ]


def _listing(rule: list[str]) -> str:
    """How ``iptables -S`` prints a rule: comment values quoted."""
    words = [f'"{w}"' if i > 0 and rule[i - 1] == "--comment" else w for i, w in enumerate(rule)]
    return "-A " + " ".join(words)


def test_allocator_hands_out_the_lowest_free_slash30() -> None:
    """Indexes start at 0, map to .1 (host) and .2 (guest) of their /30, and freed ones are reused."""
    alloc = IpAllocator("172.31.0.0/16")
    assert alloc.capacity == 16384
    assert [alloc.allocate(f"vm{i}") for i in range(3)] == [0, 1, 2]
    assert alloc.addresses(0) == ("172.31.0.1", "172.31.0.2")
    assert alloc.addresses(2) == ("172.31.0.9", "172.31.0.10")
    assert alloc.allocate("vm1") == 1, "the same VM keeps its index"
    alloc.release("vm1")
    assert alloc.allocate("vm9") == 1
    assert alloc.in_use == 3


def test_allocator_refuses_past_capacity() -> None:
    """A full subnet raises ResourceLimitError naming the subnet."""
    alloc = IpAllocator("10.9.0.0/29")
    alloc.allocate("a")
    alloc.allocate("b")
    with pytest.raises(ResourceLimitError, match=r"10\.9\.0\.0/29"):
        alloc.allocate("c")


def test_allocator_reserve_checks_conflicts() -> None:
    """Restoring a lease on a taken or out-of-range index is refused."""
    alloc = IpAllocator("10.9.0.0/28")
    alloc.reserve("a", 2)
    with pytest.raises(ValueError, match="already belongs to a"):
        alloc.reserve("b", 2)
    with pytest.raises(ValueError, match="outside"):
        alloc.reserve("b", 4)
    with pytest.raises(ValueError, match="smaller than one /30"):
        IpAllocator("10.9.0.0/31")


def test_lease_kernel_argument_and_mac() -> None:
    """The guest learns its address, gateway, mask and DNS from ip=, and its MAC encodes its address."""
    lease = HostNetwork(NetworkConfig()).lease_for("vm", "default", 5)
    assert (lease.tap, lease.host_ip, lease.guest_ip, lease.netmask) == (
        "fctap5", "172.31.0.21", "172.31.0.22", "255.255.255.252",
    )  # fmt: skip
    assert lease.guest_mac == "06:00:ac:1f:00:16"
    assert lease.kernel_ip_arg() == "ip=172.31.0.22::172.31.0.21:255.255.255.252:workspace:eth0:off"
    assert lease.kernel_ip_arg(dns=["1.1.1.1", "9.9.9.9", "8.8.8.8"]).endswith(":off:1.1.1.1:9.9.9.9")
    assert Lease.from_json(lease.to_json()) == lease


async def test_default_mode_creates_tap_nat_and_forward_rules_in_the_namespace() -> None:
    """Default mode: TAP with the host address, MASQUERADE and FORWARD rules tagged with the VM's comment."""
    runner = Recorder()
    runner.forwarding = "0"
    net = HostNetwork(NetworkConfig(netns="ns1"), runner=runner)
    lease = await net.setup("vm-a", "default")
    assert all(c[:4] == ("ip", "netns", "exec", "ns1") for c in runner.calls)
    assert runner.commands() == [
        "ip tuntap add dev fctap0 mode tap",
        "ip addr add 172.31.0.1/30 dev fctap0",
        "ip link set dev fctap0 up",
        "sysctl -q -w net.ipv4.ip_forward=1",
        "iptables -w -t nat -A POSTROUTING -s 172.31.0.2/32 ! -o fctap0 -j MASQUERADE -m comment --comment "
        "corral-fc:vm-a",
        "iptables -w -I FORWARD 1 -o fctap0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT -m comment "
        "--comment corral-fc:vm-a",
        "iptables -w -I FORWARD 1 -i fctap0 -j ACCEPT -m comment --comment corral-fc:vm-a",
    ]
    assert len(await net.rules_of("vm-a")) == 3
    runner.calls.clear()
    await net.teardown(lease)
    assert runner.rules == {"filter": ["-P FORWARD ACCEPT"], "nat": []}
    assert runner.links == set()
    assert net.allocator.in_use == 0


async def test_default_mode_uses_the_egress_interface_when_known() -> None:
    """With an egress interface, NAT and forwarding are limited to it."""
    runner = Recorder()
    net = HostNetwork(NetworkConfig(egress_interface="eth9"), runner=runner)
    await net.setup("vm-b", "default")
    assert any("-o eth9 -j MASQUERADE" in c for c in runner.commands())
    assert any("-i fctap0 -o eth9 -j ACCEPT" in c for c in runner.commands())
    assert not any(c[:3] == ("ip", "netns", "exec") for c in runner.calls)


async def test_isolated_mode_has_no_nat_and_drops_everything_but_the_host_end() -> None:
    """Isolated mode adds no NAT rule; forwarding to and from the TAP is dropped, and input to other addresses."""
    runner = Recorder()
    net = HostNetwork(NetworkConfig(), runner=runner)
    await net.setup("vm-c", "isolated")
    assert runner.rules["nat"] == []
    assert sorted(runner.rules["filter"][1:]) == sorted([
        '-A FORWARD -i fctap0 -j DROP -m comment --comment "corral-fc:vm-c"',
        '-A FORWARD -o fctap0 -j DROP -m comment --comment "corral-fc:vm-c"',
        '-A INPUT -i fctap0 ! -d 172.31.0.1 -j DROP -m comment --comment "corral-fc:vm-c"',
    ])  # fmt: skip
    assert not any("sysctl" in c for c in runner.commands())


async def test_teardown_leaves_other_vms_rules_alone() -> None:
    """Tearing one VM down deletes exactly its rules; a VM whose id is a prefix of another's keeps its own."""
    runner = Recorder()
    net = HostNetwork(NetworkConfig(), runner=runner)
    first = await net.setup("vm", "isolated")
    await net.setup("vm2", "isolated")
    await net.teardown(first)
    assert len(runner.rules["filter"]) == 4
    assert all("corral-fc:vm2" in r for r in runner.rules["filter"][1:])
    assert runner.links == {"fctap1"}


async def test_failed_setup_is_rolled_back() -> None:
    """A failing command raises NetworkError naming it, and the TAP, rules and address are released."""
    runner = Recorder()
    runner.fail_on = "MASQUERADE"
    net = HostNetwork(NetworkConfig(), runner=runner)
    with pytest.raises(NetworkError, match=r"MASQUERADE.*simulated failure"):
        await net.setup("vm-d", "default")
    assert runner.links == set()
    assert [r for r in runner.rules["filter"] if "corral-fc" in r] == []
    assert net.allocator.in_use == 0


async def test_cleanup_orphans_removes_unknown_rules_and_taps() -> None:
    """Rules of VMs not kept and TAP devices without a lease are removed; kept ones stay."""
    runner = Recorder()
    net = HostNetwork(NetworkConfig(), runner=runner)
    await net.setup("keep", "isolated")
    await net.setup("gone", "isolated")
    net.allocator.release("gone")  # as after a manager restart that no longer knows "gone"
    removed = await net.cleanup_orphans({"keep"})
    assert len(removed) == 4
    assert "link fctap1" in removed
    assert all("corral-fc:keep" in r for r in runner.rules["filter"][1:])
    assert runner.links == {"fctap0"}


async def test_invalid_vm_id_is_refused() -> None:
    """VM ids that could not be an iptables comment or a file name are refused before any command runs."""
    runner = Recorder()
    with pytest.raises(ValueError, match="invalid VM id"):
        await HostNetwork(NetworkConfig(), runner=runner).setup("bad id; rm", "isolated")
    assert runner.calls == []
