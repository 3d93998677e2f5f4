"""The ceiling as the study uses it: the point where searching further is pointless.

The ceiling itself (the step alone on a batch already on the device) is measured in a trial
child by :func:`tuner.trial.measure_ceiling`; this module decides, from the study's stored
trials, when its best is near enough to stop (:func:`ceiling_stop_message`).
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from tuner._naming import CEILING_ATTR
from tuner.insight._summary import best_trial, efficiency, remeasured, trial_throughput

__all__ = ["CEILING_STOP_FRACTION", "ceiling_stop_message", "near_ceiling"]


CEILING_STOP_FRACTION = 0.98
"""A best within 2% of the ceiling ends the study: no setting can be meaningfully faster."""


def near_ceiling(
    study: optuna.Study, min_trials: int = 0, fraction: float = CEILING_STOP_FRACTION
) -> optuna.trial.FrozenTrial | None:
    """The best trial once it is within ``fraction`` of the ceiling, after ``min_trials``.

    ``min_trials`` finished trials come first (the baselines and the sampler's random start), so
    one fast first window cannot end a study before it has searched at all.
    """
    ceiling = study.user_attrs.get(CEILING_ATTR)
    if not ceiling:
        return None
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    if len(finished) < min_trials:
        return None
    best = best_trial(study)
    if best is None:
        return None
    share = efficiency(trial_throughput(best, remeasured(study)), ceiling)
    return best if share is not None and share >= fraction else None


def ceiling_stop_message(
    study: optuna.Study, min_trials: int = 0, fraction: float = CEILING_STOP_FRACTION
) -> str | None:
    """Why the study should stop now, or None.

    It stops when its best, re-measured (a single window can be lucky), is within 2% of the
    ceiling: the caller re-measures a best that :func:`near_ceiling` names before asking.
    """
    best = near_ceiling(study, min_trials, fraction)
    if best is None:
        return None
    medians = remeasured(study)
    if best.number not in medians:
        return None
    ceiling = float(study.user_attrs[CEILING_ATTR])
    throughput = medians[best.number]
    return (
        f"stopping early: trial {best.number} reaches {throughput:,.1f} samples/s re-measured, "
        f"{throughput / ceiling:.1%} of the ceiling ({ceiling:,.1f} samples/s with data already "
        "on the device); no DataLoader setting can be meaningfully faster"
    )
