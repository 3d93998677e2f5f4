"""A model of a setting's host memory: what a trial will hold before it runs.

    peak = main + workers x worker + batch x step + batch x batches in flight x sample
           + [workers are forked again each epoch] x batch x refork

where the batches in flight are ``num_workers x prefetch_factor`` (each worker's prefetched
batches, in shared memory), twice that with ``pin_memory`` (each has a page-locked copy), counted
no deeper than the deepest queue measured (``max_in_flight``): a queue fills only where the step
is slower than the workers, and the guard sees it fill batch by batch. Workers and batch size
are extrapolated: workers forking and a first large batch cross a limit faster than the guard
reads.

:func:`fit_memory_figures` fits the figures (:class:`MemoryFigures`) to the peaks the study's
trials measured, pooling every knob value: the main process, a worker and the step cost the same
whatever the knobs, and a prefetched sample's bytes are the knobs' own. ``refork`` is the copy of
the step's memory that workers forked again at an epoch's start keep between them (one copy
however many workers): it is fitted only to trials whose window crossed an epoch's start
(:attr:`~tuner.search.LoaderSettings.reforks_workers`), and taken as the whole step's memory (an
upper bound) until one has. Pure functions, no machine access; docs/design.md describes the
model and its figures.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tuner.search._settings import LoaderSettings

__all__ = [
    "OVER_LIMIT_FRACTION",
    "MemoryFigures",
    "fit_memory_figures",
    "predicted_peak_bytes",
    "prior_figures",
]

OVER_LIMIT_FRACTION = 1.05
"""The model's peak at this share of a limit or above says a setting does not fit; nearer, the
model's error decides. It prunes a setting unrun (:mod:`tuner.run._walls`) and lets the guard
stop a trial rising near the limit (:mod:`tuner.trial._guard`). 5% is above the model's usual
error, so a setting that fits is rarely pruned, while nearly every setting that does not fit is
still caught (``bench.memory_replay``)."""

SPARE_OBSERVATIONS = 1
"""Observations beyond the figures fitted: as many as figures would fit anything exactly."""

MIN_SAMPLE_BYTES = 1.0
"""A fitted cost per sample in the step below this is no cost: the fit is refused."""


@dataclasses.dataclass(frozen=True)
class MemoryFigures:
    """A workload's memory on this machine, in bytes: what the model multiplies."""

    main_bytes: float
    worker_bytes: float
    sample_bytes: float
    """One prefetched sample (in shared memory, collated)."""
    step_sample_bytes: float | None = None
    """One sample of the batch in the step, activations included; None: ``sample_bytes``."""
    max_in_flight: float = math.inf
    """Batches in flight are counted up to this many (the deepest queue measured)."""
    refork_sample_bytes: float | None = None
    """What the workers forked again at an epoch's start keep of the step's memory (one copy
    between them), per sample of the batch; None: the step's whole memory (an upper bound)."""

    @property
    def step_bytes_per_sample(self) -> float:
        """The step's memory per sample of its batch."""
        return self.sample_bytes if self.step_sample_bytes is None else self.step_sample_bytes

    @property
    def refork_bytes_per_sample(self) -> float:
        """The reforked workers' copy of the step's memory, per sample of the batch."""
        if self.refork_sample_bytes is None:
            return self.step_bytes_per_sample
        return self.refork_sample_bytes


def _in_flight(settings: LoaderSettings) -> float:
    """Batches in flight: prefetched by the workers, and their pinned copies."""
    copies = 2 if settings.pin_memory else 1
    return float(settings.num_workers * (settings.prefetch_factor or 0) * copies)


def predicted_peak_bytes(
    settings: LoaderSettings, figures: MemoryFigures, queue_full: bool = True
) -> int:
    """The model's peak of the trial's process tree (PSS) for ``settings``.

    Workers that are not persistent count from the second epoch on, with their copies.

    Args:
        settings: the setting to predict.
        figures: the workload's memory figures on this machine.
        queue_full: False predicts what forms before the guard's next readings: each worker's
            first batch, none queued (the queue fills batch by batch, and only where the step
            is slower than the workers).

    Returns:
        The predicted peak in bytes.
    """
    step = figures.step_bytes_per_sample
    step += settings.reforks_workers * figures.refork_bytes_per_sample
    queued = _in_flight(settings) if queue_full else float(settings.num_workers)
    in_flight = min(queued, figures.max_in_flight)
    return round(
        figures.main_bytes
        + settings.num_workers * figures.worker_bytes
        + settings.batch * (step + in_flight * figures.sample_bytes)
    )


def prior_figures(
    step_peaks: Mapping[int, float], worker_bytes: float, sample_bytes: float, in_flight: float
) -> MemoryFigures | None:
    """Figures measured before any trial: the main process and the step from a line through the
    main process's peaks per batch value.

    Args:
        step_peaks: the main process's peak bytes, stepping alone, per batch value.
        worker_bytes: one worker's own memory (bytes).
        sample_bytes: one prefetched sample's bytes.
        in_flight: the deepest queue measured, in batches; the model counts no deeper.

    Returns:
        The figures, or None with fewer than two batch values, or where the line says the step
        or the main process costs nothing.
    """
    if len(step_peaks) < 2 or worker_bytes <= 0 or sample_bytes <= 0:
        return None
    batches = np.array(sorted(step_peaks), dtype=float)
    peaks = np.array([step_peaks[int(b)] for b in batches], dtype=float)
    step, main = np.polyfit(batches, peaks, 1)
    if main <= 0 or step < MIN_SAMPLE_BYTES:
        return None
    return MemoryFigures(float(main), worker_bytes, sample_bytes, float(step), in_flight)


def _knobs_key(knobs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((name, repr(value)) for name, value in knobs.items()))


def fit_memory_figures(
    observations: Sequence[tuple[LoaderSettings, float]],
    knobs: Mapping[str, Any] | None = None,
) -> MemoryFigures | None:
    """Least-squares figures from measured ``(settings, peak bytes)``.

    One main, worker and step figure are fitted to all observations, a prefetched-sample figure
    to each knob value. A negative worker figure is taken as none (forked workers share nearly
    all their pages, so their own memory is within the noise).

    Args:
        observations: ``(settings, peak bytes)`` of complete trials. Those of workers that are
            not persistent must be of windows that crossed an epoch's start; with any, a
            ``refork`` figure is fitted too.
        knobs: the knob values whose figures to return; None takes all observations as one
            knob value.

    Returns:
        The figures, or None without enough: where no setting with ``knobs`` prefetched, where
        the settings do not separate the terms (all one worker count, say), or where the fit
        says the main process or the step costs nothing, or a sample less than nothing (that
        model would let any setting fit).
    """
    keys = [_knobs_key(s.knobs) if knobs is not None else () for s, _ in observations]
    wanted = _knobs_key(knobs) if knobs is not None else ()
    deepest = max((_in_flight(settings) for settings, _ in observations), default=0.0)
    # Knob values none of whose settings prefetched have no sample column: nothing to fit.
    groups = sorted(
        {key for (settings, _), key in zip(observations, keys, strict=True) if _in_flight(settings)}
    )
    reforked = any(settings.reforks_workers for settings, _ in observations)
    columns = 3 + len(groups) + int(reforked)
    if wanted not in groups or len(observations) < columns + SPARE_OBSERVATIONS:
        return None
    rows = []
    for (settings, _), key in zip(observations, keys, strict=True):
        prefetched = settings.batch * _in_flight(settings)
        rows.append(
            [1.0, settings.num_workers, settings.batch]
            + [prefetched if key == group else 0.0 for group in groups]
            + ([settings.reforks_workers * settings.batch] if reforked else [])
        )
    terms = np.array(rows, dtype=float)
    peaks = np.array([peak for _, peak in observations], dtype=float)
    if np.linalg.matrix_rank(terms) < terms.shape[1]:
        return None
    figures, *_ = np.linalg.lstsq(terms, peaks, rcond=None)
    if figures[1] < 0:  # forked workers share nearly everything: their own memory is noise
        without_workers, *_ = np.linalg.lstsq(np.delete(terms, 1, axis=1), peaks, rcond=None)
        figures = np.insert(without_workers, 1, 0.0)
    main, worker, step = figures[0], figures[1], figures[2]
    samples = figures[3 : 3 + len(groups)]
    # Under a byte per sample is free (flat peaks fit to +-1e-11 by rounding, a sign BLAS picks).
    if main <= 0 or step < MIN_SAMPLE_BYTES or (len(samples) and min(samples) < 0):
        return None
    sample = float(samples[groups.index(wanted)])
    # A copy smaller than nothing is noise: none kept.
    refork = max(0.0, float(figures[-1])) if reforked else None
    return MemoryFigures(float(main), float(worker), sample, float(step), deepest, refork)
