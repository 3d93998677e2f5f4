"""What the study process and a trial child say to each other: one job in, typed messages out.

As ``torch/utils/data/_utils/worker.py`` does with ``_ResumeIteration`` and ``ExceptionWrapper``,
every message is a small frozen dataclass, and the supervisor dispatches on its type. The job
travels once, pickled, as the child's start argument; the messages travel over a one-way pipe:
any number of :class:`Progress` (while measuring) and :class:`Fits` (while probing), then
exactly one :class:`Result` or :class:`Failure`. A child that ends without either has died, and
the supervisor classifies its exit instead.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from tuner.search import LoaderSettings

__all__ = ["Failure", "Fits", "Job", "Message", "Mode", "Progress", "Result"]


class Mode(enum.Enum):
    """What a trial child does with its setting."""

    MEASURE = "measure"
    """The training loop's samples/sec over a window (a trial, a re-measurement)."""
    PROBE = "probe"
    """A couple of steps at each of ``Job.batches`` in turn: which batch values fit."""
    CEILING = "ceiling"
    """The step alone on prepared batches, over ``Job.batches`` and ``Job.threads``."""
    PIPELINE = "pipeline"
    """The pipeline profile's measured part: fetch, collate, IPC, transfer, worker memory."""


@dataclasses.dataclass(frozen=True)
class Job:
    """One child's whole assignment; complete at construction, never patched by the child."""

    mode: Mode
    objective: str
    """``image``, ``text``, ``pkg.module:attr`` or an absolute ``path/to/file.py:attr``."""
    options: Mapping[str, Any]
    settings: LoaderSettings
    device: str
    window_s: float = 0.0
    warmup_s: float = 0.0
    seed: int = 0
    batches: tuple[int, ...] = ()
    threads: tuple[int, ...] = ()
    budget_s: float = 0.0
    """The pipeline profile's time budget per measurement."""
    knob_variants: tuple[tuple[str, Any], ...] = ()
    """The pipeline profile's other knob values ``(knob, value)``, each profiled on its own."""
    loader_workers: int = 2
    """The pipeline profile's real DataLoader: its workers (CPU per sample, a worker's memory)."""
    cwd: str | None = None
    """The study's working directory, so relative paths in a workload mean the same there."""
    sys_path: tuple[str, ...] = ()
    """The study's ``sys.path``, so ``module:attr`` objectives import in the child as here."""
    nproc_per_node: int = 1
    """Ranks a measurement runs in, as ``torchrun --nproc-per-node`` (:mod:`tuner.trial._ranks`);
    the other modes run one process."""

    def replace(self, **changes: Any) -> Job:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Throughput so far in the window, every half second: for the pruner and partial results."""

    elapsed_s: float
    samples_per_sec: float
    data_wait_fraction: float


@dataclasses.dataclass(frozen=True)
class Fits:
    """The probe ran this batch value without the guard stopping it."""

    batch: int
    peak_bytes: int | None = None
    """The child's peak so far (:func:`~tuner.machine._process.own_peak_memory_bytes`, from the
    kernel's high-water mark): a peak that rose and fell between two of the guard's readings
    shows here, so the parent can tell that the batch did not fit after all."""


@dataclasses.dataclass(frozen=True)
class Result:
    """The child's measurement, as the trial's user attrs."""

    attrs: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Failure:
    """What the workload raised: ``reason`` set when it is a known way to die (a prune)."""

    error: str
    reason: str | None = None


Message = Progress | Fits | Result | Failure
