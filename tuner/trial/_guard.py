"""The memory guard: see a trial running the machine out of memory coming, and stop it first.

Contract: one :class:`MemoryGuard` per study process; :meth:`MemoryGuard.start` at a trial's
start, then :meth:`MemoryGuard.sample` from the supervisor's loop every
:meth:`MemoryGuard.next_interval_s` (it is not thread-safe and does no killing itself: the
supervisor owns the trial's process group and kills it on a :class:`Breach`),
:meth:`MemoryGuard.stop` at its end.

A reading within 2% of its limit (:data:`APPROACH_FRACTION`) is a breach with ``predicted``
False: the setting did not fit, and only such breaches build the study's memory walls. Before
that, a breach is predicted from growth, projected over the next two samples plus the time a
kill takes, but only on evidence that the growth lasts: an exact reading within 10% of the limit
(:data:`CONFIRM_FRACTION`), or growth at every exact reading for :data:`SUSTAINED_S` within one
unchanged process tree. Growth towards the peak the trial is expected to reach
(``expected_bytes`` at :meth:`MemoryGuard.start`), where that peak fits, is not projected: the
start-up ramp (workers forking, their first batches) stops by itself.

``host`` is the trial's process tree by PSS (pages shared after fork counted once), exact but
milliseconds per process, so it is read only when it can matter: when the tree changes, when
its RSS has moved by :data:`RSS_MOVE_FRACTION` of the limit, when the estimate in between nears
the limit, and at the latest every :data:`EXACT_EVERY_S`. Decisions on the tree use exact
readings only. docs/design.md describes the guard in full.

Limits:

* ``host``: the trial's process tree, and the machine's (or container's) headroom.
* ``shm``: /dev/shm, where DataLoader workers put batches; a full one is a ``Bus error``.
* ``gpu``: the trial's device memory, through NVML: every rank's device, the fullest of them
  against the limit (a breach on any).
* ``swap``: sustained swapping-out while the trial runs.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence

import psutil

from tuner.machine import (
    GpuReader,
    HostMemoryFiles,
    NoGpuReader,
    ProcessTree,
    cgroup_memory,
    gpu_memory_used_bytes,
    parse_size,
    shm_usage,
    total_memory_bytes,
)
from tuner.search import OVER_LIMIT_FRACTION

__all__ = ["Breach", "GuardLimits", "GuardReading", "MemoryGuard", "default_limits"]

_log = logging.getLogger("tuner.guard")

APPROACH_FRACTION = 0.98
"""A reading within 2% of its limit has approached it: a breach, not a prediction."""

CONFIRM_FRACTION = 0.90
"""An exact reading this close to its limit confirms a projected crossing."""

SUSTAINED_S = 0.6
"""Growth at every exact reading for this long, within one tree, is growth that lasts."""

SUSTAINED_READINGS = 4
"""...and over at least this many readings (three intervals)."""

NEAR_FRACTION = 0.85
"""An estimate this close to its limit is replaced by an exact reading."""

RSS_MOVE_FRACTION = 0.02
"""The tree's RSS moving by this share of the limit since the last exact reading calls for one."""

FAST_INTERVAL_S = 0.05
"""The interval while the tree is near its limit and its RSS moves."""

FAST_MOVE_FRACTION = 0.005
"""RSS moving by this share of the limit between two ticks is moving."""

EXACT_EVERY_S = 5.0
"""An exact reading at the latest this long after the last one, for the recorded peak."""

EXACT_EVERY_NEAR_S = 1.0
"""...or this long where the tree's RSS is near the limit (PSS may have grown unseen)."""

EXACT_CPU_SHARE = 0.1
"""...but no more often than keeps those timed readings to this share of a core: an exact reading
costs about 1.5 ms per process, so for a tree of hundreds of workers a reading every second
would take a third of a core from the trial measured. A changed tree, moved RSS or an estimate
near the limit still call for one at once."""

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
    tree_exact: bool = False
    """``tree_bytes`` is an exact PSS reading, not the estimate between two."""


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
    return parse_size(text, total)


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
    total = total_memory_bytes()
    cgroup = cgroup_memory()
    cgroup_limit = cgroup.limit_bytes if cgroup is not None else None
    host_total = min(total, cgroup_limit) if cgroup_limit else total
    shm = shm_usage()
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
    """The last second of one reading: its growth rate, whether the growth lasts, its peak."""

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

    def restart(self) -> None:
        """Forget the growth so far (the tree changed); the peak stays."""
        self._points.clear()

    def rate_per_s(self) -> float:
        if len(self._points) < 2:
            return 0.0
        (t0, v0), (t1, v1) = self._points[0], self._points[-1]
        return max(0.0, (v1 - v0) / (t1 - t0)) if t1 > t0 else 0.0

    def sustained_rate_per_s(self) -> float | None:
        """The speed growth has kept, if it rose at every reading for :data:`SUSTAINED_S`.

        None when the last readings do not all rise, or span too little time: a single jump
        is not extrapolated. The speed is the slowest of the last three intervals, so a ramp
        that is slowing down (its first burst behind it) projects at its new pace, while a
        leak, steady, projects at its own.
        """
        points = list(self._points)
        run = 1
        while run < len(points) and points[-run][1] > points[-run - 1][1]:
            run += 1
        rising = points[-run:]
        if len(rising) < SUSTAINED_READINGS or rising[-1][0] - rising[0][0] < SUSTAINED_S:
            return None
        return min(_speeds(rising[-SUSTAINED_READINGS:]))

    def growth_within(self, horizon_s: float, speed_per_s: float) -> float:
        """How much the reading will grow over ``horizon_s``: ``speed_per_s`` kept, unless the
        growth is settling.

        Settling: each of the last three intervals rose more slowly than the one before, as a
        first large batch does once it is nearly built. Its increments are taken to go on
        shrinking by the larger of their two latest ratios r, so it grows by at most its last
        increment d times r + r**2 + ... over the horizon's intervals, below its asymptote
        d * r / (1 - r). A leak, steady or speeding up, keeps its speed.
        """
        recent = list(self._points)[-SUSTAINED_READINGS:]
        speeds = _speeds(recent)
        linear = speed_per_s * horizon_s
        if len(speeds) < SUSTAINED_READINGS - 1 or not all(
            0 < later < earlier for earlier, later in itertools.pairwise(speeds)
        ):
            return linear
        ratio = max(later / earlier for earlier, later in itertools.pairwise(speeds))
        interval_s = recent[-1][0] - recent[-2][0]
        increment = speeds[-1] * interval_s
        steps = horizon_s / interval_s
        return min(linear, increment * ratio * (1 - ratio**steps) / (1 - ratio))


def _speeds(points: list[tuple[float, float]]) -> list[float]:
    """The growth per second of each interval between successive ``(at, value)`` points."""
    return [(v1 - v0) / (t1 - t0) for (t0, v0), (t1, v1) in itertools.pairwise(points) if t1 > t0]


class MemoryGuard:
    """Samples the machine and one trial's process tree; says when a limit is about to break.

    ``gpu_indices`` are the NVML indices of the trial's devices (each rank's; None: every
    device the reader has); the fullest is read against the GPU limit.
    """

    def __init__(
        self,
        limits: GuardLimits,
        gpu: GpuReader | None = None,
        gpu_indices: Sequence[int] | None = None,
        interval_s: float = 0.2,
        kill_time_s: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.interval_s = interval_s
        self._gpu = gpu if gpu is not None else NoGpuReader("not asked for")
        self._gpu_indices = None if gpu_indices is None else list(gpu_indices)
        self._kill_time_s = kill_time_s
        self._clock = clock
        self._rss_move_bytes = RSS_MOVE_FRACTION * limits.host_bytes
        cgroup = cgroup_memory()
        self._host = HostMemoryFiles(cgroup.usage_file if cgroup is not None else None)
        self._process_tree: ProcessTree | None = None
        self.start(None)

    def start(self, pid: int | None, expected_bytes: int | None = None) -> None:
        """Begin watching a new trial's process tree rooted at ``pid``, whose peak is expected
        at ``expected_bytes`` (None: unknown): growth below it that fits the limit is not
        projected."""
        self.stop()
        self._pid = pid
        self._expected_bytes = expected_bytes
        self._process_tree = ProcessTree(pid) if pid is not None else None
        self._ticks = 0
        self._tree = _Series()  # every reading, estimates included: the peak
        self._exact = _Series()  # exact readings since the tree last changed: the decisions
        self._shm = _Series()
        self._gpu_series = _Series()
        self._machine_used = _Series()
        self._swap_out: tuple[float, int] | None = None
        self._swap_rates: collections.deque[float] = collections.deque(maxlen=3)
        self._cgroup_usage: int | None = None
        self._pressure: float | None = None
        # (exact PSS, tree RSS, tree pids, when) at the last exact reading
        self._pss_base: tuple[int, int, frozenset[int], float] | None = None
        self._exact_cost_s = 0.0  # how long the last exact reading took
        self._last_rss: int | None = None
        self._next_interval_s = self.interval_s

    def stop(self) -> None:
        """Stop watching the trial: its processes' files are closed; the peaks stay readable."""
        if self._process_tree is not None:
            self._process_tree.close()
            self._process_tree = None

    def close(self) -> None:
        """Close every file the guard keeps open; it cannot sample afterwards."""
        self.stop()
        self._host.close()

    def __enter__(self) -> MemoryGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_interval_s(self) -> float:
        """How long until the next :meth:`sample`: short while the tree nears its limit."""
        return self._next_interval_s

    def _lookahead_s(self) -> float:
        """How far growth is projected: two more readings and a kill."""
        return 2 * self._next_interval_s + self._kill_time_s

    def _pace(self, tree_bytes: int | None, rss: int | None) -> None:
        """Set the next interval from this tick's tree reading and RSS."""
        previous, self._last_rss = self._last_rss, rss
        limit = self.limits.host_bytes
        moving = (
            rss is not None
            and previous is not None
            and abs(rss - previous) >= FAST_MOVE_FRACTION * limit
        )
        near = tree_bytes is not None and tree_bytes >= NEAR_FRACTION * limit
        fast = near and moving
        self._next_interval_s = min(self.interval_s, FAST_INTERVAL_S) if fast else self.interval_s

    def tree(self) -> list[psutil.Process]:
        """The trial's processes now (root first), listed cheaply; empty when none is watched."""
        return self._process_tree.members() if self._process_tree is not None else []

    def peaks(self) -> dict[str, int]:
        """``peak_*_bytes`` user attrs for the trial so far."""
        peaks = {
            "peak_host_memory_bytes": self._tree.peak,
            "peak_shm_bytes": self._shm.peak,
            "peak_gpu_memory_bytes": self._gpu_series.peak,
        }
        return {key: int(value) for key, value in peaks.items() if value is not None}

    def _swap_out_rate(self, at: float) -> float | None:
        total = self._host.swap_out_bytes_total()
        if total is None:
            return None
        previous, self._swap_out = self._swap_out, (at, total)
        if previous is None or at <= previous[0]:
            return None
        return (total - previous[1]) / (at - previous[0])

    def _exact_due(self, rss: int, pids: frozenset[int], at: float) -> bool:
        if self._pss_base is None:
            return True
        pss, base_rss, base_pids, base_at = self._pss_base
        # A new worker's RSS counts every page it shares with its parent, and a sharer that
        # exits leaves its share to the others: a changed tree is read again exactly.
        if pids != base_pids or abs(rss - base_rss) >= self._rss_move_bytes:
            return True
        near = NEAR_FRACTION * self.limits.host_bytes
        if pss + max(0, rss - base_rss) >= near:
            return True
        every = EXACT_EVERY_NEAR_S if rss >= near else EXACT_EVERY_S
        return at - base_at >= max(every, self._exact_cost_s / EXACT_CPU_SHARE)

    def _tree_bytes(
        self, tree: list[psutil.Process], at: float
    ) -> tuple[int | None, bool, int | None]:
        """The tree's memory, whether it was read exactly (else the estimate), and its RSS."""
        if not tree or self._process_tree is None:
            return None, False, None
        rss = self._process_tree.rss_bytes(tree)
        pids = frozenset(process.pid for process in tree)
        if not self._exact_due(rss, pids, at):
            assert self._pss_base is not None
            pss, base_rss, _, _ = self._pss_base
            return pss + max(0, rss - base_rss), False, rss
        started = time.perf_counter()
        exact = self._process_tree.pss_bytes(tree)
        self._exact_cost_s = time.perf_counter() - started
        if self._pss_base is None or pids != self._pss_base[2]:
            self._exact.restart()  # growth across a tree change is workers starting: a ramp
        self._pss_base = (exact, rss, pids, at)
        self._exact.add(at, exact)
        return exact, True, rss

    def sample(self, tree: list[psutil.Process] | None = None) -> GuardReading:
        """Take one reading (swap, PSI and the cgroup every fifth tick) and remember it.

        ``tree`` is the trial's processes when the caller has just listed them (:meth:`tree`).
        """
        at = self._clock()
        self._ticks += 1
        if tree is None:
            tree = self.tree()
        tree_bytes, exact, rss = self._tree_bytes(tree, at)
        self._pace(tree_bytes, rss)
        available = self._host.available_bytes()
        shm = shm_usage()
        gpu = (
            gpu_memory_used_bytes(self._gpu.read(), self._gpu_indices)
            if self._gpu.available
            else None
        )
        if self._ticks % 5 == 1:
            self._cgroup_usage = self._host.cgroup_usage_bytes()
            pressure = self._host.pressure()
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
            tree_exact=exact,
        )
        self._tree.add(at, tree_bytes)
        self._shm.add(at, reading.shm_bytes)
        self._gpu_series.add(at, gpu)
        self._machine_used.add(at, self.limits.machine_total_bytes - available)
        return reading

    def _check(
        self,
        kind: str,
        value: float | None,
        series: _Series,
        limit: float | None,
        expected: float | None = None,
    ) -> Breach | None:
        """A breach of ``limit`` by ``value`` (its ``series``), reached or projected; growth
        below an ``expected`` peak that fits the limit is not projected."""
        if value is None or limit is None:
            return None
        if value >= APPROACH_FRACTION * limit:
            return Breach(kind, value, limit, predicted=False)
        # Within 10% of the limit, growth is projected as it is: no room is left to be wrong.
        near = value >= CONFIRM_FRACTION * limit
        ahead_s = self._lookahead_s()
        if near and value + series.rate_per_s() * ahead_s >= limit:
            return Breach(kind, value, limit, predicted=True)
        # ...and where the model puts the peak past the limit, rising there confirms it: a queue
        # filling or a large batch's step transient can cross the last 10% between readings
        # (the queue and the step's transient are not in every reading).
        past = expected is not None and expected >= OVER_LIMIT_FRACTION * limit
        if near and past and series.rate_per_s() > 0:
            return Breach(kind, value, limit, predicted=True)
        if expected is not None and value < expected < limit:
            return None  # the ramp to a peak that fits
        lasting = series.sustained_rate_per_s()
        if lasting is not None and value + series.growth_within(ahead_s, lasting) >= limit:
            return Breach(kind, value, limit, predicted=True)
        return None

    def check(self, reading: GuardReading) -> Breach | None:
        """The first limit that is crossed or about to be, or None."""
        limits = self.limits
        tree = reading.tree_bytes if reading.tree_exact else None
        breach = self._check("host", tree, self._exact, limits.host_bytes, self._expected_bytes)
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
