"""A workload from the DataLoader a user already trains with, so no Dataset or step is rewritten.

What the tuner searches (batch size, workers, prefetch, pinning, persistence) is taken as the
``pytorch-default`` baseline: "what you train with today". What it does not search is kept as
it is: the dataset, the collate function, the sampler, ``drop_last`` and the worker init.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    default_collate,
)

from objectives._workload import TrainStep, Workload

__all__ = ["workload_from_dataloader"]

DEFAULT_BATCH_SIZE_RANGE = (8, 512)
"""The search's batch sizes, widened to take in the user's own batch size."""


def workload_from_dataloader(
    loader: DataLoader,
    step: Callable[[Any, torch.device], Any] | None = None,
    *,
    make_step: Callable[[torch.device], TrainStep] | None = None,
    name: str = "dataloader",
    batch_size_range: tuple[int, int] | None = None,
    description: str = "",
) -> Workload:
    """See :meth:`Workload.from_dataloader`; a :class:`ValueError` (one line) where the tuner
    cannot size the loader's batches."""
    if not isinstance(loader, DataLoader):
        raise ValueError(f"expected a torch DataLoader, got {type(loader).__name__}")
    batch = loader.batch_size
    if batch is None:
        raise ValueError(
            "the DataLoader has a batch_sampler of its own, which the tuner cannot size; "
            "give Workload(batch_sampler=factory) instead (see objectives.text)"
        )
    if not isinstance(loader.batch_sampler, BatchSampler) and not isinstance(
        loader.dataset, IterableDataset
    ):
        raise ValueError("the DataLoader's batch_sampler is not torch's BatchSampler")
    low, high = DEFAULT_BATCH_SIZE_RANGE
    workers = loader.num_workers
    return Workload(
        name=name,
        dataset=loader.dataset,
        collate_fn=None if loader.collate_fn is default_collate else loader.collate_fn,
        step=step,
        make_step=make_step,
        default_batch_size=batch,
        batch_size_range=batch_size_range or (min(low, batch), max(high, batch)),
        sampler=_kept_sampler(loader),
        drop_last=loader.drop_last,
        worker_init_fn=loader.worker_init_fn,
        current={
            "num_workers": workers,
            "prefetch_factor": loader.prefetch_factor if workers else None,
            "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers if workers else False,
        },
        description=description or f"{name}: {type(loader.dataset).__name__}, batch {batch}",
    )


def _kept_sampler(loader: DataLoader) -> Any:
    """The loader's sampler, but None for a plain ``shuffle=True`` one (the tuner shuffles the
    same way, with each trial's seed) and for an iterable dataset (it has none)."""
    if isinstance(loader.dataset, IterableDataset):
        return None
    sampler = loader.sampler
    plain_shuffle = (
        type(sampler) is RandomSampler
        and not sampler.replacement
        and sampler.num_samples == len(sampler.data_source)
        and sampler.generator is None
    )
    return None if plain_shuffle else sampler
