"""The profile's measured part, in real processes: a stand-in worker and a real DataLoader."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import psutil
import pytest
import torch

from objectives import Workload, storage_workload
from tests.tuner_tests.workloads import Stalling, Vectors
from tuner.pipeline import PipelineProfile
from tuner.pipeline._profile import KNOB_COST_FIELDS, STEP_TIME_RATIO, knob_key
from tuner.trial import _pipeline
from tuner.trial._pipeline import _cpu_s, _step_time_ratio, measure_pipeline, samples_per_batch

CPU = torch.device("cpu")


def test_a_fetch_that_waits_on_storage_shows_its_wait_share() -> None:
    workload = storage_workload(samples=256, latency_ms=5)
    attrs = measure_pipeline(workload, 16, CPU, [8, 16, 32], budget_s=0.2)
    assert attrs["fetch_wall_s"] >= 0.005
    assert attrs["fetch_cpu_s"] < 0.5 * attrs["fetch_wall_s"]  # mostly waiting
    assert attrs["measured_samples"] >= 3 * 16
    assert attrs["worker_uss_bytes"] > 0 and attrs["worker_pss_bytes"] >= attrs["worker_uss_bytes"]
    assert attrs["sample_bytes"] == pytest.approx(256 * 4 + 8)  # features + one int64 label
    assert attrs["samples_per_batch"] == {"8": 8.0, "16": 16.0, "32": 32.0}
    assert attrs["worker_start_s"] > 0 and attrs["dataset_samples"] == 256
    assert attrs["loader_worker_cpu_s"] >= 0 and attrs["loader_main_cpu_s"] >= 0
    assert 0 < attrs["worker_fork_bytes"] < attrs["worker_pss_bytes"]
    assert attrs["fetch_burst_s"] >= 0


def test_a_fetch_that_computes_has_no_wait_share() -> None:
    workload = Workload(name="busy", dataset=Vectors(size=256, work=3000), default_batch_size=8)
    attrs = measure_pipeline(workload, 8, CPU, [8], budget_s=0.2)
    # On a shared machine part of the wall time is spent queued for a CPU: not an I/O wait.
    assert attrs["fetch_cpu_s"] + attrs["fetch_runqueue_s"] > 0.7 * attrs["fetch_wall_s"]
    assert attrs["collate_s"] > 0 and attrs["ipc_dump_s"] > 0 and attrs["ipc_load_s"] > 0


def test_a_fetch_that_stalls_now_and_then_shows_its_burst() -> None:
    """A 100 ms stall every 40th sample falls in at most every other batch of 16 after the
    first: the slowest batch runs at least half a stall over the mean."""
    workload = Workload(name="stalling", dataset=Stalling(every=40, stall_s=0.1))
    attrs = measure_pipeline(workload, 16, CPU, [16], budget_s=0.2)
    assert attrs["measured_samples"] >= 48  # the first stall, at the 40th, is in the third
    assert attrs["fetch_burst_s"] >= 0.1 / 2 - 0.01
    profile = PipelineProfile.from_attrs(
        {
            **attrs,
            "usable_cores": 2.0,
            "step_rates": {1: {16: 100.0}},
            "step_cpu_s": {1: {16: 0.01}},
        }
    )
    assert profile.fetch_burst_s == attrs["fetch_burst_s"]


def test_a_batch_sampler_counts_its_epoch_mean() -> None:
    from objectives import text_workload

    workload = text_workload(sequences=300, vocab_size=64, max_length=96)
    counts = samples_per_batch(workload, [1024, 2048], seed=0)
    assert 1 < counts[1024] < counts[2048] < 300


def test_each_other_knob_value_is_profiled_with_its_own_costs() -> None:
    from objectives import image_workload

    workload = image_workload(images=64, resolution=32, crop=24)
    attrs = measure_pipeline(
        workload,
        8,
        CPU,
        [8],
        budget_s=0.2,
        knobs={"collate": "float"},
        knob_variants=[("collate", "uint8")],
    )
    uint8 = attrs["knob_costs"][knob_key("collate", "uint8")]
    assert set(uint8) == {*KNOB_COST_FIELDS, STEP_TIME_RATIO}
    # A uint8 sample is a quarter of a float one (3 x 24 x 24 pixels, plus its int64 label).
    assert attrs["sample_bytes"] == pytest.approx(3 * 24 * 24 * 4 + 8)
    assert uint8["sample_bytes"] == pytest.approx(3 * 24 * 24 + 8)
    assert uint8["step_time_ratio"] > 0
    stored = PipelineProfile.from_attrs(
        {**attrs, "usable_cores": 2.0, "step_rates": {1: {8: 100.0}}, "step_cpu_s": {1: {8: 0.01}}}
    )
    assert stored.for_knobs({"collate": "uint8"}).sample_bytes == uint8["sample_bytes"]


class _Clock:
    """A ``time`` stand-in for the step timer: it moves only when a step says it took time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-9  # every reading is later than the one before, as a real clock's
        return self.now


def _timed_step(clock: _Clock, seconds: float) -> Callable[[object, torch.device], None]:
    def step(batch: object, device: torch.device) -> None:
        clock.now += seconds

    return step


def test_a_knobs_step_time_is_read_against_the_base_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(_pipeline, "time", clock)

    def workload(seconds: float) -> Workload:
        return Workload(
            name="timed", dataset=Vectors(), step=_timed_step(clock, seconds), default_batch_size=8
        )

    doubled = _step_time_ratio(workload(0.002), workload(0.004), 8, CPU, seed=0)
    same = _step_time_ratio(workload(0.003), workload(0.003), 8, CPU, seed=0)
    assert doubled == pytest.approx(2.0, rel=1e-3)
    assert same == pytest.approx(1.0, rel=1e-3)


def test_the_stand_in_worker_holds_one_batch_not_every_batch_it_made() -> None:
    """torch keeps each batch pickled into shared memory mapped until its cache sweeps (past
    128 entries); a real worker's memory stays flat, and so must the profile's reading of it."""
    batch_bytes = 16 * 64 * 1024 * 4  # 4 MiB a batch
    workload = Workload(
        name="wide", dataset=Vectors(size=2048, width=64 * 1024), default_batch_size=16
    )
    # A budget no busy machine runs out of: the 48 batches, not the clock, end the profile.
    attrs = measure_pipeline(workload, 16, CPU, [16], budget_s=120.0, max_batches=48)
    assert attrs["measured_samples"] == 48 * 16
    held = 48 * batch_bytes  # every batch made, were they held
    assert attrs["worker_uss_bytes"] < 96 * 2**20 <= 0.75 * held


def _spin_on_request(conn: Connection) -> None:
    """Spin 3 ms of CPU when asked, then say how much CPU this process has used in all."""
    conn.recv()
    started = time.process_time()
    while time.process_time() - started < 0.003:
        pass
    conn.send(time.process_time())
    conn.recv()


def test_a_processs_cpu_is_read_finer_than_a_clock_tick() -> None:
    """A worker's CPU in the profile's second is tens of milliseconds: 10 ms ticks would move it
    by a third. Another process's CPU reads as its own clock counts it, within half a
    millisecond (psutil's ticks read 0 or 10 ms for the same 3 ms bursts)."""
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    process = context.Process(target=_spin_on_request, args=(child,))
    process.start()
    try:
        parent.send("spin")
        used = parent.recv()
        assert _cpu_s(psutil.Process(process.pid)) == pytest.approx(used, abs=0.0005)
    finally:
        parent.send("done")
        process.join(timeout=10)
