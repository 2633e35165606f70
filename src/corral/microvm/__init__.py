"""Firecracker microVMs: host readiness, the VM manager service, and everything it drives on the host.

=================  ==================================================================================================
``readiness``      can microVMs run here? (KVM, PVM, CPU flags, binary, kernel, rootfs) with the precise reason
``api_client``     Firecracker's REST API over its Unix socket, typed errors from ``fault_message``
``vm``             one VM: the Firecracker process, its pre-boot configuration, InstanceStart, Ctrl-Alt-Del/kill
``network``        per-VM TAP device and /30, NAT (default) or isolation rules in iptables, orphan clean-up
``disks``          sparse ext4 images, copy-on-write clones of the base rootfs, growing them
``vsock``          the host side of Firecracker's hybrid vsock (``CONNECT``/``OK``), with retries while booting
``rootfs``         the VM root filesystem builder (base image + ``/sbin/corral-init`` + the guest agent)
``guest_init``     PID 1 inside the VM (stdlib only): mounts, network from ``ip=``, the agent on vsock port 1024
``manager``        the registry of VMs: limits, warm pool, persistence, health
``server``         the manager's HTTP API (FastAPI), standalone or in-process
=================  ==================================================================================================

The test double of the firecracker binary and the helpers for testing this package live in :mod:`corral.testing`
(``corral.testing.firecracker``, ``corral.testing.microvm``).
"""

from __future__ import annotations

from corral.microvm.readiness import Check, Readiness, ReadinessConfig, probe

__all__ = ["Check", "Readiness", "ReadinessConfig", "probe"]
