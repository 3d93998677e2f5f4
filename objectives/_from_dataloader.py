"""What a DataLoader a user already trains with gives a workload (``Workload.from_dataloader``).

What the tuner searches (batch size, workers, prefetch, pinning, persistence) is taken as the
``pytorch-default`` baseline: "what you train with today". What it does not search is kept as
it is: the dataset, the collate function, the sampler, ``drop_last`` and the worker init.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    default_collate,
)

__all__ = ["dataloader_fields", "trained_today", "widened_range"]

DEFAULT_BATCH_SIZE_RANGE = (8, 512)
"""The search's batch sizes, widened to take in the user's own batch size."""


def widened_range(batch: int) -> tuple[int, int]:
    """The default batch range, widened to take in ``batch``."""
    low, high = DEFAULT_BATCH_SIZE_RANGE
    return min(low, batch), max(high, batch)


def dataloader_fields(loader: DataLoader) -> dict[str, Any]:
    """The :class:`Workload` fields a DataLoader gives; a one-line :class:`ValueError` where
    the tuner cannot size its batches."""
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
    return {
        "dataset": loader.dataset,
        "collate_fn": None if loader.collate_fn is default_collate else loader.collate_fn,
        "default_batch_size": batch,
        "sampler": _kept_sampler(loader),
        "drop_last": loader.drop_last,
        "worker_init_fn": loader.worker_init_fn,
        "current": trained_today(
            loader.num_workers, loader.prefetch_factor, loader.pin_memory, loader.persistent_workers
        ),
    }


def trained_today(
    num_workers: int, prefetch_factor: int | None, pin_memory: bool, persistent_workers: bool
) -> dict[str, Any]:
    """``Workload.current``: the worker settings trained with today, prefetch and persistence
    only with workers (as PyTorch takes them)."""
    return {
        "num_workers": num_workers,
        "prefetch_factor": prefetch_factor if num_workers else None,
        "pin_memory": bool(pin_memory),
        "persistent_workers": bool(persistent_workers) if num_workers else False,
    }


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
