"""Firecracker microVMs: host readiness (and, in later issues, the VM manager, networking and block devices)."""

from __future__ import annotations

from corral.microvm.readiness import Check, Readiness, ReadinessConfig, probe

__all__ = ["Check", "Readiness", "ReadinessConfig", "probe"]
