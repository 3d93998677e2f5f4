"""The ceiling as the study uses it: measured once per study, and the point where searching
further is pointless.

The ceiling itself (the step alone on a batch already on the device) is measured in a trial
child by :func:`tuner.trial._ceiling.measure_step_rates`; :func:`study_ceiling` runs that child once
per study, and :func:`ceiling_stop_message` decides, from the study's stored trials, when its
best is near enough to stop.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import optuna
from optuna.trial import TrialState

from storage import with_retry
from tuner._attrs import remeasured
from tuner._naming import (
    CEILING_ATTR,
    STEP_CPU_ATTR,
    STEP_PEAK_ATTR,
    STEP_RATES_ATTR,
    is_memory_reason,
)
from tuner.insight import best_trial, efficiency, trial_throughput
from tuner.run._config import PreparedStudy, trial_deadline
from tuner.run._once import once_per_study
from tuner.run._probe import MAX_BATCH_ATTR, probe_candidates, probes_batch, study_max_batch
from tuner.run._tools import make_job
from tuner.search import SearchSpace
from tuner.trial import Mode, Supervisor, TrialOutcome

__all__ = [
    "CEILING_STOP_FRACTION",
    "ceiling_stop_message",
    "near_ceiling",
    "study_ceiling",
    "study_space_and_ceiling",
]

_log = logging.getLogger("tuner")
_progress = logging.getLogger("tuner.run")

CEILING_WINDOW_S = 0.3
"""Short windows over every batch size: the ceiling is their maximum, so a reading disturbed
downwards rarely decides it, and a window this long holds several steps."""


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


def study_space_and_ceiling(
    prepared: PreparedStudy, study: optuna.Study, supervisor: Supervisor
) -> tuple[SearchSpace, float | None]:
    """The space up to the largest batch that fits (:mod:`tuner.run._probe`), and the ceiling
    over it.

    The ceiling runs first, over every batch value the probe would try: it steps each one, the
    epoch's heaviest batch and the optimizer's state included, smallest first, so where it
    climbs without meeting the guard the sizes it stepped fit, and a probe would only repeat
    the largest and slowest steps (text's 65,536-token step, three times: 17 s of a 40 s
    set-up, the ceiling then stopping its climb below that size). Where the guard stops it, the
    probe finds the edge and the ceiling is measured again below it.
    """
    stored = with_retry(lambda: study.user_attrs, "reading the study")
    if probes_batch(prepared) and MAX_BATCH_ATTR not in stored and CEILING_ATTR not in stored:
        outcome = _measure_ceiling(prepared, supervisor, prepared.space, probe_candidates(prepared))
        if outcome.state == "complete":
            figures = functools.partial(_step_figures, prepared, study, outcome)
            once_per_study(study, prepared.config.storage, CEILING_ATTR, figures)
        elif not (outcome.state == "pruned" and is_memory_reason(outcome.reason)):
            _log.warning("ceiling not measured: %s", outcome.error or outcome.reason)
            return prepared.space, None  # the workload fails: each trial records why
    space = dataclasses.replace(
        prepared.space, max_batch=study_max_batch(prepared, study, supervisor)
    )
    return space, study_ceiling(prepared, study, supervisor, space)


def _measure_ceiling(
    prepared: PreparedStudy, supervisor: Supervisor, space: SearchSpace, batches: list[int]
) -> TrialOutcome:
    """One ceiling child over ``batches`` at one and all of ``space``'s intra-op threads."""
    config = prepared.config
    _progress.info(
        "ceiling: the step alone on data already on the device, batch %s..%s",
        batches[0],
        batches[-1],
    )
    job = make_job(prepared, space.main_process_settings(batches[-1])).replace(
        mode=Mode.CEILING,
        batches=tuple(batches),
        threads=tuple(sorted({1, space.max_threads})),
        window_s=min(config.trial_seconds, CEILING_WINDOW_S),
        warmup_s=min(config.warmup_seconds, CEILING_WINDOW_S / 2),
    )
    return supervisor.run(job, trial_deadline(config) * 2)


def _step_figures(prepared: PreparedStudy, study: optuna.Study, outcome: TrialOutcome) -> float:
    """Store a complete ceiling child's step figures once per study; its ceiling, which the
    caller stores after them (a worker that finds the ceiling finds them): the step's rate and
    CPU time per batch and thread count, for the pipeline profile, and its peak memory."""
    for key in (STEP_RATES_ATTR, STEP_CPU_ATTR, STEP_PEAK_ATTR):
        if key in outcome.attrs:
            value = outcome.attrs[key]
            once_per_study(study, prepared.config.storage, key, lambda value=value: value)
    # The child steps as one rank (its share of the threads); the node's ranks step side by side.
    return float(outcome.attrs[CEILING_ATTR]) * prepared.nproc_per_node


def study_ceiling(
    prepared: PreparedStudy, study: optuna.Study, supervisor: Supervisor, space: SearchSpace
) -> float | None:
    """The study's ``ceiling_samples_per_sec``: the step alone on prepared data, measured once,
    over every batch value of ``space`` and at one and all intra-op threads; for the node,
    under N ranks (one rank's rate times N)."""

    def measure() -> float | None:
        batches = space.batch_choices()
        outcome = _measure_ceiling(prepared, supervisor, space, batches)
        # Under a tight limit the largest batch the probe let through can still cross it with
        # the step's other thread count: the ceiling is then measured without it.
        while outcome.state == "pruned" and is_memory_reason(outcome.reason) and len(batches) > 1:
            batches = batches[:-1]
            outcome = _measure_ceiling(prepared, supervisor, space, batches)
        if outcome.state != "complete":
            _log.warning("ceiling not measured: %s", outcome.error or outcome.reason)
            return None
        return _step_figures(prepared, study, outcome)

    value = once_per_study(study, prepared.config.storage, CEILING_ATTR, measure)
    return None if value is None else float(value)
