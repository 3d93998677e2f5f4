"""The memory guard: see a trial running the machine out of memory coming, and stop it first.

Contract: one :class:`MemoryGuard` per study process; :meth:`MemoryGuard.start` at a trial's
start, then :meth:`MemoryGuard.sample` from the supervisor's loop every ``interval_s`` (it is not
thread-safe and does no killing itself: the supervisor owns the trial's process group and kills
it on a :class:`Breach`). Each reading is compared with its limit twice: as it stands, and as it
will stand after the next two samples plus the time a kill takes, from the growth rate over the
last second, so a fast leak is stopped before it crosses the limit rather than after.

Limits:

* ``host``: the trial's process tree counted by PSS (pages shared after fork counted once), and
  the machine's (or container's) own headroom: MemAvailable and the cgroup's usage.
* ``shm``: /dev/shm, where DataLoader workers put batches; a full one is a ``Bus error``.
* ``gpu``: the trial's device memory, through NVML.
* ``swap``: sustained swapping-out while the trial runs.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable

import psutil

from tuner.machine import _gpu, _memory

__all__ = ["Breach", "GuardLimits", "GuardReading", "MemoryGuard", "default_limits"]

_log = logging.getLogger("tuner.guard")

APPROACH_FRACTION = 0.98
"""A reading within 2% of its limit has approached it."""

PSS_EVERY_TICKS = 10
"""Exact PSS (costly: the kernel walks every page) every tenth tick; in between, the last PSS
plus the tree's RSS growth since, which never undercounts new private pages."""

NEAR_FRACTION = 0.85
"""An estimate this close to its limit is replaced by an exact reading before deciding."""

MACHINE_RESERVE_FRACTION = 0.03
"""Whatever the budget, keep this share of the machine's memory available to everyone else."""

SWAP_OUT_LIMIT_BYTES_PER_S = 32 * 2**20
"""Sustained swapping-out above this rate makes a trial slow and the machine unresponsive."""


@dataclasses.dataclass(frozen=True)
class GuardLimits:
    host_bytes: int
    shm_bytes: int | None
    gpu_bytes: int | None
    machine_total_bytes: int
    cgroup_limit_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class GuardReading:
    at: float
    tree_bytes: int | None
    available_bytes: int
    cgroup_usage_bytes: int | None
    shm_bytes: int | None
    gpu_bytes: int | None
    swap_out_rate_bytes_per_s: float | None
    pressure_some_avg10: float | None


@dataclasses.dataclass(frozen=True)
class Breach:
    """Why the guard wants the trial stopped: which limit, at what reading."""

    kind: str  # host, shm, gpu or swap
    reading_bytes: float
    limit_bytes: float
    predicted: bool

    @property
    def reason(self) -> str:
        return f"memory_guard: {self.kind}"

    def to_attrs(self) -> dict[str, float | str | bool]:
        return {
            "guard_reading_bytes": float(self.reading_bytes),
            "guard_limit_bytes": float(self.limit_bytes),
            "guard_predicted": self.predicted,
        }


def _fraction_or_size(text: str | None, total: int | None, default_fraction: float) -> int | None:
    if total is None and text is None:
        return None
    if text is None:
        assert total is not None
        return int(total * default_fraction)
    return _memory.parse_size(text, total)


def default_limits(
    memory_limit: str | None = None,
    shm_limit: str | None = None,
    gpu_memory_limit: str | None = None,
    gpu_total_bytes: int | None = None,
) -> GuardLimits:
    """The limits from the CLI's ``--memory-limit``/``--shm-limit``/``--gpu-memory-limit``.

    Defaults: 90% of the smaller of RAM and the cgroup limit, 90% of /dev/shm, 95% of the GPU.
    Fractions are of the same totals. Raises ValueError (one line) for unparsable sizes.
    """
    total = _memory.total_memory_bytes()
    cgroup = _memory.cgroup_memory()
    cgroup_limit = cgroup.limit_bytes if cgroup is not None else None
    host_total = min(total, cgroup_limit) if cgroup_limit else total
    shm = _memory.shm_usage()
    host = _fraction_or_size(memory_limit, host_total, 0.90)
    assert host is not None
    return GuardLimits(
        host_bytes=host,
        shm_bytes=_fraction_or_size(shm_limit, shm.total_bytes if shm else None, 0.90),
        gpu_bytes=_fraction_or_size(gpu_memory_limit, gpu_total_bytes, 0.95),
        machine_total_bytes=host_total,
        cgroup_limit_bytes=cgroup_limit,
    )


class _Series:
    """The last second of one reading, for its growth rate and its peak."""

    def __init__(self, horizon_s: float = 1.0) -> None:
        self._points: collections.deque[tuple[float, float]] = collections.deque()
        self._horizon_s = horizon_s
        self.peak: float | None = None

    def add(self, at: float, value: float | None) -> None:
        if value is None:
            return
        self._points.append((at, value))
        while self._points and at - self._points[0][0] > self._horizon_s:
            self._points.popleft()
        self.peak = value if self.peak is None else max(self.peak, value)

    def rate_per_s(self) -> float:
        if len(self._points) < 2:
            return 0.0
        (t0, v0), (t1, v1) = self._points[0], self._points[-1]
        return max(0.0, (v1 - v0) / (t1 - t0)) if t1 > t0 else 0.0


class MemoryGuard:
    """Samples the machine and one trial's process tree; says when a limit is about to break."""

    def __init__(
        self,
        limits: GuardLimits,
        gpu: _gpu.GpuReader | None = None,
        gpu_index: int | None = None,
        interval_s: float = 0.2,
        kill_time_s: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.interval_s = interval_s
        self._gpu = gpu if gpu is not None else _gpu.NoGpuReader("not asked for")
        self._gpu_indices = None if gpu_index is None else [gpu_index]
        self._lookahead_s = 2 * interval_s + kill_time_s
        self._clock = clock
        self._ticks = 0
        self.start(None)

    def start(self, pid: int | None) -> None:
        """Begin watching a new trial's process tree rooted at ``pid``."""
        self._pid = pid
        self._ticks = 0
        self._tree = _Series()
        self._shm = _Series()
        self._gpu_series = _Series()
        self._machine_used = _Series()
        self._swap_out: tuple[float, int] | None = None
        self._swap_rates: collections.deque[float] = collections.deque(maxlen=3)
        self._cgroup_usage: int | None = None
        self._pressure: float | None = None
        # (exact PSS, tree RSS, tree pids) at the last exact reading
        self._pss_base: tuple[int, int, frozenset[int]] | None = None

    def peaks(self) -> dict[str, int]:
        """``peak_*_bytes`` user attrs for the trial so far."""
        peaks = {
            "peak_host_memory_bytes": self._tree.peak,
            "peak_shm_bytes": self._shm.peak,
            "peak_gpu_memory_bytes": self._gpu_series.peak,
        }
        return {key: int(value) for key, value in peaks.items() if value is not None}

    def _swap_out_rate(self, at: float) -> float | None:
        total = _memory.swap_out_bytes_total()
        if total is None:
            return None
        previous, self._swap_out = self._swap_out, (at, total)
        if previous is None or at <= previous[0]:
            return None
        return (total - previous[1]) / (at - previous[0])

    def _tree_bytes(self, tree: list[psutil.Process]) -> int | None:
        if not tree:
            return None
        rss = _memory.processes_rss_bytes(tree)
        pids = frozenset(process.pid for process in tree)
        if self._pss_base is not None and self._ticks % PSS_EVERY_TICKS != 1:
            pss, base_rss, base_pids = self._pss_base
            # A new worker's RSS counts every page it shares with its parent: re-read exactly.
            if pids == base_pids:
                estimate = pss + max(0, rss - base_rss)
                projected = estimate + self._tree.rate_per_s() * self._lookahead_s
                if projected < NEAR_FRACTION * self.limits.host_bytes:
                    return estimate
        exact = _memory.processes_memory_bytes(tree)
        self._pss_base = (exact, rss, pids)
        return exact

    def sample(self, tree: list[psutil.Process] | None = None) -> GuardReading:
        """Take one reading (the costlier ones every fifth tick) and remember it.

        ``tree`` is the trial's processes when the caller has just listed them.
        """
        at = self._clock()
        self._ticks += 1
        if tree is None and self._pid is not None:
            tree = _memory.process_tree(self._pid)
        tree_bytes = self._tree_bytes(tree or [])
        available = _memory.available_memory_bytes()
        shm = _memory.shm_usage()
        gpu = (
            _gpu.gpu_memory_used_bytes(self._gpu.read(), self._gpu_indices)
            if self._gpu.available
            else None
        )
        if self._ticks % 5 == 1:
            cgroup = _memory.cgroup_memory()
            self._cgroup_usage = cgroup.usage_bytes if cgroup is not None else None
            pressure = _memory.memory_pressure()
            self._pressure = pressure.some_avg10 if pressure is not None else None
            rate = self._swap_out_rate(at)
            if rate is not None:
                self._swap_rates.append(rate)
        reading = GuardReading(
            at=at,
            tree_bytes=tree_bytes,
            available_bytes=available,
            cgroup_usage_bytes=self._cgroup_usage,
            shm_bytes=shm.used_bytes if shm is not None else None,
            gpu_bytes=gpu,
            swap_out_rate_bytes_per_s=self._swap_rates[-1] if self._swap_rates else None,
            pressure_some_avg10=self._pressure,
        )
        self._tree.add(at, tree_bytes)
        self._shm.add(at, reading.shm_bytes)
        self._gpu_series.add(at, gpu)
        self._machine_used.add(at, self.limits.machine_total_bytes - available)
        return reading

    def _check(
        self, kind: str, value: float | None, series: _Series, limit: float | None
    ) -> Breach | None:
        if value is None or limit is None:
            return None
        if value >= APPROACH_FRACTION * limit:
            return Breach(kind, value, limit, predicted=False)
        projected = value + series.rate_per_s() * self._lookahead_s
        if projected >= limit:
            return Breach(kind, value, limit, predicted=True)
        return None

    def check(self, reading: GuardReading) -> Breach | None:
        """The first limit that is crossed or about to be, or None."""
        limits = self.limits
        breach = self._check("host", reading.tree_bytes, self._tree, limits.host_bytes)
        if breach is None:
            reserve = limits.machine_total_bytes * (1 - MACHINE_RESERVE_FRACTION)
            used = limits.machine_total_bytes - reading.available_bytes
            breach = self._check("host", used, self._machine_used, reserve)
        # The cgroup's usage is recorded, not enforced: it counts reclaimable page cache, and the
        # host budget already defaults to 90% of the cgroup limit.
        if breach is None:
            breach = self._check("shm", reading.shm_bytes, self._shm, limits.shm_bytes)
        if breach is None:
            breach = self._check("gpu", reading.gpu_bytes, self._gpu_series, limits.gpu_bytes)
        swapping = (
            len(self._swap_rates) >= 2
            and min(list(self._swap_rates)[-2:]) > SWAP_OUT_LIMIT_BYTES_PER_S
        )
        if breach is None and swapping:
            breach = Breach(
                "swap", self._swap_rates[-1], SWAP_OUT_LIMIT_BYTES_PER_S, predicted=False
            )
        return breach
