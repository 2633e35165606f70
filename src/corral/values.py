"""Values every layer shares, at the bottom of the import graph: resource limits and sizes, network modes,
container types and the workspace root. Nothing here imports from the rest of Corral but its errors."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from corral.errors import InvalidRequestError

__all__ = [
    "CPU_FORMAT_HELP",
    "SIZE_FORMAT_HELP",
    "WORKSPACE_ROOT",
    "ContainerType",
    "NetworkMode",
    "ResourceLimits",
    "format_size",
    "parse_cpu",
    "parse_size",
]

WORKSPACE_ROOT = "/workspace"
"""Where the workspace volume is mounted in every sandbox, and where relative paths start."""

NetworkMode = Literal["isolated", "default"]
ContainerType = Literal["agent_workspace", "mcp_server"]


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
SIZE_FORMAT_HELP = 'a size such as "512M", "4G" or "10Gi" (units B, K, M, G, T; powers of 1024)'
CPU_FORMAT_HELP = 'a number of CPUs such as "2", "0.5" or "1500m"'


def parse_size(value: object, *, field_name: str) -> int:
    """Parse ``"4G"``, ``"512Mi"``, ``"1024"`` (bytes) or an int into bytes.

    Raises:
        InvalidRequestError: naming ``field_name`` and the accepted format.
    """
    if isinstance(value, bool):
        raise InvalidRequestError(f"{field_name}: {value!r} is not {SIZE_FORMAT_HELP}", details={"field": field_name})
    if isinstance(value, int):
        number, unit = float(value), ""
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        number, unit = float(m.group(1)), (m.group(2) or "").lower()[:1]
    else:
        raise InvalidRequestError(f"{field_name}: {value!r} is not {SIZE_FORMAT_HELP}", details={"field": field_name})
    size = int(number * _SIZE_UNITS[unit])
    if size <= 0:
        raise InvalidRequestError(
            f"{field_name}: must be greater than zero, got {value!r}", details={"field": field_name}
        )
    return size


def parse_cpu(value: object, *, field_name: str = "cpu") -> float:
    """Parse ``"2"``, ``2``, ``"0.5"`` or ``"1500m"`` (millicores) into a number of CPUs."""
    cpus: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        cpus = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            cpus = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
        except ValueError:
            cpus = None
    if cpus is None or not math.isfinite(cpus):
        raise InvalidRequestError(f"{field_name}: {value!r} is not {CPU_FORMAT_HELP}", details={"field": field_name})
    if cpus <= 0:
        raise InvalidRequestError(
            f"{field_name}: must be greater than zero, got {value!r}", details={"field": field_name}
        )
    return cpus


def format_size(size: int) -> str:
    """The shortest exact spelling of a byte count: ``4294967296 -> "4G"``."""
    if size == 0:
        return "0"
    for unit, factor in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """CPU, memory and disk for one workspace, already validated."""

    cpu: float = 2.0
    memory_bytes: int = 4 * 1024**3
    disk_bytes: int = 10 * 1024**3

    MIN_MEMORY = 64 * 1024**2
    MIN_DISK = 64 * 1024**2
    MAX_CPU = 256.0

    @classmethod
    def parse(cls, raw: Mapping[str, object] | None, *, defaults: ResourceLimits | None = None) -> ResourceLimits:
        """Build limits from API input like ``{"cpu": "2", "memory": "4G", "disk": "10G"}``.

        Missing keys come from ``defaults``. Every problem is collected, so one error names all of them.
        """
        base = defaults or cls()
        raw = raw or {}
        problems: list[str] = []
        unknown = sorted(set(raw) - {"cpu", "memory", "disk"})
        if unknown:
            problems.append(f"unknown resource limit(s) {unknown}; allowed: cpu, memory, disk")
        cpu, memory, disk = base.cpu, base.memory_bytes, base.disk_bytes
        try:
            if raw.get("cpu") is not None:
                cpu = parse_cpu(raw["cpu"], field_name="resource_limits.cpu")
                if cpu > cls.MAX_CPU:
                    problems.append(f"resource_limits.cpu: {raw['cpu']!r} is more than {cls.MAX_CPU:g} CPUs")
        except InvalidRequestError as exc:
            problems.append(exc.message)
        try:
            if raw.get("memory") is not None:
                memory = parse_size(raw["memory"], field_name="resource_limits.memory")
                if memory < cls.MIN_MEMORY:
                    problems.append(f"resource_limits.memory: {raw['memory']!r} is below the minimum of 64M")
        except InvalidRequestError as exc:
            problems.append(exc.message)
        try:
            if raw.get("disk") is not None:
                disk = parse_size(raw["disk"], field_name="resource_limits.disk")
                if disk < cls.MIN_DISK:
                    problems.append(f"resource_limits.disk: {raw['disk']!r} is below the minimum of 64M")
        except InvalidRequestError as exc:
            problems.append(exc.message)
        if problems:
            raise InvalidRequestError("; ".join(problems), details={"problems": problems})
        return cls(cpu=cpu, memory_bytes=memory, disk_bytes=disk)

    def to_json(self) -> dict[str, str]:
        """The API spelling: ``{"cpu": "2", "memory": "4G", "disk": "10G"}``."""
        return {"cpu": f"{self.cpu:g}", "memory": format_size(self.memory_bytes), "disk": format_size(self.disk_bytes)}
