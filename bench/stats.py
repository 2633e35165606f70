"""Samples and their summaries: medians and tail percentiles, timed with a monotonic clock."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Measure", "Samples", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Samples:
    """Timings (or sizes) of one metric, in the order they were taken."""

    unit: str = "ms"
    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        """Record one sample."""
        self.values.append(value)

    @contextmanager
    def time(self) -> Iterator[None]:
        """Record the wall time of the ``with`` body in milliseconds (only when it finishes without an error)."""
        started = time.perf_counter()
        yield
        self.values.append((time.perf_counter() - started) * 1000)

    def measure(self, tail: float = 95) -> Measure:
        """Median and the ``tail`` percentile of what was recorded."""
        return Measure(
            p50=percentile(self.values, 50),
            tail=percentile(self.values, tail),
            tail_q=tail,
            unit=self.unit,
            n=len(self.values),
        )


@dataclass(frozen=True, slots=True)
class Measure:
    """What the table shows for one side of one metric."""

    p50: float
    tail: float | None
    unit: str
    n: int
    tail_q: float = 95
    text: str | None = None
    """Shown instead of the numbers (e.g. ``"48/50"`` for a success rate)."""

    @classmethod
    def single(cls, value: float, unit: str, *, text: str | None = None) -> Measure:
        """One value that has no spread (a derived figure such as a count)."""
        return cls(p50=value, tail=None, unit=unit, n=1, text=text)
