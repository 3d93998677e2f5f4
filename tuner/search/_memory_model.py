"""A model of a setting's host memory: what a trial will hold before it runs.

    peak = main + workers x worker + batch x sample x (batches in flight + 1) [+ pinned copies]

where the batches in flight are ``num_workers x prefetch_factor`` (each worker's prefetched
batches, in shared memory), the one more is the batch in the training step, and with
``pin_memory`` each batch in flight has a page-locked copy as well. The figures
(:class:`MemoryFigures`: the main process with its model, each worker's own memory, one collated
sample) are inputs: today :func:`fit_memory_figures` fits them to the peaks the study's trials
measured; a pipeline profile can hand measured ones instead. Pure functions, no machine access.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from tuner.search._settings import LoaderSettings

__all__ = ["MemoryFigures", "fit_memory_figures", "predicted_peak_bytes"]

MIN_OBSERVATIONS = 4
"""Three figures fitted from fewer measured settings would fit anything."""

MIN_SAMPLE_BYTES = 1.0
"""A fitted cost per prefetched sample below this is no cost: the fit is refused."""


@dataclasses.dataclass(frozen=True)
class MemoryFigures:
    """A workload's memory on this machine, in bytes: what the model multiplies."""

    main_bytes: float
    worker_bytes: float
    sample_bytes: float


def _drivers(settings: LoaderSettings) -> tuple[float, float, float]:
    """(1, workers, samples held) for ``settings``: the model's terms before the figures."""
    in_flight = settings.num_workers * (settings.prefetch_factor or 0)
    copies = 2 if settings.pin_memory else 1
    held = settings.batch * (in_flight * copies + 1)
    return 1.0, float(settings.num_workers), float(held)


def predicted_peak_bytes(settings: LoaderSettings, figures: MemoryFigures) -> int:
    """The model's peak of the trial's process tree (PSS) for ``settings``."""
    one, workers, held = _drivers(settings)
    return round(
        one * figures.main_bytes + workers * figures.worker_bytes + held * figures.sample_bytes
    )


def fit_memory_figures(
    observations: Sequence[tuple[LoaderSettings, float]],
) -> MemoryFigures | None:
    """Least-squares figures from measured ``(settings, peak bytes)``, or None without enough.

    None too where the measured settings do not separate the terms (all one worker count, say)
    or the fit says the main process or a sample costs nothing or less: that model would let
    any setting fit. A negative worker figure is taken as none (forked workers share nearly
    all their pages, so their own memory is within the noise).
    """
    if len(observations) < MIN_OBSERVATIONS:
        return None
    terms = np.array([_drivers(settings) for settings, _ in observations])
    peaks = np.array([peak for _, peak in observations], dtype=float)
    if np.linalg.matrix_rank(terms) < terms.shape[1]:
        return None
    (main, worker, sample), *_ = np.linalg.lstsq(terms, peaks, rcond=None)
    if worker < 0:  # forked workers share nearly everything: their own memory is noise
        worker = 0.0
        (main, sample), *_ = np.linalg.lstsq(terms[:, [0, 2]], peaks, rcond=None)
    # Under a byte per sample is free (flat peaks fit to +-1e-11 by rounding, a sign BLAS picks).
    if main <= 0 or sample < MIN_SAMPLE_BYTES:
        return None
    return MemoryFigures(float(main), float(worker), float(sample))
