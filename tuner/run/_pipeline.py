"""The pipeline's steps in a run: profile once, set the worker range, seed the search, stop, grow.

Each study attr here is written once under the study lock by whichever worker of a fleet gets
there first (as the ceiling is), and read by the others: ``pipeline_profile`` (the
:class:`~tuner.pipeline.PipelineProfile`) and ``num_workers_max`` (the worker range the model
set, grown when the best sits at its edge). An older study without the step's rates gets no
profile, and runs as before.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import optuna
from optuna.trial import TrialState

from storage import storage_lock
from tuner._attrs import (
    has_settings,
    record_loader_defaults_kept,
    remeasured,
    trial_settings,
)
from tuner._naming import STEP_CPU_ATTR, STEP_PEAK_ATTR, STEP_RATES_ATTR, is_memory_reason
from tuner.insight import best_trial, diagnose_trial, trial_throughput
from tuner.pipeline import (
    HARD_MAX_WORKERS,
    PipelineModel,
    PipelineProfile,
    Proposal,
    kept_defaults,
    memory_max_workers,
    model_seeds,
    next_setting,
    setting_key,
    store_profile,
    stored_profile,
    untried_knob_steps,
    worker_range,
    worker_steps,
)
from tuner.run._config import PreparedStudy, trial_deadline
from tuner.run._once import once_per_study
from tuner.run._tools import make_job
from tuner.search import LoaderSettings, SearchSpace, enqueue_settings
from tuner.trial import Mode, Supervisor

__all__ = [
    "BOUND_STOP_FRACTION",
    "MODEL_SEED_ATTR",
    "WORKER_RANGE_ATTR",
    "bound_stop_candidate",
    "bound_stop_message",
    "enqueue_model_seed",
    "enqueue_next_setting",
    "grow_worker_range",
    "model_space",
    "profile_pipeline",
    "record_kept_defaults",
]

_log = logging.getLogger("tuner")
_progress = logging.getLogger("tuner.run")

WORKER_RANGE_ATTR = "num_workers_max"
MODEL_SEED_ATTR = "model_seed"
"""Trial user attr on the trials the model chose: ``predicted-best`` and ``within-cores``
(queued with the baselines, :func:`~tuner.pipeline.model_seeds`), then ``corrected``,
``neighbour`` or ``knob:<name>`` (a loader knob set the other way beside the best,
:func:`~tuner.pipeline.next_setting`)."""

CORRECTED_ATTR = "corrected_samples_per_sec"
"""Trial user attr: the corrected prediction that chose the trial (beside the model's own)."""

BOUND_STOP_FRACTION = 0.95
"""A re-measured best within 5% of the bound ends the study: the model says nothing is left,
once the worker steps either side of it are measured (a bound from a profile measured while the
machine ran slow can sit under what the machine delivers)."""

PROFILE_BUDGET_S = 1.0


def profile_pipeline(
    prepared: PreparedStudy, study: optuna.Study, supervisor: Supervisor, space: SearchSpace
) -> PipelineProfile | None:
    """The study's profile: stored, or measured now in a trial child (a second or two)."""
    attrs = study.user_attrs
    profile = stored_profile(attrs)
    if profile is not None:
        return profile
    if STEP_RATES_ATTR not in attrs or STEP_CPU_ATTR not in attrs:
        return None  # no ceiling measured: the step's side of the model is unknown
    settings = space.main_process_settings(space.clamp_batch(prepared.workload.default_batch_size))
    job = make_job(prepared, settings, Mode.PIPELINE).replace(
        batches=tuple(space.batch_choices()),
        budget_s=PROFILE_BUDGET_S,
        knob_variants=space.knob_variants(),
    )
    _progress.info("pipeline profile: what a sample, a batch and a step cost here")
    outcome = supervisor.run(job, trial_deadline(prepared.config))
    if outcome.state == "pruned" and is_memory_reason(outcome.reason):
        # Under a tight limit two workers may not fit: one worker gives the same figures.
        outcome = supervisor.run(job.replace(loader_workers=1), trial_deadline(prepared.config))
    if outcome.state != "complete":
        _log.warning("pipeline not profiled: %s", outcome.error or outcome.reason)
        return None
    profile = PipelineProfile.from_attrs(
        {
            **outcome.attrs,
            "usable_cores": float(prepared.fingerprint.usable_cpus),
            "ranks": prepared.nproc_per_node,
            "step_rates": attrs[STEP_RATES_ATTR],
            "step_cpu_s": attrs[STEP_CPU_ATTR],
            "step_peak_bytes": attrs.get(STEP_PEAK_ATTR, {}),
        }
    )
    with storage_lock(prepared.config.storage, prepared.study_name):
        fresh = stored_profile(study.user_attrs)  # another worker may have profiled meanwhile
        if fresh is not None:
            return fresh
        store_profile(study, profile)
    return profile


def model_space(
    study: optuna.Study,
    storage_url: str,
    space: SearchSpace,
    profile: PipelineProfile,
    host_limit_bytes: int | None,
) -> SearchSpace:
    """``space`` with the worker range the model sets (stored once, so a fleet agrees)."""
    measure = functools.partial(worker_range, profile, space, host_limit_bytes)
    stored = once_per_study(study, storage_url, WORKER_RANGE_ATTR, measure)
    return dataclasses.replace(space, max_workers=int(stored))


def enqueue_model_seed(study: optuna.Study, space: SearchSpace, model: PipelineModel) -> None:
    """Queue the model's seeds (:func:`~tuner.pipeline.model_seeds`); the caller holds the study
    lock and has just queued the baselines (so this happens once per study)."""
    for why, settings in model_seeds(model.profile, space):
        enqueue_settings(study, space, settings, **{MODEL_SEED_ATTR: why})


def _measurements(
    study: optuna.Study,
) -> tuple[list[tuple[LoaderSettings, float]], list[LoaderSettings]]:
    """(settings, samples/s) of the complete trials (re-measured medians where there are), and
    the settings of every other trial: queued, running, pruned or failed, none to propose."""
    medians = remeasured(study)
    measured: list[tuple[LoaderSettings, float]] = []
    other: list[LoaderSettings] = []
    for trial in study.get_trials(deepcopy=False):
        if not has_settings(trial):
            continue
        if trial.state == TrialState.COMPLETE and trial.value is not None:
            measured.append((trial_settings(trial), trial_throughput(trial, medians)))
        else:
            other.append(trial_settings(trial))
    return measured, other


def _proposal(study: optuna.Study, space: SearchSpace, model: PipelineModel) -> Proposal | None:
    measured, other = _measurements(study)
    return next_setting(model.profile, space, measured, other)


def enqueue_next_setting(
    study: optuna.Study, storage_url: str, space: SearchSpace, model: PipelineModel
) -> Proposal | None:
    """Queue the model strategy's next setting unless a trial already waits; None when there is
    nothing left to propose (or a trial was already queued)."""
    with storage_lock(storage_url, study.study_name):
        if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return None
        proposal = _proposal(study, space, model)
        if proposal is not None:
            enqueue_settings(
                study,
                space,
                proposal.settings,
                **{
                    MODEL_SEED_ATTR: proposal.why,
                    CORRECTED_ATTR: proposal.corrected_samples_per_sec,
                },
            )
    return proposal


def bound_stop_candidate(
    study: optuna.Study, model: PipelineModel, space: SearchSpace
) -> optuna.trial.FrozenTrial | None:
    """The best trial once the model's seed is measured and the best is near the bound or has
    held against all its neighbours (nothing left to propose); None while searching on pays."""
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
    if not any(MODEL_SEED_ATTR in t.user_attrs for t in finished):
        return None
    if any(MODEL_SEED_ATTR in t.user_attrs or "baseline" in t.user_attrs for t in waiting):
        return None
    best = best_trial(study)
    if best is None:
        return None
    measured, other = _measurements(study)
    if trial_throughput(best, remeasured(study)) >= BOUND_STOP_FRACTION * model.bound:
        tried = {setting_key(s) for s, _ in measured} | {setting_key(s) for s in other}
        steps = worker_steps(space, trial_settings(best))
        knobs = untried_knob_steps(model.profile, space, measured, other)
        if not knobs and all(setting_key(step) in tried for step in steps):
            return best
    return best if next_setting(model.profile, space, measured, other) is None else None


def record_kept_defaults(study: optuna.Study, space: SearchSpace, model: PipelineModel) -> None:
    """Record which loader knobs the study's pick keeps at the model's default and why
    (:func:`~tuner.pipeline.kept_defaults`); the caller holds the study lock."""
    best = best_trial(study)
    if best is None or not has_settings(best):
        return
    measured, _ = _measurements(study)
    value = trial_throughput(best, remeasured(study))
    reasons = kept_defaults(
        model.profile, space, trial_settings(best), value, [s for s, _ in measured]
    )
    record_loader_defaults_kept(study, reasons)


def bound_stop_message(
    study: optuna.Study,
    model: PipelineModel,
    space: SearchSpace,
    candidate: optuna.trial.FrozenTrial | None = None,
) -> str | None:
    """Why the study stops now (its candidate re-measured), or None. ``candidate`` is
    :func:`bound_stop_candidate`'s answer where the caller has it for the study as it stands."""
    best = candidate if candidate is not None else bound_stop_candidate(study, model, space)
    medians = remeasured(study)
    if best is None or best.number not in medians:
        return None
    throughput = medians[best.number]
    share = throughput / model.bound if model.bound else 0.0
    if throughput >= BOUND_STOP_FRACTION * model.bound:
        why = f"{share:.1%} of the bound ({model.bound:,.1f} samples/s the model allows here)"
    else:
        why = f"it held against all its neighbours ({share:.1%} of the bound)"
    return (
        f"stopping early: trial {best.number} reaches {throughput:,.1f} samples/s re-measured, "
        + why
    )


def grow_worker_range(
    study: optuna.Study,
    storage_url: str,
    space: SearchSpace,
    profile: PipelineProfile,
    host_limit_bytes: int | None,
) -> SearchSpace | None:
    """A wider space when the best sits at the top of the worker range and waits for data with
    CPUs to spare (``input-bound`` or ``io-bound``); None when the space stays.

    The range doubles, within memory and :data:`~tuner.pipeline._model.HARD_MAX_WORKERS`.
    Optuna's GP then models ``num_workers`` independently for a while (its distribution
    changed); TPE takes the wider range in its stride.
    """
    if "num_workers" in space.fixed:
        return None
    best = best_trial(study)
    if best is None or not has_settings(best):
        return None
    settings = trial_settings(best)
    diagnosis = diagnose_trial(best)
    if settings.num_workers < space.max_workers or diagnosis is None:
        return None
    if diagnosis.bottleneck not in ("input-bound", "io-bound"):
        return None
    cap = min(HARD_MAX_WORKERS, memory_max_workers(profile, host_limit_bytes, settings.batch, 2))
    grown = min(cap, 2 * space.max_workers)
    if grown <= space.max_workers:
        return None
    with storage_lock(storage_url, study.study_name):
        stored = int(study.user_attrs.get(WORKER_RANGE_ATTR, space.max_workers))
        grown = max(grown, stored)
        study.set_user_attr(WORKER_RANGE_ATTR, grown)
    return dataclasses.replace(space, max_workers=grown)
