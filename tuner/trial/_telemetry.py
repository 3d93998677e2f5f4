"""Telemetry of one trial: what the machine and the training loop did while it was measured.

Two halves, two processes:

* :class:`TelemetrySampler` runs in the study process. The supervisor calls
  :meth:`TelemetrySampler.sample` once per guard tick (every 0.2 s); each call is non-blocking
  (it reads ``/proc`` counters and takes deltas against the previous call, never
  ``psutil.cpu_percent(interval=...)``, which sleeps, nor its module-global state, which other
  callers would disturb). It records CPU busy and iowait shares overall and per usable core,
  MemAvailable, swap used, and GPU utilisation and memory through a
  :class:`~tuner.machine.GpuReader`.
* :class:`StepTimeline` runs in the trial child, inside the measurement loop: per step, the time
  spent waiting for the next batch and the time spent in the step. It keeps at most
  ``max_points`` rows by merging neighbours, so a loop of a million tiny steps sends a small
  message.

:func:`collect_trial_telemetry` joins both after a trial: compact user attrs (means, peaks) and
two CSV texts for the trial's artifacts (``telemetry.csv``, ``steps.csv``).

Clocks: the sampler's ``now`` and the child's ``window_started_at`` are ``time.monotonic()``,
one system-wide clock on Linux (CLOCK_MONOTONIC), so the window the child measured selects the
samples taken during it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Sequence
from typing import Any, TypedDict

import psutil

from tuner.machine import CpuLoad, GpuReader, swap_used_bytes

__all__ = [
    "STEPS_CSV",
    "TELEMETRY_CSV",
    "StepTimeline",
    "TelemetrySampler",
    "TelemetrySummary",
    "TrialTelemetry",
    "collect_trial_telemetry",
    "read_timeline_csv",
    "timeline_csv",
    "timeline_summary",
]

TELEMETRY_CSV = "telemetry.csv"
"""Artifact name of a trial's machine time series."""

STEPS_CSV = "steps.csv"
"""Artifact name of a trial's per-step timeline (data wait against step time)."""

TIMELINE_ATTR = "timeline"
"""Result attr from the child: rows ``[t_s, steps, data_wait_s, step_s]`` (see StepTimeline)."""

WINDOW_STARTED_ATTR = "window_started_at"
"""Result attr from the child: ``time.monotonic()`` when the measured window began."""


class TelemetrySummary(TypedDict, total=False):
    """The compact user attrs of a trial's telemetry; keys are absent where nothing was read."""

    cpu_percent_mean: float
    cpu_percent_peak: float
    cpu_percent_per_core_mean: list[float]
    iowait_percent_mean: float
    iowait_percent_peak: float
    available_memory_bytes_min: int
    swap_used_bytes_peak: int
    swap_used_bytes_growth: int
    gpu_utilization_percent_mean: float
    gpu_utilization_percent_peak: float
    gpu_memory_bytes_peak: int
    telemetry_samples: int
    data_wait_s_mean: float
    data_wait_s_peak: float
    step_s_mean: float


@dataclasses.dataclass(frozen=True)
class _Sample:
    """One reading; its CPU shares cover ``(covers_from, at]``."""

    covers_from: float
    at: float
    cpu_percent: float | None
    iowait_percent: float | None
    core_percents: tuple[float, ...]
    available_memory_bytes: int
    swap_used_bytes: int | None
    gpu_utilization_percent: float | None
    gpu_memory_bytes: int | None


class TelemetrySampler:
    """Samples the machine once per call; one instance per trial, used from one thread.

    ``gpu_index`` selects the trial's device among the reader's; ``None`` reads the first one.
    """

    def __init__(self, gpu: GpuReader | None = None, gpu_index: int | None = None) -> None:
        self._gpu = gpu if gpu is not None and gpu.available else None
        self._gpu_index = gpu_index
        self._samples: list[_Sample] = []
        self._cpu_load: CpuLoad | None = None
        self._started_at: float | None = None

    def start(self, now: float) -> None:
        """Begin a trial: forget earlier samples and take the first CPU counters."""
        self._samples = []
        self._started_at = now
        self._cpu_load = CpuLoad()

    def _gpu_reading(self) -> tuple[float | None, int | None]:
        if self._gpu is None:
            return None, None
        readings = self._gpu.read()
        chosen = [r for r in readings if self._gpu_index is None or r.index == self._gpu_index]
        if not chosen:
            return None, None
        return chosen[0].utilization_percent, chosen[0].memory_used_bytes

    def _cpu(self) -> tuple[float | None, float | None, tuple[float, ...]]:
        shares = self._cpu_load.read() if self._cpu_load is not None else None
        if shares is None:
            return None, None, ()
        return shares

    def sample(self, now: float) -> None:
        """Record one reading at ``now`` (``time.monotonic()``); cheap, never sleeps."""
        if self._started_at is None:
            self.start(now)
            return
        cpu, iowait, cores = self._cpu()
        utilization, gpu_memory = self._gpu_reading()
        covers_from = self._samples[-1].at if self._samples else self._started_at
        self._samples.append(
            _Sample(
                covers_from=covers_from,
                at=now,
                cpu_percent=cpu,
                iowait_percent=iowait,
                core_percents=cores,
                available_memory_bytes=int(psutil.virtual_memory().available),
                swap_used_bytes=swap_used_bytes(),
                gpu_utilization_percent=utilization,
                gpu_memory_bytes=gpu_memory,
            )
        )

    def _window(self, since: float | None, until: float | None) -> list[_Sample]:
        """The samples of ``[since, until]``; all of them when the window is unknown or empty."""
        chosen = [s for s in self._samples if _inside(s, since, until)]
        return chosen or list(self._samples)

    def summary(self, since: float | None = None, until: float | None = None) -> TelemetrySummary:
        """Means and peaks over the window (``time.monotonic()`` bounds), as user attrs."""
        samples = self._window(since, until)
        result: TelemetrySummary = {"telemetry_samples": len(samples)}
        cpu = [s.cpu_percent for s in samples if s.cpu_percent is not None]
        if cpu:
            result["cpu_percent_mean"] = round(_mean(cpu), 2)
            result["cpu_percent_peak"] = round(max(cpu), 2)
        cores = [s.core_percents for s in samples if s.core_percents]
        width = min((len(c) for c in cores), default=0)
        if width:
            result["cpu_percent_per_core_mean"] = [
                round(_mean([c[i] for c in cores]), 2) for i in range(width)
            ]
        iowait = [s.iowait_percent for s in samples if s.iowait_percent is not None]
        if iowait:
            result["iowait_percent_mean"] = round(_mean(iowait), 2)
            result["iowait_percent_peak"] = round(max(iowait), 2)
        if samples:
            result["available_memory_bytes_min"] = min(s.available_memory_bytes for s in samples)
        swap = [s.swap_used_bytes for s in samples if s.swap_used_bytes is not None]
        if swap:
            result["swap_used_bytes_peak"] = max(swap)
            result["swap_used_bytes_growth"] = max(0, max(swap) - swap[0])
        utilization = [
            s.gpu_utilization_percent for s in samples if s.gpu_utilization_percent is not None
        ]
        if utilization:
            result["gpu_utilization_percent_mean"] = round(_mean(utilization), 2)
            result["gpu_utilization_percent_peak"] = round(max(utilization), 2)
        gpu_memory = [s.gpu_memory_bytes for s in samples if s.gpu_memory_bytes is not None]
        if gpu_memory:
            result["gpu_memory_bytes_peak"] = max(gpu_memory)
        return result

    def to_csv(self, since: float | None = None, until: float | None = None) -> str:
        """Every sample as CSV; ``t_s`` from the trial's start, ``in_window`` 1 inside it."""
        origin = self._started_at or 0.0
        width = max((len(s.core_percents) for s in self._samples), default=0)
        cores = self._cpu_load.cores if self._cpu_load is not None else None
        labels = cores if cores is not None else list(range(width))
        core_columns = [f"cpu{labels[i] if i < len(labels) else i}_percent" for i in range(width)]
        header = [
            "t_s",
            "in_window",
            "cpu_percent",
            "iowait_percent",
            *core_columns,
            "available_memory_bytes",
            "swap_used_bytes",
            "gpu_utilization_percent",
            "gpu_memory_bytes",
        ]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        for s in self._samples:
            inside = _inside(s, since, until)
            cores = [f"{c:.1f}" for c in s.core_percents] + [""] * (width - len(s.core_percents))
            writer.writerow(
                [
                    f"{s.at - origin:.3f}",
                    int(inside),
                    _text(s.cpu_percent, "{:.1f}"),
                    _text(s.iowait_percent, "{:.1f}"),
                    *cores,
                    s.available_memory_bytes,
                    _text(s.swap_used_bytes),
                    _text(s.gpu_utilization_percent, "{:.1f}"),
                    _text(s.gpu_memory_bytes),
                ]
            )
        return out.getvalue()


class StepTimeline:
    """Per-step data wait and step time in the child's measured window, at bounded size.

    ``data_wait_s`` is the time in ``next(iterator)``; ``step_s`` is the rest of the iteration
    (moving the batch, the step, the optimizer), so the two add up to the window. Once
    ``max_points`` rows are held, neighbours are merged pairwise (their sums kept, ``steps``
    counting the steps in a row), so a long window keeps its shape at coarser resolution.
    """

    def __init__(self, max_points: int = 600) -> None:
        self.max_points = max(2, max_points)
        self._rows: list[list[float]] = []
        self._steps_per_row = 1
        self._pending: list[float] | None = None

    def add(self, t_s: float, data_wait_s: float, step_s: float) -> None:
        """One step that began ``t_s`` after the window's start."""
        if self._pending is None:
            self._pending = [t_s, 0, 0.0, 0.0]
        self._pending[1] += 1
        self._pending[2] += data_wait_s
        self._pending[3] += step_s
        if self._pending[1] >= self._steps_per_row:
            self._rows.append(self._pending)
            self._pending = None
            if len(self._rows) >= self.max_points:
                self._merge()

    def _merge(self) -> None:
        merged = []
        for i in range(0, len(self._rows) - 1, 2):
            first, second = self._rows[i], self._rows[i + 1]
            merged.append([first[0], *(a + b for a, b in zip(first[1:], second[1:], strict=True))])
        if len(self._rows) % 2:
            self._pending = self._rows[-1]
        self._rows = merged
        self._steps_per_row *= 2

    def rows(self) -> list[list[float]]:
        """``[t_s, steps, data_wait_s, step_s]`` rows, JSON-safe, for the result message."""
        rows = self._rows + ([self._pending] if self._pending is not None else [])
        return [[round(r[0], 6), int(r[1]), round(r[2], 9), round(r[3], 9)] for r in rows]


def timeline_csv(rows: Sequence[Sequence[float]]) -> str:
    """The per-step timeline as CSV: ``t_s,steps,data_wait_s,step_s`` (sums over ``steps``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["t_s", "steps", "data_wait_s", "step_s"])
    for t_s, steps, wait_s, step_s in rows:
        writer.writerow([f"{t_s:.6f}", int(steps), f"{wait_s:.9f}", f"{step_s:.9f}"])
    return out.getvalue()


def read_timeline_csv(text: str) -> list[list[float]]:
    """Inverse of :func:`timeline_csv`."""
    reader = csv.DictReader(io.StringIO(text))
    return [
        [float(r["t_s"]), int(r["steps"]), float(r["data_wait_s"]), float(r["step_s"])]
        for r in reader
    ]


def timeline_summary(rows: Sequence[Sequence[float]]) -> TelemetrySummary:
    """Per-step means (and the worst row's mean wait) of a timeline, as user attrs."""
    steps = sum(int(r[1]) for r in rows)
    if not steps:
        return {}
    return {
        "data_wait_s_mean": sum(r[2] for r in rows) / steps,
        "data_wait_s_peak": max(r[2] / r[1] for r in rows if r[1]),
        "step_s_mean": sum(r[3] for r in rows) / steps,
    }


@dataclasses.dataclass(frozen=True)
class TrialTelemetry:
    """What one trial's telemetry leaves: user attrs, and CSV texts for its artifacts."""

    attrs: dict[str, Any]
    telemetry_csv: str | None
    steps_csv: str | None

    def artifacts(self) -> dict[str, str]:
        """Artifact file name -> text, for the ones there are."""
        named = {TELEMETRY_CSV: self.telemetry_csv, STEPS_CSV: self.steps_csv}
        return {name: text for name, text in named.items() if text}


def collect_trial_telemetry(
    sampler: TelemetrySampler | None, result_attrs: dict[str, Any]
) -> TrialTelemetry:
    """Take the child's timeline out of ``result_attrs`` (in place) and join it with the samples.

    ``result_attrs`` is the trial outcome's attrs: ``timeline`` and ``window_started_at`` are
    popped (too large, or meaningless, as user attrs); ``window_s`` bounds the window.
    """
    rows = result_attrs.pop(TIMELINE_ATTR, None) or []
    since = result_attrs.pop(WINDOW_STARTED_ATTR, None)
    window_s = result_attrs.get("window_s")
    until = since + float(window_s) if since is not None and window_s is not None else None
    attrs: dict[str, Any] = {}
    telemetry_csv = None
    if sampler is not None:
        attrs.update(sampler.summary(since, until))
        telemetry_csv = sampler.to_csv(since, until)
    attrs.update(timeline_summary(rows))
    return TrialTelemetry(attrs, telemetry_csv, timeline_csv(rows) if rows else None)


def _inside(sample: _Sample, since: float | None, until: float | None) -> bool:
    """Whether the middle of the interval a sample covers lies in the window."""
    middle = (sample.covers_from + sample.at) / 2
    return (since is None or middle >= since) and (until is None or middle <= until)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _text(value: float | int | None, template: str = "{}") -> str:
    return "" if value is None else template.format(value)
