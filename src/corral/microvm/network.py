"""Host networking of microVMs: one TAP device and one /30 of a private subnet per VM, and iptables rules.

Each VM gets index ``i`` in the subnet (default ``172.31.0.0/16``, so 16 384 VMs): the /30 at ``base + 4i`` holds
the host's end (``+1``, on the TAP device ``fctap<i>``) and the guest's address (``+2``), which the guest learns
from the kernel's ``ip=`` argument (:meth:`Lease.kernel_ip_arg`). The guest MAC encodes the guest address.

Network modes (``WorkspaceSpec.network``):

``default``
    outbound access through NAT: ``nat POSTROUTING -s <guest>/32 -o <egress> -j MASQUERADE`` (``! -o <tap>`` when
    no egress interface is known), ``FORWARD -i <tap> -j ACCEPT`` and ``FORWARD -o <tap> -m conntrack --ctstate
    RELATED,ESTABLISHED -j ACCEPT``, inserted at the top of FORWARD so a DROP policy (Docker's) does not stop
    them; ``net.ipv4.ip_forward`` is switched on when it is off.
``isolated``
    no NAT at all, and ``FORWARD -i/-o <tap> -j DROP`` plus ``INPUT -i <tap> ! -d <host end> -j DROP``: the VM
    can reach its host end of the TAP link and nothing else (the agent itself talks over vsock, not the network).

Every rule carries ``-m comment --comment corral-fc:<vm id>``, which is how :meth:`HostNetwork.teardown` finds
and deletes exactly a VM's rules, and how :meth:`HostNetwork.cleanup_orphans` finds rules and TAP devices left by
a crashed manager. All commands (``ip``, ``iptables -w``, ``sysctl``) run through one runner; with
``NetworkConfig.netns`` set they run inside that network namespace (``ip netns exec``), which is how the tests
exercise all of this without touching the host's own network.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from corral.errors import CorralError, ResourceLimitError
from corral.values import NetworkMode

__all__ = [
    "DEFAULT_SUBNET",
    "RULE_TAG",
    "CommandResult",
    "HostNetwork",
    "IpAllocator",
    "Lease",
    "NetworkConfig",
    "NetworkError",
    "run_command",
]

DEFAULT_SUBNET = "172.31.0.0/16"
RULE_TAG = "corral-fc"
_VM_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class NetworkError(CorralError):
    """A host networking command failed; the message holds the command and what it printed."""

    code = "network_setup_failed"
    http_status = 500


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command did."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], Awaitable[CommandResult]]


async def run_command(argv: Sequence[str]) -> CommandResult:
    """Run a command without a shell and capture its output."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
    )
    out, err = await proc.communicate()
    return CommandResult(tuple(argv), proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """Where VM addresses come from and how they reach out."""

    subnet: str = DEFAULT_SUBNET
    """The private range VM /30s are carved from (CORRAL_FIRECRACKER_SUBNET)."""
    tap_prefix: str = "fctap"
    egress_interface: str | None = None
    """The host interface NAT goes out of; None: the interface of the default route, or any but the TAP."""
    netns: str | None = None
    """Run every command inside this network namespace (tests); None: the manager's own namespace."""
    dns: tuple[str, ...] = ()
    """Name servers handed to guests through ``ip=`` (default-mode VMs need one to resolve names)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """One VM's network: its TAP device and addresses."""

    vm_id: str
    index: int
    tap: str
    host_ip: str
    guest_ip: str
    guest_mac: str
    mode: NetworkMode
    prefixlen: int = 30

    @property
    def netmask(self) -> str:
        """``255.255.255.252`` for a /30."""
        return str(ipaddress.IPv4Network(f"0.0.0.0/{self.prefixlen}").netmask)

    def kernel_ip_arg(self, *, hostname: str = "workspace", dns: Sequence[str] = ()) -> str:
        """The guest kernel's ``ip=`` argument: static address, the host end as gateway, no autoconfiguration."""
        value = f"{self.guest_ip}::{self.host_ip}:{self.netmask}:{hostname}:eth0:off"
        if dns:
            value += ":" + ":".join(dns[:2])
        return f"ip={value}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (persisted with the VM's metadata)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lease:
        """The inverse of :meth:`to_json`."""
        return cls(**data)


class IpAllocator:
    """Hands out /30 indexes of the subnet, lowest free first."""

    def __init__(self, subnet: str = DEFAULT_SUBNET) -> None:
        self.network = ipaddress.IPv4Network(subnet)
        if self.network.prefixlen > 30:
            raise ValueError(f"subnet {subnet} is smaller than one /30")
        self.capacity = self.network.num_addresses // 4
        self._by_vm: dict[str, int] = {}
        self._used: set[int] = set()

    def allocate(self, vm_id: str) -> int:
        """A free index for ``vm_id`` (the same one again if it already holds one)."""
        if vm_id in self._by_vm:
            return self._by_vm[vm_id]
        for index in range(self.capacity):
            if index not in self._used:
                self.reserve(vm_id, index)
                return index
        raise ResourceLimitError(
            f"firecracker: no free address left in {self.network} ({self.capacity} VMs of a /30 each)",
            details={"subnet": str(self.network), "capacity": self.capacity},
        )

    def reserve(self, vm_id: str, index: int) -> None:
        """Mark ``index`` as ``vm_id``'s (restoring a persisted lease)."""
        if not 0 <= index < self.capacity:
            raise ValueError(f"index {index} is outside {self.network}")
        owner = next((v for v, i in self._by_vm.items() if i == index), None)
        if owner is not None and owner != vm_id:
            raise ValueError(f"index {index} already belongs to {owner}")
        self._by_vm[vm_id] = index
        self._used.add(index)

    def release(self, vm_id: str) -> None:
        """Free ``vm_id``'s index (no-op when it holds none)."""
        index = self._by_vm.pop(vm_id, None)
        if index is not None:
            self._used.discard(index)

    def addresses(self, index: int) -> tuple[str, str]:
        """(host end, guest address) of the /30 at ``index``."""
        base = int(self.network.network_address) + 4 * index
        return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))

    def indexes(self) -> set[int]:
        """The indexes held."""
        return set(self._used)

    @property
    def in_use(self) -> int:
        """How many indexes are held."""
        return len(self._used)


def _mac_for(guest_ip: str) -> str:
    octets = ipaddress.IPv4Address(guest_ip).packed
    return "06:00:" + ":".join(f"{b:02x}" for b in octets)


class HostNetwork:
    """Creates and removes VMs' TAP devices and iptables rules."""

    def __init__(self, config: NetworkConfig | None = None, *, runner: Runner = run_command) -> None:
        self.config = config or NetworkConfig()
        self.allocator = IpAllocator(self.config.subnet)
        self._runner = runner
        self._egress: str | None = self.config.egress_interface
        self._egress_known = self.config.egress_interface is not None
        self._forwarding_lock = asyncio.Lock()

    # --- commands ---------------------------------------------------------------------------------------------

    async def run(self, *argv: str, check: bool = True) -> CommandResult:
        """Run one command (inside the configured namespace); raise NetworkError when it fails and ``check``."""
        full = ("ip", "netns", "exec", self.config.netns, *argv) if self.config.netns else argv
        result = await self._runner(full)
        if check and result.returncode != 0:
            raise NetworkError(
                f"`{shlex.join(argv)}` failed with status {result.returncode}: {result.stderr.strip()}",
                details={"argv": list(argv), "netns": self.config.netns},
            )
        return result

    def tap_name(self, index: int) -> str:
        """``fctap<index>`` (at most 15 characters, the kernel's limit)."""
        name = f"{self.config.tap_prefix}{index}"
        if len(name) > 15:
            raise ValueError(f"TAP device name {name!r} is longer than 15 characters")
        return name

    @staticmethod
    def comment(vm_id: str) -> str:
        """The iptables comment that tags every rule of ``vm_id``."""
        return f"{RULE_TAG}:{vm_id}"

    # --- lifecycle --------------------------------------------------------------------------------------------

    def lease_for(self, vm_id: str, mode: NetworkMode, index: int) -> Lease:
        """The lease at ``index`` (addresses, TAP name and MAC follow from it)."""
        host_ip, guest_ip = self.allocator.addresses(index)
        return Lease(vm_id, index, self.tap_name(index), host_ip, guest_ip, _mac_for(guest_ip), mode)

    async def setup(self, vm_id: str, mode: NetworkMode, *, index: int | None = None) -> Lease:
        """Allocate (or re-take ``index``), create the TAP device with the host address, and add the mode's rules.

        On any failure everything done so far is undone and the index released.
        """
        if not _VM_ID_RE.match(vm_id):
            raise ValueError(f"invalid VM id {vm_id!r}")
        if index is None:
            index = self.allocator.allocate(vm_id)
        else:
            self.allocator.reserve(vm_id, index)
        lease = self.lease_for(vm_id, mode, index)
        try:
            await self._create_tap(lease)
            await self._add_rules(lease)
        except BaseException:
            await asyncio.shield(self._remove(lease.vm_id, lease.tap))
            self.allocator.release(vm_id)
            raise
        return lease

    async def restore(self, lease: Lease) -> None:
        """Re-take a persisted lease and make sure its TAP device and rules exist (after a manager restart)."""
        self.allocator.reserve(lease.vm_id, lease.index)
        if not await self.tap_exists(lease.tap):
            await self._create_tap(lease)
        if not await self.rules_of(lease.vm_id):
            await self._add_rules(lease)

    async def teardown(self, lease: Lease) -> None:
        """Delete the VM's rules and TAP device and free its address. Idempotent."""
        await self._remove(lease.vm_id, lease.tap)
        self.allocator.release(lease.vm_id)

    async def _create_tap(self, lease: Lease) -> None:
        await self.run("ip", "tuntap", "add", "dev", lease.tap, "mode", "tap")
        await self.run("ip", "addr", "add", f"{lease.host_ip}/{lease.prefixlen}", "dev", lease.tap)
        await self.run("ip", "link", "set", "dev", lease.tap, "up")

    async def _add_rules(self, lease: Lease) -> None:
        tag = ("-m", "comment", "--comment", self.comment(lease.vm_id))
        if lease.mode == "default":
            await self._ensure_forwarding()
            egress = await self.egress_interface()
            out = ("-o", egress) if egress else ("!", "-o", lease.tap)
            await self.run("iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-s", f"{lease.guest_ip}/32", *out,
                           "-j", "MASQUERADE", *tag)  # fmt: skip
            await self.run("iptables", "-w", "-I", "FORWARD", "1", "-o", lease.tap, "-m", "conntrack",
                           "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT", *tag)  # fmt: skip
            await self.run("iptables", "-w", "-I", "FORWARD", "1", "-i", lease.tap,
                           *(("-o", egress) if egress else ()), "-j", "ACCEPT", *tag)  # fmt: skip
        else:
            await self.run("iptables", "-w", "-I", "FORWARD", "1", "-i", lease.tap, "-j", "DROP", *tag)
            await self.run("iptables", "-w", "-I", "FORWARD", "1", "-o", lease.tap, "-j", "DROP", *tag)
            await self.run("iptables", "-w", "-I", "INPUT", "1", "-i", lease.tap, "!", "-d", lease.host_ip,
                           "-j", "DROP", *tag)  # fmt: skip

    async def _remove(self, vm_id: str, tap: str) -> None:
        for table, rule in await self.rules_of(vm_id):
            argv = shlex.split(rule)
            await self.run("iptables", "-w", "-t", table, "-D", *argv[1:], check=False)
        if await self.tap_exists(tap):
            await self.run("ip", "link", "del", "dev", tap)

    # --- inspection -------------------------------------------------------------------------------------------

    async def rules(self) -> list[tuple[str, str]]:
        """Every Corral-tagged rule, as (table, ``-A ...`` line of ``iptables -S``)."""
        found: list[tuple[str, str]] = []
        for table in ("filter", "nat"):
            listing = await self.run("iptables", "-w", "-t", table, "-S")
            for line in listing.stdout.splitlines():
                comment = _comment_of(line) if "--comment" in line else None
                if comment is not None and comment.startswith(f"{RULE_TAG}:"):
                    found.append((table, line))
        return found

    async def rules_of(self, vm_id: str) -> list[tuple[str, str]]:
        """The rules tagged with ``vm_id``'s comment."""
        tag = self.comment(vm_id)
        return [(t, r) for t, r in await self.rules() if _comment_of(r) == tag]

    async def tap_exists(self, tap: str) -> bool:
        """True when a link of that name exists."""
        return (await self.run("ip", "link", "show", "dev", tap, check=False)).returncode == 0

    async def taps(self) -> list[str]:
        """Names of the links that carry this manager's TAP prefix."""
        listing = await self.run("ip", "-o", "link", "show")
        names = [line.split(":", 2)[1].strip().split("@")[0] for line in listing.stdout.splitlines() if ":" in line]
        pattern = re.compile(rf"^{re.escape(self.config.tap_prefix)}\d+$")
        return sorted(n for n in names if pattern.match(n))

    async def cleanup_orphans(self, keep: set[str]) -> list[str]:
        """Remove tagged rules of VMs not in ``keep`` and TAP devices no lease holds; return what went."""
        removed: list[str] = []
        for table, rule in await self.rules():
            comment = _comment_of(rule)
            vm_id = comment.split(":", 1)[1] if comment else ""
            if vm_id not in keep:
                await self.run("iptables", "-w", "-t", table, "-D", *shlex.split(rule)[1:], check=False)
                removed.append(f"{table}: {rule}")
        held = {self.tap_name(i) for i in self.allocator.indexes()}
        for tap in await self.taps():
            if tap not in held:
                await self.run("ip", "link", "del", "dev", tap, check=False)
                removed.append(f"link {tap}")
        return removed

    async def egress_interface(self) -> str | None:
        """The configured egress interface, else the default route's, else None."""
        if not self._egress_known:
            listing = await self.run("ip", "-o", "-4", "route", "show", "default", check=False)
            match = re.search(r"\bdev (\S+)", listing.stdout)
            self._egress = match.group(1) if match else None
            self._egress_known = True
        return self._egress

    async def ip_forwarding(self) -> bool:
        """Whether ``net.ipv4.ip_forward`` is on (in the configured namespace)."""
        result = await self.run("sysctl", "-n", "net.ipv4.ip_forward", check=False)
        return result.stdout.strip() == "1"

    async def _ensure_forwarding(self) -> None:
        async with self._forwarding_lock:
            if not await self.ip_forwarding():
                await self.run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1")

    async def status(self) -> dict[str, Any]:
        """For the manager's health: subnet use, forwarding, egress and any problem running the tools."""
        info: dict[str, Any] = {
            "subnet": str(self.allocator.network),
            "capacity": self.allocator.capacity,
            "leases": self.allocator.in_use,
            "netns": self.config.netns,
        }
        try:
            info["ip_forward"] = await self.ip_forwarding()
            info["egress_interface"] = await self.egress_interface()
        except (NetworkError, OSError) as exc:
            info["error"] = str(exc)
        return info


def _comment_of(rule: str) -> str | None:
    words = shlex.split(rule)
    for i, word in enumerate(words[:-1]):
        if word == "--comment":
            return words[i + 1]
    return None
