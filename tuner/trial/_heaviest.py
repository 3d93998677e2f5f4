"""The epoch's heaviest batch: the one that sets a training run's peak memory, stepped first.

Where samples differ in length, a batch is padded to its longest sample, and the step's memory
follows the padded shape (attention grows with its square). A window of a few seconds sees a
few dozen batches of the epoch, by chance with or without its longest ones: text's 8,192-token
step measured 536-599 MiB from one window to the next, while training reaches the epoch's
heaviest batch every epoch. So a trial, and the ceiling, step that batch once before they
measure, as Hugging Face's length-grouped sampler puts it first "so that an OOM happens sooner
rather than later": the peak a trial records is the epoch's.

A dataset says its samples' lengths with a ``lengths`` sequence (one per index), which a
token-bucket batch sampler reads too (:func:`objectives.text.token_bucket_sampler`); a dataset
without one is measured as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from objectives import Workload
from tuner.search import LoaderSettings
from tuner.trial._fetch import fetched_batches

__all__ = ["heaviest_batch", "heaviest_indices"]


def _lengths(workload: Workload) -> Sequence[int] | None:
    lengths = getattr(workload.dataset, "lengths", None)
    dataset_length = workload.dataset_length
    if lengths is None or dataset_length is None or len(lengths) != dataset_length:
        return None
    return lengths if dataset_length else None


def heaviest_indices(workload: Workload, settings: LoaderSettings, seed: int) -> list[int] | None:
    """The indices of the epoch's batch that holds its longest sample: the batch sampler's own
    (the epoch planned with ``seed``), else the ``batch`` longest samples (any batch that holds
    the longest pads to its length); None where the dataset gives no ``lengths``."""
    lengths = _lengths(workload)
    if lengths is None:
        return None
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if workload.batch_sampler is not None:
        plan = workload.batch_sampler(workload.dataset, settings.batch, seed)
        return next((list(batch) for batch in plan if longest in batch), None)
    by_length = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    return by_length[: max(1, settings.batch)]


def heaviest_batch(workload: Workload, settings: LoaderSettings, seed: int) -> Any | None:
    """The epoch's heaviest batch collated as the DataLoader collates it, or None
    (:func:`heaviest_indices`)."""
    indices = heaviest_indices(workload, settings, seed)
    return None if indices is None else fetched_batches(workload, [indices])[0]
