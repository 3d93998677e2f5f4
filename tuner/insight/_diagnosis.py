"""What held a trial back: one bottleneck class and a one-line advice, from recorded numbers.

A pure function over what a trial recorded (its user attrs: the measurement, the telemetry
summary, the guard's peaks), so a stored trial can be diagnosed again anywhere, and each rule is
tested on recorded telemetry. The rules, first match wins:

1. ``memory-bound``: pruned for memory (guard, out-of-memory, ``memory_wall``,
   ``memory_model``), or a peak at :data:`MEMORY_NEAR_LIMIT_FRACTION` of its limit, or
   MemAvailable below :data:`LOW_AVAILABLE_FRACTION` of the machine, or swap growing by
   :data:`SWAP_GROWTH_BYTES`.
2. ``compute-bound``: throughput within 2% of the ceiling, or the loop waits for data less than
   :data:`INPUT_WAIT_FRACTION` of the window: data is ready, the step is the limit.
3. ``io-bound``: the loop waits for data and iowait is at least :data:`IOWAIT_PERCENT` of the
   CPU time: the workers wait on storage.
4. ``cpu-bound``: the loop waits for data and the usable cores are at least
   :data:`CPU_SATURATED_PERCENT` busy on average: more workers only share the same cores.
5. ``input-bound``: the loop waits for data while the CPUs have room: more workers help, unless
   every batch of the epoch already has its own worker (``epoch_batches``): then a smaller
   batch does, giving the workers more, shorter fetches. Read against its study, a best trial
   whose study measured more workers slower is told to keep its count
   (:func:`more_workers_were_slower`).

A trial that recorded no measurement and no memory trouble (failed, hung) gets no diagnosis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from optuna.trial import FrozenTrial

from tuner._naming import SETTINGS_ATTR, is_memory_reason
from tuner.trial import GuardLimits, TelemetrySummary

__all__ = [
    "BOTTLENECKS",
    "CPU_SATURATED_PERCENT",
    "INPUT_WAIT_FRACTION",
    "IOWAIT_PERCENT",
    "Diagnosis",
    "diagnose",
    "diagnose_trial",
    "more_workers_were_slower",
]

BOTTLENECKS = ("input-bound", "cpu-bound", "io-bound", "compute-bound", "memory-bound")

INPUT_WAIT_FRACTION = 0.20
"""Share of the window spent waiting for the next batch from which the loader is the limit."""

CPU_SATURATED_PERCENT = 85.0
"""Mean busy share of the usable cores from which every core counts as busy."""

IOWAIT_PERCENT = 15.0
"""Mean iowait share of CPU time from which the workers count as waiting on storage."""

MEMORY_NEAR_LIMIT_FRACTION = 0.85
"""A memory peak at this share of its guard limit is close to it."""

LOW_AVAILABLE_FRACTION = 0.05
"""MemAvailable below this share of the machine's memory: the next step up will not fit."""

SWAP_GROWTH_BYTES = 64 * 2**20
"""Swap growing by this much during the window: the setting pushes the machine into swap."""

CEILING_FRACTION = 0.98
"""Throughput at this share of the ceiling is as fast as any loader can feed the step."""

_MEMORY_ADVICE = "fewer workers, a smaller batch or prefetch_factor, pin_memory off"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    bottleneck: str
    advice: str

    def to_attrs(self) -> dict[str, str]:
        """The ``bottleneck`` and ``advice`` user attrs."""
        return {"bottleneck": self.bottleneck, "advice": self.advice}


def _memory_trouble(
    attrs: Mapping[str, Any], pruned_reason: str | None, limits: GuardLimits | None
) -> str | None:
    """Why the setting is at the memory wall, in words, or None."""
    if is_memory_reason(pruned_reason):
        return f"pruned ({pruned_reason})"
    if pruned_reason == "memory_wall":
        return "at least as large as a setting that did not fit"
    if pruned_reason == "memory_model":
        return "the memory model puts its peak over the limit"
    if limits is not None:
        for name, key, limit in (
            ("host memory", "peak_host_memory_bytes", limits.host_bytes),
            ("/dev/shm", "peak_shm_bytes", limits.shm_bytes),
            ("GPU memory", "peak_gpu_memory_bytes", limits.gpu_bytes),
        ):
            peak = attrs.get(key)
            if peak is not None and limit and peak >= MEMORY_NEAR_LIMIT_FRACTION * limit:
                return f"{name} peaked at {peak / limit:.0%} of its limit"
    total = (
        limits.machine_total_bytes
        if limits is not None
        else (attrs.get("machine") or {}).get("memory_bytes")
    )
    available = attrs.get("available_memory_bytes_min")
    if total and available is not None and available < LOW_AVAILABLE_FRACTION * total:
        return f"only {available / total:.1%} of the machine's memory stayed available"
    growth = attrs.get("swap_used_bytes_growth")
    if growth is not None and growth >= SWAP_GROWTH_BYTES:
        return f"swap grew by {growth / 2**20:,.0f} MiB"
    return None


def _every_batch_has_a_worker(attrs: Mapping[str, Any]) -> bool:
    settings = attrs.get(SETTINGS_ATTR) or {}
    workers, batches = settings.get("num_workers"), attrs.get("epoch_batches")
    return bool(workers and batches and workers >= batches)


def _input_advice(attrs: Mapping[str, Any]) -> str:
    """More workers, or where each of the epoch's batches has a worker already, smaller batches."""
    workers = (attrs.get(SETTINGS_ATTR) or {}).get("num_workers")
    if _every_batch_has_a_worker(attrs):
        return (
            f"each of the epoch's {attrs['epoch_batches']} batches already has a worker "
            f"(num_workers {workers}): lower batch_size, so the workers fetch more, smaller "
            "batches at once"
        )
    now = f" (now {workers})" if workers is not None else ""
    return f"raise num_workers{now} or prefetch_factor"


def _input_bound(attrs: Mapping[str, Any], advice: str) -> Diagnosis:
    wait, cpu = float(attrs["data_wait_fraction"]), attrs.get("cpu_percent_mean")
    room = f" while the CPUs are {float(cpu):.0f}% busy" if cpu is not None else ""
    waits = f"the loop waits for data {wait:.0%} of the time{room}"
    return Diagnosis("input-bound", f"{waits}: {advice}")


def diagnose(
    summary: TelemetrySummary | Mapping[str, Any],
    pruned_reason: str | None = None,
    limits: GuardLimits | None = None,
) -> Diagnosis | None:
    """Classify a trial from its recorded numbers (its user attrs); see the module's rules.

    ``summary`` holds the telemetry summary and, where the trial has them, ``data_wait_fraction``,
    ``efficiency``, the ``peak_*_bytes`` peaks, ``settings`` and ``machine``. ``limits`` are the
    guard's (without them, only MemAvailable against the machine's memory and swap are judged).
    """
    attrs: Mapping[str, Any] = summary
    trouble = _memory_trouble(attrs, pruned_reason, limits)
    if trouble is not None:
        return Diagnosis("memory-bound", f"{trouble}: {_MEMORY_ADVICE}")
    wait = attrs.get("data_wait_fraction")
    if wait is None:
        return None
    wait = float(wait)
    efficiency = attrs.get("efficiency")
    if efficiency is not None and float(efficiency) >= CEILING_FRACTION:
        return Diagnosis(
            "compute-bound",
            f"at {float(efficiency):.0%} of the ceiling: no DataLoader setting is faster; "
            "only batch_size or the model change throughput",
        )
    if wait < INPUT_WAIT_FRACTION:
        return Diagnosis(
            "compute-bound",
            f"data is ready {1 - wait:.0%} of the time: the step is the limit; "
            "only batch_size or the model change throughput",
        )
    iowait = attrs.get("iowait_percent_mean")
    if iowait is not None and float(iowait) >= IOWAIT_PERCENT:
        return Diagnosis(
            "io-bound",
            f"the loop waits for data {wait:.0%} of the time and iowait is {float(iowait):.0f}% "
            "of CPU time: use faster storage, cache decoded samples, or a RAM disk",
        )
    cpu = attrs.get("cpu_percent_mean")
    if cpu is not None and float(cpu) >= CPU_SATURATED_PERCENT:
        return Diagnosis(
            "cpu-bound",
            f"the loop waits for data {wait:.0%} of the time with every core busy "
            f"({float(cpu):.0f}%): more workers will not help; make the transforms cheaper "
            "or cache their output",
        )
    return _input_bound(attrs, _input_advice(attrs))


def diagnose_trial(trial: FrozenTrial, limits: GuardLimits | None = None) -> Diagnosis | None:
    """The diagnosis a trial recorded (``bottleneck``/``advice``), else one made from its attrs."""
    attrs = trial.user_attrs
    if attrs.get("bottleneck") in BOTTLENECKS:
        return Diagnosis(attrs["bottleneck"], str(attrs.get("advice", "")))
    return diagnose(attrs, attrs.get("pruned_reason"), limits)


def more_workers_were_slower(
    trial: FrozenTrial, diagnosis: Diagnosis, rival: FrozenTrial, share: float
) -> Diagnosis:
    """``trial``'s diagnosis where its study measured ``rival``, with more workers, at ``share``
    of ``trial``'s samples/sec.

    One trial's numbers advise more workers whenever the loop waits with CPUs to spare; where
    the study has measured more and found them slower (the workers' CPU time and IPC compete
    with the step on few cores), that advice would send the user back to a setting it rejected.
    """
    attrs = trial.user_attrs
    if (
        diagnosis.bottleneck != "input-bound"
        or attrs.get("data_wait_fraction") is None
        or _every_batch_has_a_worker(attrs)
    ):
        return diagnosis
    workers = (attrs.get(SETTINGS_ATTR) or {}).get("num_workers")
    more = (rival.user_attrs.get(SETTINGS_ATTR) or {}).get("num_workers")
    return _input_bound(
        attrs,
        f"more workers were slower here (trial {rival.number}, num_workers {more}, the fastest "
        f"of them: {share:.0%} of this), as their CPU time competes with the step; keep "
        f"num_workers {workers} and make each sample cheaper (decoding, transforms, a cache)",
    )
