"""The supervisor and the memory guard against real trial children and real DataLoader workers.

Every trial here is a real forkserver child running a real DataLoader over the misbehaving
workloads of :mod:`tests.tuner_tests.workloads`; the only stand-in is the GPU
(:class:`tuner.testing.StaticGpuReader`), because this machine has none.
"""

from __future__ import annotations

import dataclasses
import glob
import multiprocessing
import os
import sys
import threading
import time
from typing import Any

import psutil
import pytest

from tests.tuner_tests.workloads import SHM_FILE_PREFIX, SHM_FILL_SHARE, SPIKE_BYTES
from tuner.machine._gpu import GpuDevice, GpuReading, NoGpuReader
from tuner.machine._memory import shm_usage
from tuner.machine._process import process_tree
from tuner.search._settings import LoaderSettings
from tuner.testing import ManualClock, StaticGpuReader
from tuner.trial._guard import GuardLimits, GuardReading, MemoryGuard, default_limits
from tuner.trial._outcome import TrialOutcome
from tuner.trial._protocol import Job, Mode
from tuner.trial._supervisor import Supervisor

MiB = 2**20
GiB = 2**30
WORKLOADS = "tests.tuner_tests.workloads"


def make_job(
    workload: str, settings: LoaderSettings, window_s: float = 0.5, warmup_s: float = 0.2
) -> Job:
    """A measurement job of one of the test workloads, as ``TrialRunner.job`` builds it."""
    return Job(
        mode=Mode.MEASURE,
        objective=f"{WORKLOADS}:{workload}",
        options={},
        settings=settings,
        device="cpu",
        window_s=window_s,
        warmup_s=warmup_s,
        sys_path=tuple(sys.path),
    )


def trial_children() -> list[psutil.Process]:
    """Descendants of this process that lead their own process group: the trial children.

    The forkserver (a child of this process) does not; each trial child it forks does, first
    thing, and its DataLoader workers inherit the group.
    """
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if os.getpgid(process.pid) == process.pid:
                found.append(process)
        except ProcessLookupError:
            continue
    return found


class TreeWatcher:
    """Remembers every process of every trial tree it sees, from a thread polling every 20 ms.

    A thread rather than ``on_progress``: a trial the guard stops early may never report.
    ``psutil.Process`` keeps the create time, so a reused pid is not taken for a survivor.
    """

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-watcher", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.record()
            self._stop.wait(self.interval_s)

    def record(self) -> None:
        for child in trial_children():
            for member in process_tree(child.pid):
                try:
                    self.seen.setdefault((member.pid, member.create_time()), member)
                except psutil.NoSuchProcess:
                    continue

    def __enter__(self) -> TreeWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def survivors(self) -> list[str]:
        """The remembered processes still in the process table (zombies included)."""
        left = []
        for process in self.seen.values():
            try:
                if process.is_running():
                    left.append(f"{process.pid} ({process.status()})")
            except psutil.NoSuchProcess:
                continue
        return left


def run_watched(
    supervisor: Supervisor, job: Job, deadline_s: float = 60.0, **kwargs: Any
) -> tuple[TrialOutcome, TreeWatcher, float]:
    """Run one trial; return its outcome, what the watcher saw and the wall time."""
    started = time.monotonic()
    with TreeWatcher() as watcher:
        outcome = supervisor.run(job, deadline_s, **kwargs)
    return outcome, watcher, time.monotonic() - started


def host_limited(host_bytes: int) -> GuardLimits:
    return dataclasses.replace(default_limits(), host_bytes=host_bytes)


# --- completing trials -------------------------------------------------------------------------


def test_fast_workload_completes_and_leaves_no_process() -> None:
    supervisor = Supervisor(MemoryGuard(default_limits()))
    settings = LoaderSettings(batch=32, num_workers=2, prefetch_factor=2)
    reports: list[float] = []
    trees: list[dict[int, int]] = []  # pid -> parent pid, the trial child's under key 0

    def on_progress(elapsed_s: float, samples_per_sec: float) -> bool:
        reports.append(samples_per_sec)
        for child in trial_children():
            tree = {p.pid: p.ppid() for p in process_tree(child.pid)}
            trees.append({**tree, 0: child.pid})
        return False

    outcome, watcher, _ = run_watched(
        supervisor, make_job("fast", settings, window_s=1.2), on_progress=on_progress
    )

    assert outcome.state == "complete", outcome
    assert outcome.reason is None and outcome.error is None
    assert outcome.attrs["samples_per_sec"] > 0
    assert outcome.attrs["peak_host_memory_bytes"] > 0
    assert reports and all(value > 0 for value in reports)
    # The child and its two workers were seen while measuring, and none of them is left.
    assert trees and max(len(tree) - 1 for tree in trees) >= 3, trees
    if multiprocessing.get_start_method() == "fork":
        # Workers start as in the user's own process: forked by the trial child itself, not
        # through a forkserver the child would inherit as its default start method.
        for tree in trees:
            child = tree.pop(0)
            assert len(tree) == 3, tree
            assert all(parent == child for pid, parent in tree.items() if pid != child), tree
    assert len(watcher.seen) >= 3
    assert watcher.survivors() == []
    assert trial_children() == []


def test_a_steps_peak_between_two_readings_is_in_the_trials_peak() -> None:
    supervisor = Supervisor(MemoryGuard(default_limits()))
    settings = LoaderSettings(batch=8, num_workers=0)
    calm, _, _ = run_watched(supervisor, make_job("spiking_twin", settings, window_s=1.0))
    spiking, _, _ = run_watched(supervisor, make_job("spiking", settings, window_s=1.0))
    assert calm.state == spiking.state == "complete", (calm, spiking)
    # The same process but for one 512 MiB spike of a few milliseconds, on top of its rest.
    peak = spiking.attrs["peak_host_memory_bytes"]
    assert peak - calm.attrs["peak_host_memory_bytes"] >= 0.9 * SPIKE_BYTES
    assert peak >= spiking.attrs["own_peak_host_memory_bytes"]


@pytest.mark.parametrize(
    "settings",
    [
        LoaderSettings(batch=8, num_workers=0),
        LoaderSettings(batch=64, num_workers=2, prefetch_factor=4, persistent_workers=True),
        LoaderSettings(batch=16, num_workers=1, prefetch_factor=2, torch_num_threads=2),
    ],
    ids=["main-process", "two-persistent-workers", "one-worker"],
)
def test_normal_workload_is_never_stopped_by_default_limits(settings: LoaderSettings) -> None:
    limits = default_limits()
    supervisor = Supervisor(MemoryGuard(limits))

    outcome, watcher, _ = run_watched(supervisor, make_job("fast", settings))

    assert outcome.state == "complete", outcome
    assert outcome.reason is None
    assert "guard_reading_bytes" not in outcome.attrs
    assert 0 < outcome.attrs["peak_host_memory_bytes"] < limits.host_bytes
    assert watcher.survivors() == []


class CountingGuard(MemoryGuard):
    """The real guard, counting its readings and how many of them read PSS exactly."""

    readings: int = 0
    exact: int = 0

    def sample(self, tree: list[psutil.Process] | None = None) -> GuardReading:
        reading = super().sample(tree)
        self.readings += 1
        self.exact += reading.tree_exact
        return reading


def test_steady_memory_is_not_read_exactly_at_every_tick() -> None:
    guard = CountingGuard(default_limits())
    settings = LoaderSettings(batch=32, num_workers=2, prefetch_factor=2, persistent_workers=True)

    outcome = Supervisor(guard).run(make_job("fast", settings, window_s=3.0), deadline_s=60.0)

    assert outcome.state == "complete", outcome
    assert guard.readings >= 15
    # The tree's start (the child, then its workers) and one periodic reading, not every tick.
    assert 2 <= guard.exact <= guard.readings // 3


# --- the guard stops a leak --------------------------------------------------------------------


@pytest.mark.parametrize("expected_peak_bytes", [None, 512 * MiB], ids=["unknown", "expected"])
def test_leaky_workload_is_stopped_before_the_host_limit(expected_peak_bytes: int | None) -> None:
    """Also where the trial's peak was expected well under the limit (the memory model's): its
    growth past that peak is projected again."""
    limit = int(1.5 * GiB)
    supervisor = Supervisor(MemoryGuard(host_limited(limit)))
    settings = LoaderSettings(batch=16, num_workers=2, prefetch_factor=2)

    outcome, watcher, _ = run_watched(
        supervisor,
        make_job("leaky", settings, window_s=20.0),
        expected_peak_bytes=expected_peak_bytes,
    )

    assert outcome.state == "pruned", outcome
    assert outcome.reason == "memory_guard: host"
    attrs = outcome.attrs
    assert attrs["guard_limit_bytes"] == limit
    assert attrs["guard_reading_bytes"] < limit  # stopped on its way up, not after crossing
    assert attrs["peak_host_memory_bytes"] < limit
    assert attrs["peak_host_memory_bytes"] >= attrs["guard_reading_bytes"] > 256 * MiB
    assert isinstance(attrs["guard_predicted"], bool)
    assert attrs["kill_seconds"] >= 0  # recorded; how fast is the machine's, not the guard's
    assert len(watcher.seen) >= 3
    assert watcher.survivors() == []


def _unguarded_peak(job: Job) -> int:
    """The host peak of ``job`` run to the end under the machine's own limits."""
    unguarded = Supervisor(MemoryGuard(default_limits())).run(job, deadline_s=60.0)
    assert unguarded.state == "complete", unguarded
    return unguarded.attrs["peak_host_memory_bytes"]


def _completes_unstopped(job: Job, limit: int) -> None:
    """``job`` runs to the end under a host limit of ``limit``: never stopped, no survivors."""
    outcome, watcher, _ = run_watched(Supervisor(MemoryGuard(host_limited(limit))), job)
    assert outcome.state == "complete", outcome
    assert "guard_reading_bytes" not in outcome.attrs
    assert outcome.attrs["peak_host_memory_bytes"] < limit
    assert watcher.survivors() == []


def test_memory_that_ramps_then_holds_completes_under_a_limit_above_its_plateau() -> None:
    settings = LoaderSettings(batch=8, num_workers=2, prefetch_factor=2)
    job = make_job("ramping", settings, window_s=2.0, warmup_s=0.2)
    plateau = _unguarded_peak(job)
    assert plateau > 192 * MiB  # the two workers' 96 MiB each, at least
    # Half again the plateau: the climb from the workers' start, extrapolated over the guard's
    # look-ahead as the guard did before it waited for growth that lasts, crosses it.
    limit = int(1.5 * plateau)
    _completes_unstopped(job, limit)


def test_one_process_whose_memory_slows_down_and_holds_completes_under_a_limit_above_it() -> None:
    settings = LoaderSettings(batch=8, num_workers=0)
    job = make_job("settling", settings, window_s=2.5, warmup_s=0.2)
    plateau = _unguarded_peak(job)
    # The plateau at 88% of the limit, as the first large batch of image b512 and text tok32768
    # held when the guard took their climb for a leak.
    limit = int(plateau / 0.88)
    _completes_unstopped(job, limit)


def test_shm_filling_workload_is_stopped_by_the_shm_limit() -> None:
    usage = shm_usage()
    if usage is None:
        pytest.skip("no /dev/shm on this machine")
    # Sized to what is free, so it runs on Docker's 64 MiB too: two workers write up to a
    # quarter of it (an eighth each), four times the room the limit leaves above today's use.
    free_bytes = usage.total_bytes - usage.used_bytes
    room = min(64 * MiB, free_bytes // (2 * SHM_FILL_SHARE))
    limits = dataclasses.replace(default_limits(), shm_bytes=usage.used_bytes + room)
    supervisor = Supervisor(MemoryGuard(limits))
    settings = LoaderSettings(batch=8, num_workers=2, prefetch_factor=2)
    try:
        outcome, watcher, _ = run_watched(
            supervisor, make_job("shm_filling", settings, window_s=20.0)
        )
    finally:
        for path in glob.glob(f"/dev/shm/{SHM_FILE_PREFIX}*"):
            os.unlink(path)

    assert outcome.state == "pruned", outcome
    assert outcome.reason == "memory_guard: shm"
    assert outcome.attrs["guard_limit_bytes"] == limits.shm_bytes
    assert outcome.attrs["peak_shm_bytes"] >= outcome.attrs["guard_reading_bytes"]
    assert outcome.attrs["guard_reading_bytes"] > usage.used_bytes  # the fill was seen
    assert watcher.survivors() == []


# --- trials that die, hang or fail -------------------------------------------------------------


def test_worker_that_kills_itself_prunes_the_trial_as_worker_killed() -> None:
    supervisor = Supervisor(MemoryGuard(default_limits()))
    settings = LoaderSettings(batch=8, num_workers=2, prefetch_factor=2)

    outcome, watcher, _ = run_watched(supervisor, make_job("self_killing", settings))

    assert outcome.state == "pruned", outcome
    assert outcome.reason == "worker_killed"
    assert outcome.error is not None and "DataLoader worker" in outcome.error
    assert watcher.survivors() == []


def test_hanging_dataset_is_killed_at_the_deadline() -> None:
    supervisor = Supervisor(MemoryGuard(default_limits()))
    settings = LoaderSettings(batch=8, num_workers=2, prefetch_factor=2)

    outcome, watcher, wall_s = run_watched(
        supervisor, make_job("hanging", settings), deadline_s=3.0
    )

    assert outcome.state == "pruned", outcome
    assert outcome.reason == "timeout"
    assert outcome.error == "no result within 3 s"
    assert outcome.attrs["kill_seconds"] >= 0
    # Not before the deadline, and long before the dataset's hour-long read would return.
    assert 3.0 <= wall_s < 120.0
    assert len(watcher.seen) >= 3  # the child and both workers were there to kill
    assert watcher.survivors() == []


@pytest.mark.parametrize("workers", [0, 2])
def test_raising_dataset_fails_the_trial_with_its_error(workers: int) -> None:
    supervisor = Supervisor(MemoryGuard(default_limits()))
    settings = LoaderSettings(batch=8, num_workers=workers, prefetch_factor=2 if workers else None)

    outcome, watcher, _ = run_watched(supervisor, make_job("raising", settings))

    assert outcome.state == "failed", outcome
    assert outcome.reason is None
    assert outcome.error is not None and "corrupt file" in outcome.error
    assert outcome.error.startswith("OSError:")
    assert watcher.survivors() == []


# --- the GPU side, through the one allowed stand-in --------------------------------------------


def gpu_frames(used_bytes: list[int], total: int = 8 * GiB) -> list[list[GpuReading]]:
    """One frame per sample: device 0 at each value, device 1 always nearly full."""
    return [
        [GpuReading(0, used, total, 50.0), GpuReading(1, total - MiB, total, 99.0)]
        for used in used_bytes
    ]


def gpu_guard(
    frames: list[list[GpuReading]], limit: int, interval_s: float, clock: ManualClock
) -> MemoryGuard:
    devices = [GpuDevice(0, "Stand-in GPU", 8 * GiB), GpuDevice(1, "Stand-in GPU", 8 * GiB)]
    limits = default_limits(gpu_memory_limit=f"{limit}", gpu_total_bytes=8 * GiB)
    assert limits.gpu_bytes == limit
    reader = StaticGpuReader(devices, frames)
    return MemoryGuard(limits, gpu=reader, gpu_indices=[0], interval_s=interval_s, clock=clock)


def test_gpu_memory_stepping_over_the_limit_trips_a_gpu_breach() -> None:
    limit = 1 * GiB
    clock = ManualClock()
    guard = gpu_guard(gpu_frames([400 * MiB] * 4 + [limit - 10 * MiB]), limit, 0.05, clock)
    guard.start(None)

    breaches = []
    for _ in range(5):
        breaches.append(guard.check(guard.sample()))
        clock.now += 0.05

    assert breaches[:4] == [None] * 4  # flat well below the limit; device 1 is not watched
    breach = breaches[4]
    assert breach is not None and breach.kind == "gpu" and breach.reason == "memory_guard: gpu"
    assert (breach.reading_bytes, breach.limit_bytes, breach.predicted) == (
        limit - 10 * MiB,
        limit,
        False,
    )
    assert guard.peaks()["peak_gpu_memory_bytes"] == limit - 10 * MiB


def test_every_ranks_gpu_is_watched_and_any_one_breaches() -> None:
    """A 2-rank trial's guard reads both ranks' devices: device 1, nearly full, breaches."""
    limit = 1 * GiB
    devices = [GpuDevice(0, "Stand-in GPU", 8 * GiB), GpuDevice(1, "Stand-in GPU", 8 * GiB)]
    limits = default_limits(gpu_memory_limit=f"{limit}", gpu_total_bytes=8 * GiB)
    frames = [[GpuReading(0, 100 * MiB, 8 * GiB, 50.0), GpuReading(1, limit, 8 * GiB, 99.0)]]
    for indices, breaches in (([0], False), ([0, 1], True)):
        reader = StaticGpuReader(devices, frames)
        guard = MemoryGuard(limits, gpu=reader, gpu_indices=indices, clock=ManualClock())
        guard.start(None)
        breach = guard.check(guard.sample())
        assert (breach is not None) is breaches, indices
    assert breach is not None and breach.kind == "gpu" and breach.reading_bytes == limit


def test_gpu_memory_climbing_towards_the_limit_is_stopped_before_it() -> None:
    limit = 1 * GiB
    climbing = [step * 50 * MiB for step in range(1, 21)]  # 50 MiB a sample, 500 MiB/s
    clock = ManualClock()
    guard = gpu_guard(gpu_frames(climbing), limit, 0.1, clock)
    guard.start(None)

    breach = None
    for _ in climbing:
        breach = guard.check(guard.sample())
        if breach is not None:
            break
        clock.now += 0.1

    assert breach is not None and breach.kind == "gpu"
    assert breach.predicted is True
    assert breach.reading_bytes < limit


def test_a_jump_that_then_holds_is_not_extrapolated() -> None:
    limit = 1 * GiB
    # A startup step: +400 MiB in one sample (4 GiB/s), then it slows and holds at 60%.
    frames = gpu_frames([100 * MiB, 500 * MiB, 600 * MiB, 610 * MiB] + [612 * MiB] * 8)
    clock = ManualClock()
    guard = gpu_guard(frames, limit, 0.1, clock)
    guard.start(None)

    for _ in range(12):
        assert guard.check(guard.sample()) is None
        clock.now += 0.1
    assert guard.peaks()["peak_gpu_memory_bytes"] == 612 * MiB


def test_without_a_gpu_nothing_gpu_related_trips() -> None:
    limits = default_limits(gpu_memory_limit="1", gpu_total_bytes=8 * GiB)  # a 1-byte budget
    for reader in (NoGpuReader("no NVIDIA device found"), None):
        clock = ManualClock()
        guard = MemoryGuard(limits, gpu=reader, gpu_indices=[0], interval_s=0.05, clock=clock)
        guard.start(os.getpid())
        for _ in range(3):
            reading = guard.sample()
            assert reading.gpu_bytes is None
            assert guard.check(reading) is None
            clock.now += 0.05
        assert "peak_gpu_memory_bytes" not in guard.peaks()
        assert guard.peaks()["peak_host_memory_bytes"] > 0
