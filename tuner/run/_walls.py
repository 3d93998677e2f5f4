"""The memory wall: which settings the study need not run, because a smaller one did not fit.

A wall is a setting that did not fit, confirmed: the guard saw its tree within 2% of the limit
(``guard_predicted`` False), or the trial died of an out-of-memory error. A trial the guard
stopped on a prediction makes no wall: a prediction can be wrong, and a wall would spread the
error to every larger setting. A setting at least as large in every memory driver as a wall
(:meth:`~tuner.search.LoaderSettings.dominates`) is pruned ``memory_wall`` without running,
unless the memory model, fitted to the peaks the study has measured, says it fits well below
the limit; then it runs once as a re-test of that wall (user attr ``retest_of_wall``). A wall
falls once any setting at least as large completes.

The model also stops a setting no wall stands against: one whose predicted peak is 5% over the
limit or more is pruned ``memory_model`` without running. The guard would stop it anyway once
it came within 2% of the limit, but a setting whose workers fork and fill their prefetch queues
within a fifth of a second can cross the limit between two readings. The margin against a model that
overestimates: a setting pruned so really holding under 90% of the limit (a false alarm) takes
an error over 15%. Such a prune makes no wall either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner._attrs import has_settings, trial_settings
from tuner._naming import is_memory_reason
from tuner.pipeline import PipelineProfile
from tuner.search._memory_model import (
    MemoryFigures,
    fit_memory_figures,
    predicted_peak_bytes,
    prior_figures,
)
from tuner.search._settings import LoaderSettings

__all__ = [
    "MODEL_PRUNE_FRACTION",
    "PREDICTED_PEAK_ATTR",
    "RETEST_ATTR",
    "WallVerdict",
    "memory_figures",
    "memory_walls",
    "prior_memory_figures",
    "wall_verdict",
]

PREDICTED_PEAK_ATTR = "predicted_peak_host_memory_bytes"
"""Trial user attr: the memory model's peak for the setting, beside the measured one."""

RETEST_ATTR = "retest_of_wall"
"""Trial user attr: the wall this trial re-tests (it is dominated by it, the model says it fits)."""

RETEST_BELOW_FRACTION = 0.9
"""The model must put a dominated setting this far below the limit to re-test its wall."""

MODEL_PRUNE_FRACTION = 1.05
"""The model putting a setting's peak at this share of the limit or above prunes it unrun
(replayed over 12 studies of ``bench.guard_precision``, docs/benchmarks.md 2026-12-04: at 1.0,
3 of 20 such prunes held under 90% of the limit, at 1.05 none, and 16 of the 17 that did not fit
were still caught; a scratch copy of ``bench.memory_replay``'s loop, which on the code as
committed counts 6 prunes on those studies, none a false alarm)."""


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
    ``prior`` until there are enough of them."""
    observations = []
    for trial in trials:
        attrs = trial.user_attrs
        peak = attrs.get("peak_host_memory_bytes")
        if trial.state != TrialState.COMPLETE or peak is None or "repeat_of" in attrs:
            continue
        observations.append((trial_settings(trial), float(peak)))
    fitted = fit_memory_figures(observations, settings.knobs)
    return fitted if fitted is not None else prior


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
    over = predicted is not None and predicted >= MODEL_PRUNE_FRACTION * host_limit_bytes
    return WallVerdict(predicted, over_limit=over)
