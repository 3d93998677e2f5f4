"""The memory wall: which settings the study need not run, because a smaller one did not fit.

A wall is a setting that did not fit, confirmed: the guard saw its tree within 2% of the limit
(``guard_predicted`` False), or the trial died of an out-of-memory error. A trial the guard
stopped on a prediction makes no wall: a prediction can be wrong, and a wall would spread the
error to every larger setting. A setting at least as large in every memory driver as a wall
(:meth:`~tuner.search.LoaderSettings.dominates`) is pruned ``memory_wall`` without running,
unless the memory model, fitted to the peaks the study has measured, says it fits well below
the limit; then it runs once as a re-test of that wall (user attr ``retest_of_wall``). A wall
falls once any setting at least as large completes.

The model also stops a setting no wall stands against: one whose peak before any queue (each
worker's first batch, none prefetched) the model puts 5% over the limit or more is pruned
``memory_model`` without running. The guard would stop it anyway once it came within 2% of the
limit, but workers forking and their first batches can cross the limit between two readings. A
queue fills a batch at a time, and only where the step is the slower side, so the guard sees it
coming, and counted full it would prune settings that fit. The margin against a model that
overestimates: a setting pruned so really holding under 90% of the limit (a false alarm) takes
an error over 15%.
Such a prune makes no wall either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner._attrs import has_settings, stored_settings, trial_settings
from tuner._naming import is_memory_reason
from tuner.pipeline import PipelineProfile, nearest_ratio
from tuner.search import (
    OVER_LIMIT_FRACTION,
    LoaderSettings,
    MemoryFigures,
    fit_memory_figures,
    predicted_peak_bytes,
    prior_figures,
)

__all__ = [
    "MODEL_RETEST_ATTR",
    "PREDICTED_PEAK_ATTR",
    "RETEST_ATTR",
    "WallVerdict",
    "calibrated_prior",
    "memory_figures",
    "memory_walls",
    "prior_memory_figures",
    "wall_verdict",
]

PREDICTED_PEAK_ATTR = "predicted_peak_host_memory_bytes"
"""Trial user attr: the memory model's peak for the setting, beside the measured one."""

RETEST_ATTR = "retest_of_wall"
"""Trial user attr: the wall this trial re-tests (it is dominated by it, the model says it fits)."""

MODEL_RETEST_ATTR = "retest_of_memory_model"
"""Trial user attr: the earlier trial of this setting the memory model pruned unrun; proposed
again, the setting runs once under the guard (the sampler learns nothing from a trial that did
not run, so it would propose a setting the model wrongly put over the limit again and again)."""

RETEST_BELOW_FRACTION = 0.9
"""The model must put a dominated setting this far below the limit to re-test its wall."""


def memory_walls(trials: list[optuna.trial.FrozenTrial]) -> list[tuple[int, LoaderSettings]]:
    """Settings that did not fit, confirmed (not on a prediction), with their trial numbers.

    A wall falls once a setting at least as large completed: its breach was not the setting's.
    """
    walls, fitted = [], []
    for trial in trials:
        attrs = trial.user_attrs
        if not has_settings(trial):
            continue
        settings = trial_settings(trial)
        if trial.state == TrialState.COMPLETE:
            fitted.append(settings)
        confirmed = is_memory_reason(attrs.get("pruned_reason")) and not attrs.get(
            "guard_predicted", False
        )
        if trial.state == TrialState.PRUNED and confirmed:
            walls.append((trial.number, settings))
    return [
        (number, wall)
        for number, wall in walls
        if not any(settings.dominates(wall) for settings in fitted)
    ]


def prior_memory_figures(
    profile: PipelineProfile | None, knobs: Mapping[str, Any]
) -> MemoryFigures | None:
    """The model's figures before the trials can give them: from the pipeline profile (the
    ceiling's main-process peaks per batch, a real loader's forked worker, ``knobs``' sample
    bytes, the queue of its real loader's workers at prefetch 2, as the fitted model's is the
    deepest queue the trials measured); None without a profile that has them."""
    if profile is None:
        return None
    own = profile.for_knobs(knobs)
    return prior_figures(
        own.step_peak_bytes, own.worker_fork_bytes, own.sample_bytes, 2.0 * own.loader_workers
    )


def memory_figures(
    trials: list[optuna.trial.FrozenTrial],
    settings: LoaderSettings,
    prior: MemoryFigures | None = None,
) -> MemoryFigures | None:
    """The model's figures for ``settings``' knobs, fitted to the complete trials (all knobs);
    until there are enough of them, ``prior`` scaled by measured/predicted at the nearest
    complete trial (:func:`calibrated_prior`). A trial of workers that are not persistent whose
    window crossed no epoch's end is left out: its peak holds only part of the copies of the
    step's memory that they make from the second epoch on (the epoch it starts after its window)
    (:attr:`~tuner.search.LoaderSettings.reforks_workers`)."""
    observations = []
    for trial in trials:
        attrs = trial.user_attrs
        peak = attrs.get("peak_host_memory_bytes")
        if trial.state != TrialState.COMPLETE or peak is None or "repeat_of" in attrs:
            continue
        measured = trial_settings(trial)
        if measured.reforks_workers and not attrs.get("epochs"):
            continue
        observations.append((measured, float(peak)))
    fitted = fit_memory_figures(observations, settings.knobs)
    if fitted is not None or prior is None:
        return fitted
    return calibrated_prior(prior, settings, observations)


def calibrated_prior(
    prior: MemoryFigures,
    settings: LoaderSettings,
    observations: list[tuple[LoaderSettings, float]],
) -> MemoryFigures:
    """``prior`` times measured/predicted at the complete trial nearest ``settings``.

    The prior's main process and step come from the ceiling's high-water marks, which hold the
    largest RSS its process ever reached, shared pages whole, while a trial's peak is its PSS:
    uncorrected, the prior runs high and prunes settings that fit. Its figures are one line, so
    scaling them scales the prediction. Observations of other knob values are predicted with
    ``settings``' knobs; the distance counts a knob apart, so the same knobs' trials come first.
    """
    ratios = [
        (measured, peak / predicted)
        for measured, peak in observations
        if (predicted := predicted_peak_bytes(measured, prior)) > 0
    ]
    ratio = nearest_ratio(settings, ratios)
    return dataclasses.replace(
        prior,
        main_bytes=prior.main_bytes * ratio,
        worker_bytes=prior.worker_bytes * ratio,
        sample_bytes=prior.sample_bytes * ratio,
        step_sample_bytes=None
        if prior.step_sample_bytes is None
        else prior.step_sample_bytes * ratio,
        refork_sample_bytes=None
        if prior.refork_sample_bytes is None
        else prior.refork_sample_bytes * ratio,
    )


@dataclasses.dataclass(frozen=True)
class WallVerdict:
    """What the walls say about one setting before it runs."""

    predicted_peak_bytes: int | None
    dominated_by: int | None = None
    """The wall that stands against the setting: prune it without running."""
    retest_of: int | None = None
    """The wall the setting re-tests: run it."""
    over_limit: bool = False
    """No wall stands against it, but the model puts its peak 5% over the limit: prune it unrun."""
    model_retest_of: int | None = None
    """The model puts it over the limit again, but pruned it unrun once already (that trial):
    run it under the guard, as a prediction the guard made once is tested once."""


def wall_verdict(
    trials: list[optuna.trial.FrozenTrial],
    settings: LoaderSettings,
    host_limit_bytes: int,
    prior: MemoryFigures | None = None,
) -> WallVerdict:
    """The walls' and the model's verdict on ``settings`` (``prior``: the figures until the
    trials give their own, :func:`prior_memory_figures`)."""
    figures = memory_figures(trials, settings, prior)
    predicted = predicted_peak_bytes(settings, figures) if figures is not None else None
    fits = predicted is not None and predicted < RETEST_BELOW_FRACTION * host_limit_bytes
    retested = {trial.user_attrs.get(RETEST_ATTR) for trial in trials}
    for wall_number, wall in memory_walls(trials):
        if not settings.dominates(wall):
            continue
        if fits and wall_number not in retested:
            return WallVerdict(predicted, retest_of=wall_number)
        return WallVerdict(predicted, dominated_by=wall_number)
    fast = None if figures is None else predicted_peak_bytes(settings, figures, queue_full=False)
    over = fast is not None and fast >= OVER_LIMIT_FRACTION * host_limit_bytes
    skipped = _model_skip(trials, settings) if over else None
    if skipped is not None and skipped not in {t.user_attrs.get(MODEL_RETEST_ATTR) for t in trials}:
        return WallVerdict(predicted, model_retest_of=skipped)
    return WallVerdict(predicted, over_limit=over)


def _model_skip(trials: list[optuna.trial.FrozenTrial], settings: LoaderSettings) -> int | None:
    """The first trial of exactly ``settings`` the model pruned unrun, if any."""
    wanted = settings.to_attrs()
    for trial in trials:
        skipped = trial.user_attrs.get("pruned_reason") == "memory_model"
        if skipped and stored_settings(trial) == wanted:
            return trial.number
    return None
