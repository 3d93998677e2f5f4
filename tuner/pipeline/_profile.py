"""The pipeline profile: what one sample, one batch and one step cost on this machine, in seconds.

Measured once per study, before any trial is sampled, and stored as the study user attr
``pipeline_profile`` (:func:`stored_profile` reads it, :func:`store_profile` writes it; nobody
else touches the key). Two measurements make it:

* :func:`tuner.trial._pipeline.measure_pipeline`, in a trial child (mode ``pipeline``): one
  process started as a DataLoader worker is (the platform's start method, one intra-op thread)
  fetches samples of a few batches, timing each ``dataset[i]`` on the wall clock and on the
  process's CPU clock, then collates each batch and pickles it as a worker hands it to the main
  process (tensors into shared memory); after the samples it reads its own USS and PSS. The
  child then times the batch's copy to the device, and runs a real two-worker DataLoader for a
  second to count the CPU it spends per sample (queues, shared memory, bookkeeping included).
  A fetch whose wall time exceeds its CPU time waits (storage, network, sleeps): that share is
  what lets workers outnumber the cores.
* the step's rate per batch size and thread count is the ceiling measurement's
  (:func:`tuner.trial._ceiling.measure_step_rates`), not measured twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = [
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


@dataclasses.dataclass(frozen=True)
class PipelineProfile:
    """Per-sample and per-step costs of one workload on one machine (seconds, bytes).

    ``fetch_runqueue_s`` is the part of ``fetch_wall_s`` the worker spent runnable but queued
    for a CPU (``/proc/thread-self/schedstat``): load, not I/O. ``collate_s``, ``ipc_dump_s``,
    ``ipc_load_s`` and ``transfer_s`` are per sample (a batch's cost over its samples);
    ``loader_main_cpu_s`` and ``loader_worker_cpu_s`` are the CPU seconds per sample a real
    two-worker DataLoader spent without a step, in its main process and in its workers
    (everything included); ``step_rates`` and ``step_cpu_s`` are per thread count and batch
    value; ``samples_per_batch`` maps each batch value to its samples (a token budget packs a
    varying number).
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

    def to_attrs(self) -> dict[str, Any]:
        """JSON-safe (mapping keys as text, as a study attr stores them)."""
        attrs = dataclasses.asdict(self)
        attrs["samples_per_batch"] = {str(k): v for k, v in self.samples_per_batch.items()}
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
        return cls(**values)


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
