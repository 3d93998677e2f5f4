"""Real DataLoaders with real worker processes, as a trial builds them."""

from __future__ import annotations

import itertools
from typing import Any

from torch.utils.data import DataLoader

from objectives import Workload

CONTEXTS = ("fork", "spawn")


def worker_batches(
    workload: Workload, batch_value: int, context: str, batches: int | None = None
) -> list[Any]:
    """Up to ``batches`` batches (all when None) from two ``context`` workers."""
    if workload.batch_sampler is not None:
        sizing: dict[str, Any] = {
            "batch_sampler": workload.batch_sampler(workload.dataset, batch_value, 0)
        }
    else:
        sizing = {"batch_size": batch_value, "shuffle": True}
    loader = DataLoader(
        workload.dataset,
        collate_fn=workload.collate_fn,
        num_workers=2,
        multiprocessing_context=context,
        **sizing,
    )
    return list(itertools.islice(loader, batches))
