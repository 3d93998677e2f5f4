"""The bottleneck rules on recorded telemetry: one case per class, and the order between them.

The input-, cpu-, compute- and memory-bound cases are the user attrs of real trials on the 2-core
test machine (a sleeping dataset with one worker; a CPU-heavy dataset with 4 workers on 2 cores;
a step that sleeps 20 ms on a prebuilt batch; a leaking dataset the guard stopped). The
io-bound case carries the iowait share psutil reports while workers read a cold network disk,
which this machine cannot produce on demand.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import IntDistribution

from tuner.insight._diagnosis import BOTTLENECKS, Diagnosis, diagnose, diagnose_trial
from tuner.trial._guard import GuardLimits

GIB = 2**30

INPUT_BOUND = {
    "samples_per_sec": 457.6,
    "data_wait_fraction": 0.9975,
    "cpu_percent_mean": 53.74,
    "cpu_percent_peak": 78.57,
    "cpu_percent_per_core_mean": [12.93, 94.55],
    "iowait_percent_mean": 0.0,
    "available_memory_bytes_min": 24_274_227_200,
    "settings": {"num_workers": 1, "batch": 32},
    "machine": {"memory_bytes": 24_696_061_952},
}

EVERY_BATCH_HAS_A_WORKER = {
    # A storage study's trial (8 ms per sample): 100 workers for an epoch of 4,096 samples in 32
    # batches of 128, so 68 workers wait idle; `epoch_batches` as `len(loader)` gives it.
    "samples_per_sec": 3290.2,
    "data_wait_fraction": 0.9599,
    "cpu_percent_mean": 23.0,
    "cpu_percent_peak": 73.56,
    "cpu_percent_per_core_mean": [23.01, 23.0],
    "iowait_percent_mean": 0.0,
    "available_memory_bytes_min": 23_210_049_536,
    "settings": {"num_workers": 100, "batch": 128},
    "epoch_batches": 32,
    "machine": {"memory_bytes": 25_276_182_528},
}

CPU_BOUND = {
    "samples_per_sec": 589.8,
    "data_wait_fraction": 0.9979,
    "cpu_percent_mean": 99.5,
    "cpu_percent_peak": 100.0,
    "cpu_percent_per_core_mean": [100.0, 99.0],
    "iowait_percent_mean": 0.0,
    "available_memory_bytes_min": 23_571_177_472,
    "settings": {"num_workers": 4, "batch": 32},
}

IO_BOUND = {
    "samples_per_sec": 212.4,
    "data_wait_fraction": 0.83,
    "cpu_percent_mean": 31.2,
    "cpu_percent_peak": 47.0,
    "iowait_percent_mean": 38.5,
    "iowait_percent_peak": 61.0,
    "available_memory_bytes_min": 20_112_000_000,
    "settings": {"num_workers": 4, "batch": 64},
}

COMPUTE_BOUND = {
    "samples_per_sec": 3166.0,
    "data_wait_fraction": 0.0041,
    "cpu_percent_mean": 58.1,
    "cpu_percent_peak": 71.4,
    "iowait_percent_mean": 0.0,
    "available_memory_bytes_min": 24_101_000_000,
    "settings": {"num_workers": 0, "batch": 64},
}

MEMORY_GUARD_PRUNED = {
    "kill_seconds": 0.04,
    "guard_reading_bytes": 1.52e9,
    "guard_limit_bytes": 1.5e9,
    "peak_host_memory_bytes": 1_520_000_000,
    "cpu_percent_mean": 62.0,
    "available_memory_bytes_min": 21_900_000_000,
    "settings": {"num_workers": 2, "batch": 16},
}


@pytest.mark.parametrize(
    ("attrs", "pruned_reason", "expected"),
    [
        (INPUT_BOUND, None, "input-bound"),
        (CPU_BOUND, None, "cpu-bound"),
        (IO_BOUND, None, "io-bound"),
        (COMPUTE_BOUND, None, "compute-bound"),
        (MEMORY_GUARD_PRUNED, "memory_guard: host", "memory-bound"),
    ],
)
def test_each_recorded_case_gets_its_class(
    attrs: dict[str, object], pruned_reason: str | None, expected: str
) -> None:
    diagnosis = diagnose(attrs, pruned_reason)
    assert diagnosis is not None
    assert diagnosis.bottleneck == expected
    assert diagnosis.bottleneck in BOTTLENECKS
    assert diagnosis.advice and "\n" not in diagnosis.advice


def test_advice_says_what_to_change() -> None:
    assert "num_workers (now 1)" in diagnose(INPUT_BOUND).advice  # type: ignore[union-attr]
    idle = diagnose(EVERY_BATCH_HAS_A_WORKER)
    assert idle is not None and idle.bottleneck == "input-bound"
    assert "lower batch_size" in idle.advice and "raise num_workers" not in idle.advice
    assert "will not help" in diagnose(CPU_BOUND).advice  # type: ignore[union-attr]
    assert "RAM disk" in diagnose(IO_BOUND).advice  # type: ignore[union-attr]
    assert "batch_size or the model" in diagnose(COMPUTE_BOUND).advice  # type: ignore[union-attr]
    memory = diagnose(MEMORY_GUARD_PRUNED, "memory_guard: host")
    assert memory is not None and "pin_memory off" in memory.advice


def test_a_peak_close_to_its_limit_is_memory_bound_without_a_prune() -> None:
    limits = GuardLimits(
        host_bytes=2 * GIB, shm_bytes=GIB, gpu_bytes=None, machine_total_bytes=23 * GIB
    )
    close = {**INPUT_BOUND, "peak_host_memory_bytes": int(1.9 * GIB)}
    diagnosis = diagnose(close, None, limits)
    assert diagnosis is not None and diagnosis.bottleneck == "memory-bound"
    assert "95% of its limit" in diagnosis.advice
    far = {**INPUT_BOUND, "peak_host_memory_bytes": GIB // 2}
    assert diagnose(far, None, limits).bottleneck == "input-bound"  # type: ignore[union-attr]


def test_low_available_memory_or_swap_growth_is_memory_bound() -> None:
    starved = {**COMPUTE_BOUND, "available_memory_bytes_min": GIB // 2}
    limits = GuardLimits(
        host_bytes=20 * GIB, shm_bytes=None, gpu_bytes=None, machine_total_bytes=23 * GIB
    )
    assert diagnose(starved, None, limits).bottleneck == "memory-bound"  # type: ignore[union-attr]
    swapping = {**COMPUTE_BOUND, "swap_used_bytes_growth": 300 * 2**20}
    assert diagnose(swapping).bottleneck == "memory-bound"  # type: ignore[union-attr]


def test_memory_wall_and_out_of_memory_reasons_are_memory_bound() -> None:
    skipped = ("memory_wall", "memory_model")
    for reason in (*skipped, "cuda_oom", "host_oom", "shm_full", "memory_guard: gpu"):
        diagnosis = diagnose({}, reason)
        assert diagnosis is not None and diagnosis.bottleneck == "memory-bound", reason


def test_at_the_ceiling_is_compute_bound_even_with_some_data_wait() -> None:
    near = {**INPUT_BOUND, "data_wait_fraction": 0.3, "efficiency": 0.985}
    assert diagnose(near).bottleneck == "compute-bound"  # type: ignore[union-attr]


def test_nothing_measured_gives_no_diagnosis() -> None:
    assert diagnose({"error": "ValueError: boom"}, None) is None
    assert diagnose({}, "timeout") is None


def test_diagnose_trial_prefers_the_stored_diagnosis() -> None:
    stored = optuna.trial.create_trial(
        value=1.0,
        params={"num_workers": 1},
        distributions={"num_workers": IntDistribution(0, 4)},
        user_attrs={**CPU_BOUND, "bottleneck": "io-bound", "advice": "as recorded"},
    )
    assert diagnose_trial(stored) == Diagnosis("io-bound", "as recorded")
    fresh = optuna.trial.create_trial(
        value=1.0,
        params={"num_workers": 1},
        distributions={"num_workers": IntDistribution(0, 4)},
        user_attrs=CPU_BOUND,
    )
    assert diagnose_trial(fresh).bottleneck == "cpu-bound"  # type: ignore[union-attr]
