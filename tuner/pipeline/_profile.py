"""The pipeline profile: what one sample, one batch and one step cost on this machine, in seconds.

Measured once per study, before any trial is sampled, and stored as the study user attr
``pipeline_profile`` (:func:`stored_profile` reads it, :func:`store_profile` writes it; nobody
else touches the key). Two measurements make it:

* :func:`tuner.trial._pipeline.measure_pipeline`, in a trial child (mode ``pipeline``): one
  process started as a DataLoader worker is (the platform's start method, one intra-op thread)
  fetches samples of a few batches, timing each ``dataset[i]`` on the wall clock and on the
  process's CPU clock, then collates each batch and pickles it as a worker hands it to the main
  process (tensors into shared memory); after the samples it reads its own USS and PSS. The
  child then times the batch's copy to the device, and runs a real DataLoader (two workers, one
  where two do not fit the limit) for a second to count the CPU it spends per sample (queues,
  shared memory, bookkeeping included) and what each forked worker adds to the tree's PSS.
  A fetch whose wall time exceeds its CPU time waits (storage, network, sleeps): that share is
  what lets workers outnumber the cores.
* the step's rate per batch size and thread count is the ceiling measurement's
  (:func:`tuner.trial._ceiling.measure_step_rates`), not measured twice.

A workload knob changes what a sample costs (image's ``collate=uint8`` moves the float
conversion from the workers to the step and ships a quarter of the bytes), so each other value
of each knob is profiled too, one knob at a time: its :data:`KNOB_COST_FIELDS` and its step's
time against the base knobs' at the profiled batch (``knob_costs``);
:meth:`PipelineProfile.for_knobs` gives the profile of any knob set.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "KNOB_COST_FIELDS",
    "PROFILE_ATTR",
    "PipelineProfile",
    "RateTable",
    "store_profile",
    "stored_profile",
]

PROFILE_ATTR = "pipeline_profile"
"""Study user attr: the :class:`PipelineProfile` as a JSON-safe dict."""

RateTable = Mapping[int, Mapping[int, float]]
"""``threads -> batch -> value``: the step's samples/s (or CPU seconds per sample) per setting."""

KNOB_COST_FIELDS = (
    "fetch_wall_s",
    "fetch_cpu_s",
    "fetch_runqueue_s",
    "collate_s",
    "ipc_dump_s",
    "ipc_load_s",
    "transfer_s",
    "sample_bytes",
    "loader_main_cpu_s",
    "loader_worker_cpu_s",
)
"""The profile's figures a knob value has its own of (the rest are the machine's or the step's)."""

STEP_TIME_RATIO = "step_time_ratio"
"""In a knob's costs: its step's time per sample over the base knobs' (same batch, 1 thread)."""


def knob_key(name: str, value: Any) -> str:
    """How ``knob_costs`` names one knob value (text: a study attr's keys are)."""
    return f"{name}={value!r}"


@dataclasses.dataclass(frozen=True)
class PipelineProfile:
    """Per-sample and per-step costs of one workload on one machine (seconds, bytes).

    ``fetch_runqueue_s`` is the part of ``fetch_wall_s`` the worker spent runnable but queued
    for a CPU (``/proc/thread-self/schedstat``): load, not I/O. ``collate_s``, ``ipc_dump_s``,
    ``ipc_load_s`` and ``transfer_s`` are per sample (a batch's cost over its samples);
    ``loader_main_cpu_s`` and ``loader_worker_cpu_s`` are the CPU seconds per sample a real
    DataLoader (``loader_workers``) spent without a step, in its main process and in its workers
    (everything included); ``step_rates`` and ``step_cpu_s`` are per thread count and batch
    value; ``samples_per_batch`` maps each batch value to its samples (a token budget packs a
    varying number). ``knob_costs`` holds, per other knob value (:func:`knob_key`), its own
    :data:`KNOB_COST_FIELDS` and ``step_time_ratio``; the rest are the base knobs'.
    """

    fetch_wall_s: float
    fetch_cpu_s: float
    collate_s: float
    ipc_dump_s: float
    ipc_load_s: float
    transfer_s: float
    worker_start_s: float
    worker_uss_bytes: int
    worker_pss_bytes: int
    sample_bytes: float
    samples_per_batch: Mapping[int, float]
    usable_cores: float
    step_rates: RateTable
    step_cpu_s: RateTable
    profiled_batch: int
    measured_samples: int
    dataset_samples: int
    loader_main_cpu_s: float = 0.0
    loader_worker_cpu_s: float = 0.0
    fetch_runqueue_s: float = 0.0
    knob_costs: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    worker_fork_bytes: float = 0.0
    """What one forked DataLoader worker adds to the tree's PSS (the real loader's)."""
    loader_workers: int = 2
    """The workers of the real loader the ``loader_*`` figures come from (prefetch 2)."""
    step_peak_bytes: Mapping[int, float] = dataclasses.field(default_factory=dict)
    """Per batch value: the main process's peak with the step and no workers (the ceiling's)."""
    fetch_burst_s: float | None = None
    """The most one profiled batch's fetch took over its samples' share of the mean (seconds,
    the run-queue wait left out): how uneven the fetch is, which a deeper prefetch queue can
    absorb. None in a profile measured without it."""
    ranks: int = 1
    """Training processes per node (torchrun's ``--nproc-per-node``), each with its own
    DataLoader: they share ``usable_cores`` (:attr:`cores_per_rank`)."""

    @property
    def cores_per_rank(self) -> float:
        """The usable cores one rank's loader and step may count on: ``usable_cores / ranks``."""
        return self.usable_cores / max(1, self.ranks)

    @property
    def io_wait_share(self) -> float:
        """The share of a fetch spent waiting on I/O: neither computing nor queued for a CPU."""
        if self.fetch_wall_s <= 0:
            return 0.0
        busy = self.fetch_cpu_s + self.fetch_runqueue_s
        return max(0.0, min(1.0, 1.0 - busy / self.fetch_wall_s))

    @property
    def fetch_alone_s(self) -> float:
        """A fetch's wall time without the run-queue wait other work on the machine caused."""
        return max(self.fetch_cpu_s, self.fetch_wall_s - self.fetch_runqueue_s)

    def for_knobs(self, knobs: Mapping[str, Any]) -> PipelineProfile:
        """The profile of ``knobs``: each profiled knob value's change from the base added to
        the base's costs (its step time ratio multiplied), unprofiled values as the base."""
        changes = [
            self.knob_costs[key]
            for key in map(knob_key, knobs, knobs.values())
            if key in self.knob_costs
        ]
        if not changes:
            return self
        fields = {}
        for name in KNOB_COST_FIELDS:
            base = getattr(self, name)
            fields[name] = max(0.0, base + sum(change[name] - base for change in changes))
        ratio = math.prod(c.get(STEP_TIME_RATIO, 1.0) for c in changes)
        return dataclasses.replace(
            self,
            **fields,
            step_rates=_scaled(self.step_rates, 1 / ratio),
            step_cpu_s=_scaled(self.step_cpu_s, ratio),
            knob_costs={},
        )

    def to_attrs(self) -> dict[str, Any]:
        """JSON-safe (mapping keys as text, as a study attr stores them)."""
        attrs = dataclasses.asdict(self)
        attrs["samples_per_batch"] = {str(k): v for k, v in self.samples_per_batch.items()}
        attrs["step_peak_bytes"] = {str(k): v for k, v in self.step_peak_bytes.items()}
        for name in ("step_rates", "step_cpu_s"):
            table = getattr(self, name)
            attrs[name] = {str(t): {str(b): v for b, v in row.items()} for t, row in table.items()}
        return attrs

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> PipelineProfile:
        values = {f.name: attrs[f.name] for f in dataclasses.fields(cls) if f.name in attrs}
        values["samples_per_batch"] = {
            int(k): float(v) for k, v in attrs["samples_per_batch"].items()
        }
        for name in ("step_rates", "step_cpu_s"):
            values[name] = {
                int(t): {int(b): float(v) for b, v in row.items()} for t, row in attrs[name].items()
            }
        values["step_peak_bytes"] = {
            int(k): float(v) for k, v in attrs.get("step_peak_bytes", {}).items()
        }
        values["knob_costs"] = {
            str(key): {str(name): float(v) for name, v in costs.items()}
            for key, costs in attrs.get("knob_costs", {}).items()
        }
        return cls(**values)


def _scaled(table: RateTable, factor: float) -> dict[int, dict[int, float]]:
    return {t: {b: v * factor for b, v in row.items()} for t, row in table.items()}


def stored_profile(user_attrs: Mapping[str, Any]) -> PipelineProfile | None:
    """The study's profile from its user attrs, or None (not measured, or an older study)."""
    attrs = user_attrs.get(PROFILE_ATTR)
    if not isinstance(attrs, Mapping):
        return None
    try:
        return PipelineProfile.from_attrs(attrs)
    except (KeyError, TypeError, ValueError):
        return None


def store_profile(study: Any, profile: PipelineProfile) -> None:
    """Write the profile to ``study``'s user attrs; the caller holds the study lock."""
    study.set_user_attr(PROFILE_ATTR, profile.to_attrs())
