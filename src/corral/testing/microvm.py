"""Helpers for testing the microVM stack on hosts that cannot boot a VM: throwaway network namespaces, host
network checks, the Firecracker API double (:mod:`corral.testing.firecracker`) as the VMM command, and a manager
wired to all three.

Networking tests run everything inside a namespace they create (``corral-test-<hex>``) so the host's links and
iptables rules are never touched; :func:`corral_network_objects` lists what Corral could have left in the host
namespace (TAP devices with the manager's prefix, rules tagged ``corral-fc:``), which tests assert is empty.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.microvm.manager import FirecrackerManager, ManagerConfig
from corral.microvm.network import RULE_TAG, NetworkConfig
from corral.microvm.readiness import Check, Readiness, ReadinessConfig

__all__ = [
    "FAKE_VMM",
    "Netns",
    "corral_network_objects",
    "fake_vmm_manager",
    "usable_probe",
]

FAKE_VMM = (sys.executable, "-m", "corral.testing.firecracker")
"""The VMM command that runs the Firecracker API double instead of the real binary."""


def usable_probe(config: ReadinessConfig) -> Readiness:
    """A readiness probe that lets the manager create VMs (the VMM is the double, so no KVM is needed)."""
    del config
    return Readiness(
        usable=True,
        reason="test: the Firecracker API double stands in for the VMM, so KVM is not needed",
        checks=(Check("vmm", ok=True, detail="corral.testing.firecracker"),),
    )


@dataclass
class Netns:
    """A network namespace made for one test; :meth:`delete` removes it and everything in it."""

    name: str

    @classmethod
    def create(cls, prefix: str = "corral-test-") -> Netns:
        """``ip netns add corral-test-<hex>`` with ``lo`` up."""
        ns = cls(f"{prefix}{uuid.uuid4().hex[:8]}")
        subprocess.run(["ip", "netns", "add", ns.name], check=True, capture_output=True)
        ns.run("ip", "link", "set", "lo", "up")
        return ns

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace."""
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], check=check, capture_output=True, text=True)

    def links(self) -> list[str]:
        """Link names in the namespace."""
        out = self.run("ip", "-o", "link", "show").stdout
        return [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]

    def iptables(self, table: str = "filter") -> list[str]:
        """``iptables -S`` lines of a table."""
        return self.run("iptables", "-w", "-t", table, "-S").stdout.splitlines()

    def delete(self) -> None:
        """``ip netns del`` (its TAP devices and rules go with it)."""
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)

    def exists(self) -> bool:
        """Whether the namespace is still listed."""
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        return any(line.split()[0] == self.name for line in listing.splitlines() if line.strip())


def corral_network_objects(tap_prefix: str = "fctap") -> list[str]:
    """Corral's networking objects in the *host* namespace: TAP devices and tagged iptables rules."""
    found: list[str] = []
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    for line in links.splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(tap_prefix):
            found.append(f"link {name}")
    for table in ("filter", "nat"):
        rules = subprocess.run(["iptables", "-w", "-t", table, "-S"], capture_output=True, text=True, check=True)
        found.extend(f"{table}: {rule}" for rule in rules.stdout.splitlines() if f"{RULE_TAG}:" in rule)
    return found


def fake_vmm_manager(
    state_dir: Path,
    *,
    netns: str,
    rootfs: str,
    kernel: str,
    max_vms: int = 32,
    warm_pool_size: int = 0,
    warm_disk_bytes: int = 10 * 1024**3,
    dns: Sequence[str] = (),
) -> FirecrackerManager:
    """A manager whose VMs are the API double, networked inside ``netns``, booting ``rootfs``."""
    config = ManagerConfig(
        state_dir=state_dir,
        readiness=ReadinessConfig(kernel_path=kernel, rootfs_path=rootfs),
        firecracker_cmd=FAKE_VMM,
        network=NetworkConfig(netns=netns, dns=tuple(dns)),
        max_vms=max_vms,
        warm_pool_size=warm_pool_size,
        warm_disk_bytes=warm_disk_bytes,
    )
    return FirecrackerManager(config, probe=usable_probe)
