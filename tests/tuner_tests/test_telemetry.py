"""Telemetry on the real machine: a core kept busy shows up, the CSV holds the series, the
per-step timeline stays small, and a starved loop is diagnosed from what was recorded."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from objectives import Workload
from tests.tuner_tests.workloads import Vectors, _sum_step
from tuner.insight._diagnosis import diagnose
from tuner.machine._gpu import GpuDevice, GpuReading
from tuner.search._settings import LoaderSettings
from tuner.testing import StaticGpuReader
from tuner.trial._measure import measure
from tuner.trial._telemetry import (
    STEPS_CSV,
    TELEMETRY_CSV,
    StepTimeline,
    TelemetrySampler,
    collect_trial_telemetry,
    read_timeline_csv,
    timeline_csv,
    timeline_summary,
)


@pytest.fixture
def busy_core() -> Iterator[subprocess.Popen[bytes]]:
    """One process spinning on the first usable core (pinned) for the test's duration."""
    core = min(os.sched_getaffinity(0))
    spinner = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    try:
        time.sleep(0.2)
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


def _sample_for(sampler: TelemetrySampler, seconds: float, interval_s: float = 0.1) -> float:
    """Sample for ``seconds``; return the last sample's time after the start."""
    started = time.monotonic()
    sampler.start(started)
    end = started + seconds
    now = started
    while now < end:
        time.sleep(interval_s)
        now = time.monotonic()
        sampler.sample(now)
    return now - started


def test_a_busy_core_shows_in_the_summary_and_the_csv(
    busy_core: subprocess.Popen[bytes],
) -> None:
    sampler = TelemetrySampler()
    last_s = _sample_for(sampler, 1.0)
    summary = sampler.summary()
    cores = len(os.sched_getaffinity(0))
    # One of the usable cores spins: the overall share is at least about 1/cores of the time.
    assert summary["cpu_percent_peak"] >= 0.8 * 100 / cores
    assert len(summary["cpu_percent_per_core_mean"]) == cores
    assert summary["cpu_percent_per_core_mean"][0] >= 80  # the spinner's core
    assert 0 <= summary["iowait_percent_mean"] <= 100
    assert summary["available_memory_bytes_min"] > 0
    assert summary["telemetry_samples"] >= 5
    assert "gpu_utilization_percent_mean" not in summary

    rows = list(csv.DictReader(io.StringIO(sampler.to_csv())))
    assert len(rows) == summary["telemetry_samples"]
    assert {f"cpu{core}_percent" for core in os.sched_getaffinity(0)} <= set(rows[0])
    times = [float(row["t_s"]) for row in rows]
    assert times == sorted(times) and times[-1] == pytest.approx(last_s, abs=1e-3)
    assert all(row["in_window"] == "1" for row in rows)


def test_the_window_selects_its_samples() -> None:
    sampler = TelemetrySampler()
    started = time.monotonic()
    _sample_for(sampler, 0.8)
    since, until = started + 0.3, started + 0.6
    inside = sampler.summary(since, until)["telemetry_samples"]
    everything = sampler.summary()["telemetry_samples"]
    assert 0 < inside < everything
    rows = list(csv.DictReader(io.StringIO(sampler.to_csv(since, until))))
    assert sum(row["in_window"] == "1" for row in rows) == inside


def test_gpu_utilisation_and_memory_through_a_reader() -> None:
    device = GpuDevice(0, "Test GPU", 16 * 2**30)
    frames = [
        [GpuReading(0, used * 2**30, 16 * 2**30, util)]
        for used, util in ((1, 10.0), (3, 90.0), (2, 80.0))
    ]
    sampler = TelemetrySampler(gpu=StaticGpuReader([device], frames), gpu_index=0)
    sampler.start(time.monotonic())
    for _ in frames:
        time.sleep(0.05)
        sampler.sample(time.monotonic())
    summary = sampler.summary()
    assert summary["gpu_utilization_percent_mean"] == pytest.approx(60.0)
    assert summary["gpu_utilization_percent_peak"] == 90.0
    assert summary["gpu_memory_bytes_peak"] == 3 * 2**30
    rows = list(csv.DictReader(io.StringIO(sampler.to_csv())))
    assert [row["gpu_utilization_percent"] for row in rows] == ["10.0", "90.0", "80.0"]


def test_the_step_timeline_stays_bounded_and_keeps_its_sums() -> None:
    timeline = StepTimeline(max_points=100)
    for step in range(10_001):
        timeline.add(step * 0.001, 0.0002, 0.0008)
    rows = timeline.rows()
    assert len(rows) <= 100
    assert sum(row[1] for row in rows) == 10_001
    assert sum(row[2] for row in rows) == pytest.approx(10_001 * 0.0002)
    assert sum(row[3] for row in rows) == pytest.approx(10_001 * 0.0008)
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)
    again = read_timeline_csv(timeline_csv(rows))
    assert all(a == pytest.approx(b) for a, b in zip(again, rows, strict=True))
    summary = timeline_summary(rows)
    assert summary["data_wait_s_mean"] == pytest.approx(0.0002)
    assert summary["step_s_mean"] == pytest.approx(0.0008)


def test_collect_takes_the_timeline_out_of_the_result_attrs() -> None:
    sampler = TelemetrySampler()
    started = time.monotonic()
    _sample_for(sampler, 0.5)
    attrs = {
        "samples_per_sec": 100.0,
        "window_s": 0.3,
        "window_started_at": started + 0.1,
        "timeline": [[0.0, 2, 0.01, 0.02], [0.03, 2, 0.01, 0.02]],
    }
    collected = collect_trial_telemetry(sampler, attrs)
    assert attrs == {"samples_per_sec": 100.0, "window_s": 0.3}
    assert collected.attrs["data_wait_s_mean"] == pytest.approx(0.005)
    assert 0 < collected.attrs["telemetry_samples"] < sampler.summary()["telemetry_samples"]
    assert set(collected.artifacts()) == {TELEMETRY_CSV, STEPS_CSV}
    assert collect_trial_telemetry(None, {"samples_per_sec": 1.0}).artifacts() == {}


class _Sleepy(Vectors):
    """A dataset that waits on something slow without using a CPU (a remote read, say)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.003)
        return super().__getitem__(index)


def test_a_starved_loop_is_diagnosed_from_its_recorded_telemetry() -> None:
    workload = Workload(
        name="sleepy",
        dataset=_Sleepy(size=1024),
        step=_sum_step,
        default_batch_size=16,
        batch_size_range=(16, 16),
    )
    settings = LoaderSettings(batch=16, num_workers=0, torch_num_threads=1)
    sampler = TelemetrySampler()
    stop = threading.Event()
    sampler.start(time.monotonic())

    def tick() -> None:  # as the supervisor does, every 0.2 s
        while not stop.wait(0.2):
            sampler.sample(time.monotonic())

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        result = measure(workload, settings, torch.device("cpu"), window_s=1.0, warmup_s=0.1)
    finally:
        stop.set()
        ticker.join()
    attrs = {**result.to_attrs(), **sampler.summary(), "settings": settings.to_attrs()}
    assert attrs["data_wait_fraction"] > 0.9
    assert 0 <= attrs["cpu_percent_mean"] <= 100
    # The loop waits. Whether the cores have room is what else this machine runs now, so the
    # recording is diagnosed with the machine's load set by hand: idle, then saturated.
    idle = diagnose({**attrs, "cpu_percent_mean": 5.0})
    saturated = diagnose({**attrs, "cpu_percent_mean": 100.0})
    assert idle is not None and saturated is not None
    assert (idle.bottleneck, saturated.bottleneck) == ("input-bound", "cpu-bound")
