"""Warnings before the server's idle timeout strikes: "workspace X stops in 4 minutes unless used".

The server gives every workspace and session its ``expires_at``; the CLI warns, on stderr, about those that expire
within CORRAL_IDLE_WARNING_S seconds (read from the CLI's own environment; default 300, as on the server).
"""

from __future__ import annotations

import math
import os
from datetime import UTC, datetime

from corral.cli._common import stderr_console

__all__ = ["DEFAULT_WARNING_S", "expiry_warning", "warn_if_expiring", "warning_window_s"]

DEFAULT_WARNING_S = 300.0


def warning_window_s() -> float:
    """CORRAL_IDLE_WARNING_S from the environment; the default when unset or not a number of seconds >= 0."""
    try:
        window = float(os.environ.get("CORRAL_IDLE_WARNING_S", DEFAULT_WARNING_S))
    except ValueError:
        return DEFAULT_WARNING_S
    return window if math.isfinite(window) and window >= 0 else DEFAULT_WARNING_S


def expiry_warning(
    kind: str, item_id: str, expires_at: datetime | None, *, ends: str, now: datetime | None = None
) -> str | None:
    """The warning to print for one item, or None when it does not expire within the window.

    Args:
        kind: ``workspace`` or ``session``.
        item_id: Its id.
        expires_at: When its idle timeout strikes (None: never).
        ends: What happens then, as a verb: "stops", "ends".
        now: The current time (tests pass one).
    """
    if expires_at is None:
        return None
    left = (expires_at - (now or datetime.now(UTC))).total_seconds()
    if left > warning_window_s():
        return None
    if left <= 0:
        return f"{kind} {item_id} {ends} at the reaper's next sweep (idle timeout passed) unless used now"
    minutes = math.ceil(left / 60)
    when = f"{minutes} minute{'s' if minutes != 1 else ''}" if left >= 60 else f"{math.ceil(left)} seconds"
    return f"{kind} {item_id} {ends} in {when} unless used (idle timeout)"


def warn_if_expiring(kind: str, item_id: str, expires_at: datetime | None, *, ends: str) -> None:
    """Print :func:`expiry_warning` on stderr when there is one."""
    message = expiry_warning(kind, item_id, expires_at, ends=ends)
    if message is not None:
        stderr_console().print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)
