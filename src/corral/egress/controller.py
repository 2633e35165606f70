"""Applying egress rules to running workspaces: the packet filter and, for host names, a proxy per workspace.

A provider whose networked workspaces have their own Linux network namespace (Docker and gVisor: gVisor runs with
``--network=host`` inside Docker's per-container namespace, so its sockets are the host kernel's) calls
:meth:`EgressController.apply` with the pid of a process in that namespace every time the workspace starts, and
:meth:`release` when it goes. The rules live in the kernel, inside the workspace's namespace, where nothing in the
workspace can change them (it holds no CAP_NET_ADMIN); the proxy lives in this process.

Known limit: the namespace exists only from the container's start, so the rules go in a few milliseconds after it.
A fresh workspace runs nothing of the user's in that time (its only process is Corral's spawner), but a workspace
resumed from a memory checkpoint has its processes back from the start: they could send packets in that window.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.egress import netns
from corral.egress.policy import EgressPolicy, Network, render_rules
from corral.egress.proxy import EgressProxy, Resolver

__all__ = ["EgressController", "always_denied", "docker_nameservers", "nameservers_of", "restrict_container"]

log = logging.getLogger(__name__)


@dataclass
class _Applied:
    ns_fd: int
    policy: EgressPolicy
    proxy: EgressProxy | None = None
    rules: list[str] = field(default_factory=list)


class EgressController:
    """Per-workspace packet filters and proxies, applied from the host."""

    def __init__(self, hosts_file: Path | None = None) -> None:
        self.resolver = Resolver(hosts_file)
        self._applied: dict[str, _Applied] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def policy(self, workspace_id: str) -> EgressPolicy | None:
        """The rules in force in the workspace now, or None."""
        applied = self._applied.get(workspace_id)
        return applied.policy if applied else None

    async def apply(
        self,
        workspace_id: str,
        pid: int,
        policy: EgressPolicy,
        nameservers: Sequence[str] = (),
        base_deny: Sequence[Network] = (),
    ) -> None:
        """Put ``policy`` in force in the namespace of process ``pid``, replacing whatever was there; ``base_deny``
        is denied whatever the policy says, unless its ``allow_out`` names the address (see ``render_rules``).

        Raises:
            OSError: The namespace cannot be entered, or the filter was refused. The caller must not let the
                workspace run on as if the rules held.
        """
        async with self._locks.setdefault(workspace_id, asyncio.Lock()):
            await self._release(workspace_id)
            ns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            applied = _Applied(ns_fd, policy)
            try:
                port = None
                if policy.needs_proxy:
                    applied.proxy = EgressProxy(workspace_id, ns_fd, policy, self.resolver, base_deny)
                    port = await applied.proxy.start()
                for version, command in ((4, "iptables-restore"), (6, "ip6tables-restore")):
                    rules = render_rules(
                        policy, version=version, proxy_port=port, nameservers=nameservers, base_deny=base_deny
                    )
                    await netns.apply_rules(ns_fd, command, rules)
                    applied.rules.append(rules)
            except BaseException:
                await _close(applied)
                raise
            self._applied[workspace_id] = applied
            log.info("workspace %s: egress rules in force: %s", workspace_id, policy.to_json())

    async def release(self, workspace_id: str) -> None:
        """Forget the workspace: stop its proxy and let go of its namespace (the rules go with the namespace)."""
        async with self._locks.setdefault(workspace_id, asyncio.Lock()):
            await self._release(workspace_id)
        self._locks.pop(workspace_id, None)

    async def _release(self, workspace_id: str) -> None:
        applied = self._applied.pop(workspace_id, None)
        if applied is not None:
            await _close(applied)

    async def aclose(self) -> None:
        """Stop every proxy."""
        for workspace_id in list(self._applied):
            await self.release(workspace_id)


async def _close(applied: _Applied) -> None:
    if applied.proxy is not None:
        with contextlib.suppress(Exception):
            await applied.proxy.aclose()
    with contextlib.suppress(OSError):
        os.close(applied.ns_fd)


def nameservers_of(resolv_conf: str) -> list[str]:
    """The ``nameserver`` addresses in a resolv.conf text."""
    servers = []
    for line in resolv_conf.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            servers.append(fields[1])
    return servers


def docker_nameservers() -> list[str]:
    """The nameservers of a container on Docker's default bridge: the host's, loopback ones left out, and Google's
    when none is left (dockerd's rule). Read on the host: the container's own resolv.conf is writable from inside, so
    it must not say which servers a filter lets through."""
    try:
        servers = nameservers_of(Path("/etc/resolv.conf").read_text())
    except OSError:
        servers = []
    servers = [s for s in servers if not s.startswith("127.") and s != "::1"]
    return servers or ["8.8.8.8", "8.8.4.4"]


def always_denied(entries: Sequence[str], info: Mapping[str, Any]) -> list[Network]:
    """``CORRAL_EGRESS_ALWAYS_DENY`` entries for one container (``docker inspect`` output), ``bridge`` read as the
    subnets of its networks."""
    denied: list[Network] = []
    for entry in entries:
        if entry != "bridge":
            denied.append(ipaddress.ip_network(entry, strict=False))
            continue
        for network in ((info.get("NetworkSettings") or {}).get("Networks") or {}).values():
            address, length = (network or {}).get("IPAddress"), (network or {}).get("IPPrefixLen")
            if address and length:
                denied.append(ipaddress.ip_interface(f"{address}/{length}").network)
    return denied


async def restrict_container(info: Mapping[str, Any], entries: Sequence[str]) -> None:
    """Put only what is always denied in force in a running container that is no workspace (a template build), for
    the time it runs.

    Raises:
        OSError: The namespace cannot be entered or the filter was refused.
    """
    pid = int((info.get("State") or {}).get("Pid") or 0)
    denied = always_denied(entries, info)
    if not pid or not denied:
        return
    nameservers = await asyncio.to_thread(docker_nameservers)
    ns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for version, command in ((4, "iptables-restore"), (6, "ip6tables-restore")):
            rules = render_rules(
                EgressPolicy(), version=version, proxy_port=None, nameservers=nameservers, base_deny=denied
            )
            await netns.apply_rules(ns_fd, command, rules)
    finally:
        os.close(ns_fd)
