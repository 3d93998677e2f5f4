"""A model of a setting's host memory: what a trial will hold before it runs.

    peak = main + workers x worker + batch x sample x (batches in flight + 1) [+ pinned copies]

where the batches in flight are ``num_workers x prefetch_factor`` (each worker's prefetched
batches, in shared memory), the one more is the batch in the training step, and with
``pin_memory`` each batch in flight has a page-locked copy as well. The figures
(:class:`MemoryFigures`: the main process with its model, each worker's own memory, one collated
sample) are inputs: :func:`fit_memory_figures` fits them to the peaks the study's trials
measured, pooling trials of every knob value (the main process and a worker cost the same
whatever the knobs; a sample's bytes are the knobs' own: a uint8 collate holds a quarter of a
float one), so a study has figures after a handful of trials, not a handful per knob value.
Pure functions, no machine access.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tuner.search._settings import LoaderSettings

__all__ = ["MemoryFigures", "fit_memory_figures", "predicted_peak_bytes"]

SPARE_OBSERVATIONS = 1
"""Observations beyond the figures fitted: as many as figures would fit anything exactly."""

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


def _knobs_key(knobs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((name, repr(value)) for name, value in knobs.items()))


def fit_memory_figures(
    observations: Sequence[tuple[LoaderSettings, float]],
    knobs: Mapping[str, Any] | None = None,
) -> MemoryFigures | None:
    """Least-squares figures from measured ``(settings, peak bytes)``, or None without enough.

    With ``knobs``, the observations may hold any knob values: one main and one worker figure
    are fitted to all, a sample figure to each knob value, and the figures returned are
    ``knobs``' (None where no observation has them). Without, all are taken as one knob value.
    None too where the measured settings do not separate the terms (all one worker count, say)
    or the fit says the main process or a sample costs nothing or less: that model would let
    any setting fit. A negative worker figure is taken as none (forked workers share nearly
    all their pages, so their own memory is within the noise).
    """
    keys = [_knobs_key(s.knobs) if knobs is not None else () for s, _ in observations]
    wanted = _knobs_key(knobs) if knobs is not None else ()
    groups = sorted(set(keys))
    if wanted not in groups:
        return None
    rows = []
    for (settings, _), key in zip(observations, keys, strict=True):
        one, workers, held = _drivers(settings)
        rows.append([one, workers, *(held if key == group else 0.0 for group in groups)])
    terms = np.array(rows)
    peaks = np.array([peak for _, peak in observations], dtype=float)
    if len(observations) < terms.shape[1] + SPARE_OBSERVATIONS:
        return None
    if np.linalg.matrix_rank(terms) < terms.shape[1]:
        return None
    figures, *_ = np.linalg.lstsq(terms, peaks, rcond=None)
    if figures[1] < 0:  # forked workers share nearly everything: their own memory is noise
        without_workers, *_ = np.linalg.lstsq(np.delete(terms, 1, axis=1), peaks, rcond=None)
        figures = np.insert(without_workers, 1, 0.0)
    main, worker, samples = figures[0], figures[1], figures[2:]
    # Under a byte per sample is free (flat peaks fit to +-1e-11 by rounding, a sign BLAS picks).
    if main <= 0 or min(samples) < MIN_SAMPLE_BYTES:
        return None
    return MemoryFigures(float(main), float(worker), float(samples[groups.index(wanted)]))
