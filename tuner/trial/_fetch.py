"""Fetching the batches a measurement steps on before it starts: as a main-process DataLoader
fetches and collates them, and in parallel where the samples wait on storage.

The ceiling steps a prepared batch of every size (8 to 512 samples on the built-in workloads):
about a thousand samples fetched one after another before its steps. Where each waits on
storage (the storage workload's 8 ms) that is 8 s of waiting before the ceiling measures
anything. A sample whose fetch
spends most of its time waiting is therefore fetched by up to
:data:`MAX_FETCH_WORKERS` DataLoader worker processes, one sample at a time and in order, then
collated in this process as the loader would: the same samples, the same batches. A fetch that
computes stays serial, so the cores and the memory guard see the same set-up as before.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset, default_collate

from objectives import Workload

__all__ = ["MAX_FETCH_WORKERS", "fetched_batches"]

MAX_FETCH_WORKERS = 8
"""Worker processes for a waiting fetch: 8 ms samples come at about 1 ms each; each worker is a
short-lived fork of the measuring process (a few dozen MiB the guard sees while it lives)."""

WAIT_SHARE = 0.5
"""A sample whose fetch spends more than this share of its wall time off the CPU waits."""

SERIAL_ENOUGH_S = 0.25
"""Fetching the samples one after another is kept when it takes less than this in all."""


def _only(samples: list[Any]) -> Any:
    """The collate of a one-sample batch that keeps the sample as the dataset returned it."""
    return samples[0]


def _waits(dataset: Dataset[Any], index: int) -> float:
    """One sample's fetch wall time where most of it is spent waiting, else 0."""
    wall, cpu = time.perf_counter(), time.process_time()
    dataset[index]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall if wall - cpu > WAIT_SHARE * wall else 0.0


def _parallel_samples(dataset: Dataset[Any], indices: list[int]) -> list[Any]:
    loader = DataLoader(
        dataset,
        batch_sampler=[[index] for index in indices],
        collate_fn=_only,
        num_workers=min(MAX_FETCH_WORKERS, len(indices)),
    )
    return list(loader)


def fetched_batches(workload: Workload, plan: Sequence[Sequence[int]]) -> list[Any]:
    """The batches of ``plan`` (index lists) as a main-process DataLoader fetches and collates
    them (the dataset's ``__getitems__`` where it has one, unless its samples wait)."""
    collate = workload.collate_fn or default_collate
    indices = [index for batch in plan for index in batch]
    if indices and _waits(workload.dataset, indices[0]) * len(indices) > SERIAL_ENOUGH_S:
        samples = iter(_parallel_samples(workload.dataset, indices))
        return [collate([next(samples) for _ in batch]) for batch in plan]
    loader = DataLoader(
        workload.dataset,
        batch_sampler=[list(batch) for batch in plan],
        collate_fn=collate,
        num_workers=0,
    )
    return list(loader)
