"""How busy the usable cores have been since the last look: non-blocking, one meter per caller.

From ``psutil.cpu_times`` deltas, never ``psutil.cpu_percent``: with an ``interval`` it sleeps,
and without one it keeps module-global state that every other caller in the process disturbs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psutil

from tuner.machine._fingerprint import usable_cores

__all__ = ["CpuLoad", "CpuShares", "busy_and_iowait"]


class CpuShares(NamedTuple):
    """Percent of the usable cores' time since the previous reading."""

    busy_percent: float
    iowait_percent: float
    busy_per_core: tuple[float, ...]


def busy_and_iowait(before: Any, after: Any) -> tuple[float, float] | None:
    """Busy and iowait percent of one CPU between two ``psutil.cpu_times`` (scputimes)."""
    fields = before._fields
    # As psutil does: guest time is already counted in user time.
    counted = [f for f in fields if f not in ("guest", "guest_nice")]
    total = sum(getattr(after, f) - getattr(before, f) for f in counted)
    if total <= 0:
        return None
    idle = after.idle - before.idle
    iowait = (after.iowait - before.iowait) if "iowait" in fields else 0.0
    busy = max(0.0, total - idle - iowait)
    return 100.0 * busy / total, 100.0 * max(0.0, iowait) / total


class CpuLoad:
    """A meter over the usable cores: each :meth:`read` covers the time since the last one."""

    def __init__(self) -> None:
        self.cores = usable_cores()
        """The usable CPUs' indices the shares are over (None: all of them)."""
        self._previous: list[Any] = psutil.cpu_times(percpu=True)

    def read(self) -> CpuShares | None:
        """The shares since the previous reading (or the meter's start); None when no clock
        tick has passed since (the old counters are kept, so the next reading spans both)."""
        times = psutil.cpu_times(percpu=True)
        previous = self._previous
        if len(previous) != len(times):  # CPUs came or went: start over
            self._previous = times
            return None
        indices = self.cores if self.cores is not None else range(len(times))
        busy, iowait = [], []
        for index in indices:
            if index >= len(times):
                continue
            shares = busy_and_iowait(previous[index], times[index])
            if shares is None:
                return None
            busy.append(shares[0])
            iowait.append(shares[1])
        self._previous = times
        if not busy:
            return None
        return CpuShares(sum(busy) / len(busy), sum(iowait) / len(iowait), tuple(busy))
