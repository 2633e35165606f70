"""A Docker engine stats answer (``GET /containers/{id}/stats``) read as a :class:`ResourceUsage`.

Memory in use is counted as ``docker stats`` counts it: the cgroup's usage less the inactive page cache
(``total_inactive_file`` under cgroup v1, ``inactive_file`` under v2), which the kernel drops before it runs out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.providers.base import ResourceUsage

__all__ = ["NotRunning", "usage_from_stats"]

# The engine reports "unlimited" as the host's memory or as this (cgroup v1's PAGE_COUNTER_MAX in bytes).
_UNLIMITED = 0x7FFFFFFFFFFFF000


class NotRunning(ValueError):
    """The stats answer of a container that is not running (the engine answers one, empty, instead of an error)."""


def _int(mapping: Mapping[str, Any], key: str) -> int:
    value = mapping.get(key)
    return int(value) if isinstance(value, int | float) else 0


def usage_from_stats(stats: Mapping[str, Any]) -> ResourceUsage:
    """CPU time and memory from one stats answer.

    Raises:
        NotRunning: the answer holds no memory figures, as for a stopped or paused container.
    """
    memory: Mapping[str, Any] = stats.get("memory_stats") or {}
    if "usage" not in memory:
        raise NotRunning("the container is not running: its stats hold no memory figures")
    counters: Mapping[str, Any] = memory.get("stats") or {}
    inactive = _int(counters, "total_inactive_file") if "total_inactive_file" in counters else None
    if inactive is None:
        inactive = _int(counters, "inactive_file")
    cache = _int(counters, "total_cache") if "total_cache" in counters else _int(counters, "file")
    usage = _int(memory, "usage")
    limit = _int(memory, "limit")
    cpu: Mapping[str, Any] = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    return ResourceUsage(
        cpu_ns=_int(cpu, "total_usage"),
        mem_used=max(0, usage - inactive),
        mem_cache=cache,
        mem_limit=0 if limit >= _UNLIMITED else limit,
    )
