"""The result table (plain text for the terminal, Markdown for ``bench/results/latest.md``) and the machine header."""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.stats import Measure

__all__ = ["Row", "Target", "machine_info", "render", "write_markdown"]

COLUMNS = (
    "metric",
    "Corral p50",
    "Corral p95",
    "plain p50",
    "plain p95",
    "ratio",
    "plain alternative",
    "target",
    "met?",
)


@dataclass(frozen=True, slots=True)
class Target:
    """A goal from the issue and whether this run met it."""

    text: str
    met: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Row:
    """One metric: Corral against the plain alternative measured in the same run."""

    metric: str
    corral: Measure
    plain: Measure | None
    plain_label: str
    target: Target | None = None
    show_ratio: bool = True

    @property
    def ratio(self) -> float | None:
        """Corral p50 / plain p50."""
        if not self.show_ratio or self.plain is None:
            return None
        if not (self.plain.p50 > 0 and self.corral.p50 > 0):  # NaN, or a difference that drowned in noise
            return None
        return self.corral.p50 / self.plain.p50


def format_value(value: float | None, unit: str) -> str:
    """``2.41 ms``, ``16.3 ms``, ``412 ms``, ``12.3 s``, ``38.2 MiB``."""
    if value is None:
        return ""
    if math.isnan(value):
        return "n/a"
    if unit == "ms":
        if value >= 10_000:
            return f"{value / 1000:.1f} s"
        if value >= 100:
            return f"{value:.0f} ms"
        if value >= 10:
            return f"{value:.1f} ms"
        return f"{value:.2f} ms"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    return f"{value:.0f}{(' ' + unit) if unit else ''}"


def _cells(measure: Measure | None) -> tuple[str, str]:
    if measure is None:
        return "", ""
    if measure.text is not None:
        return measure.text, ""
    tail = format_value(measure.tail, measure.unit)
    if tail and measure.tail_q != 95:
        tail += f" (p{measure.tail_q:g})"
    return format_value(measure.p50, measure.unit), tail


def _row_cells(row: Row) -> list[str]:
    ratio = row.ratio
    target, met = "", ""
    if row.target is not None:
        target = row.target.text
        met = ("yes" if row.target.met else "**NO**") + (f" ({row.target.detail})" if row.target.detail else "")
    return [
        row.metric,
        *_cells(row.corral),
        *_cells(row.plain),
        "" if ratio is None else f"{ratio:.2f}x",
        row.plain_label,
        target,
        met,
    ]


def render(rows: list[Row]) -> str:
    """The table as Markdown with padded columns, so it reads the same in a terminal."""
    table = [list(COLUMNS), *(_row_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    numeric = {1, 2, 3, 4, 5}

    def line(cells: list[str]) -> str:
        padded = [
            c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in numeric else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(table[0]), rule, *(line(cells) for cells in table[1:])])


def _command_line(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    text = (proc.stdout or proc.stderr).strip().splitlines()
    return text[0] if text else "unavailable"


def _meminfo_gib(key: str) -> str:
    with open("/proc/meminfo") as meminfo:
        for entry in meminfo:
            if entry.startswith(key + ":"):
                return f"{int(entry.split()[1]) / 1024**2:.1f} GiB"
    return "unknown"


def machine_info(docker_version: str) -> list[tuple[str, str]]:
    """What the numbers were measured on."""
    cpu_model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for entry in cpuinfo:
            if entry.startswith("model name"):
                cpu_model = entry.split(":", 1)[1].strip()
                break
    return [
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("cpu", f"{os.cpu_count()} cores ({cpu_model})"),
        ("memory", f"{_meminfo_gib('MemTotal')} total, {_meminfo_gib('MemAvailable')} available at start"),
        ("kernel", f"{platform.system()} {platform.release()}"),
        (
            "load",
            "load average {:.2f} {:.2f} {:.2f} at start (other work on the machine skews latencies)".format(
                *os.getloadavg()
            ),
        ),
        ("os", _command_line(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"])),
        ("docker", docker_version),
        ("runsc", _command_line(["runsc", "--version"])),
        ("python", sys.version.split()[0]),
        ("corral commit", _command_line(["git", "rev-parse", "--short", "HEAD"])),
    ]


def write_markdown(path: Path, *, title: str, machine: list[tuple[str, str]], table: str, notes: list[str]) -> None:
    """``bench/results/latest.md``: the machine, the table and the notes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"## {title}", "", *(f"- **{k}**: {v}" for k, v in machine), "", table, "", *(f"- {n}" for n in notes)]
    path.write_text("\n".join(lines) + "\n")
