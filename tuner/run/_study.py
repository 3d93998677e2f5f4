"""A tuning run, as the README lists its steps: validate, create or resume the study, measure the
ceiling (which finds the largest batch, or leaves it to the probe), enqueue the baselines, run
trials, re-measure, report.

Processes and what survives them: this study process owns the Optuna study, the database
connection and the guard; each trial runs in a child (:mod:`tuner.trial`). A child that dies
costs one trial. Ctrl-C and SIGTERM (:mod:`tuner._signals`) kill the running trial's processes
and fail it ("interrupted", "terminated"); they abandon a re-measurement before its attrs are
written, and never cut in two a write of several attrs under the study lock. This process dying
where it stands (SIGKILL) leaves its RUNNING trial to the heartbeat: another worker fails it and
runs the re-queued copy. A database restart is ridden out by ``with_retry``. Every check that
can refuse the run happens in :func:`~tuner.run._config.prepare`, before anything is written.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
import warnings
from collections import Counter

import optuna
from optuna.trial import TrialState
from tqdm import tqdm

from storage import mask_url, storage_lock, with_retry
from tuner import __version__
from tuner._attrs import (
    BATCH_PARAM_ATTR,
    loader_defaults_kept,
    record_loader_defaults_kept,
    record_phases,
    remeasured,
)
from tuner._naming import BOUND_ATTR, METRIC_NAME, NPROC_ATTR, objective_label
from tuner._signals import deferred, stop_on_signals, stop_reason
from tuner.fleet import StaleTrials, enqueue_warm_start, heartbeat
from tuner.insight import best_trial, save_study_note
from tuner.pipeline import PipelineModel
from tuner.run import _pipeline
from tuner.run._ceiling import ceiling_stop_message, near_ceiling, study_space_and_ceiling
from tuner.run._config import ConfigError, PreparedStudy, StudyConfig, prepare
from tuner.run._once import once_per_study
from tuner.run._remeasure import final_candidates, remeasure
from tuner.run._runner import SearchSpaceChanged, TrialRunner
from tuner.run._samplers import (
    MODEL_STRATEGY,
    N_STARTUP_TRIALS,
    make_pruner,
    make_sampler,
    resumed_seed,
)
from tuner.run._tools import make_runner, trial_tools
from tuner.search import SearchSpace, enqueue_baselines
from tuner.trial import Supervisor

__all__ = ["StudyResult", "no_result_message", "run_study"]

_log = logging.getLogger("tuner.run")

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclasses.dataclass
class StudyResult:
    """What a run leaves: the study, the trials this process ran, the best (None without a
    completed trial), the re-measured medians by trial number, and the study's batch parameter."""

    study: optuna.Study
    trials_run: int
    best_trial: optuna.trial.FrozenTrial | None
    remeasured: dict[int, float]
    batch_param: str = "batch_size"


def run_study(config: StudyConfig) -> StudyResult:
    """Run the study described by ``config``; see the module docstring for what survives what.

    What it does is logged as it happens (the ``tuner.run`` logger, INFO: the study, each set-up
    phase, early stops); the progress bars go to stderr when ``config.progress``. Nothing is
    written to stdout: the caller prints the summary (``tuner.insight.print_summary``).
    ``dataloader-tuner study`` and :func:`tuner.tune` both run this.
    """
    with warnings.catch_warnings(), stop_on_signals():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        # We run the heartbeat ourselves around ask/tell (see tuner.fleet), which Optuna cannot
        # see.
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        return _run(config)


def no_result_message(study: optuna.Study) -> str:
    """Why a run has no best: the trial counts, and the latest error or pruned reason."""
    trials = study.get_trials(deepcopy=False)
    counts = Counter(trial.state.name.lower() for trial in trials)
    why = next(
        (
            trial.user_attrs.get("error") or trial.user_attrs.get("pruned_reason")
            for trial in reversed(trials)
            if trial.user_attrs.get("error") or trial.user_attrs.get("pruned_reason")
        ),
        None,
    )
    summary = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
    return f"no trial completed in study {study.study_name} ({summary or 'no trial'})" + (
        f"; the last: {why}" if why else ""
    )


def _run(config: StudyConfig) -> StudyResult:
    clock = _PhaseClock(time.monotonic())
    prepared = prepare(config)
    study, created = _create_or_resume(prepared)
    _log.info(
        "%s study %s in %s (device %s)",
        "created" if created else "resuming",
        prepared.study_name,
        mask_url(config.storage),
        prepared.device,
    )
    with trial_tools(prepared) as tools:
        if tools.gpu_reason is not None:
            _log.info("GPU memory guard off (%s)", tools.gpu_reason)
        space, ceiling = study_space_and_ceiling(prepared, study, tools.supervisor)
        _log_ceiling(space, ceiling)
        model, space = _pipeline_model(prepared, study, tools.supervisor, space)
        if model is None and config.sampler == MODEL_STRATEGY:
            _log.info("no pipeline model (see the warning above): the search runs as gp")
        runner = make_runner(prepared, tools, space, ceiling, model)
        _enqueue_first_trials(prepared, study, space, model)
        study = _with_sampler(prepared, study)
        clock.end("set-up", tools.supervisor)
        trials_run = _run_trials(prepared, study, runner)
        clock.end("trials", tools.supervisor)  # with the early-stop checks' re-measurements
        medians = remeasure(
            study,
            runner,
            final_candidates(study, config.remeasure_top),
            config.remeasure_rounds,
            config.storage,
            sys.stderr,
            config.progress,
        )
        clock.end("re-measuring", tools.supervisor)
    with storage_lock(config.storage, prepared.study_name), deferred():
        with_retry(
            lambda: record_phases(study, clock.seconds, clock.children),
            "recording the phases' time",
        )
        with_retry(lambda: _record_kept_defaults(config, study, space, model), "recording")
        with_retry(lambda: save_study_note(study), "writing the study note")
    best = best_trial(study)
    return StudyResult(study, trials_run, best, medians, space.batch_param)


def _record_kept_defaults(
    config: StudyConfig, study: optuna.Study, space: SearchSpace, model: PipelineModel | None
) -> None:
    """Under ``--sampler model``, which loader knobs the pick keeps at the model's default and
    why; under another sampler, which samples them all, none."""
    if model is not None and config.sampler == MODEL_STRATEGY:
        _pipeline.record_kept_defaults(study, space, model)
    elif loader_defaults_kept(study.user_attrs):
        record_loader_defaults_kept(study, {})


class _PhaseClock:
    """Each phase's wall time and the trial children it started, as the run ends one phase
    and begins the next."""

    def __init__(self, started: float) -> None:
        self.seconds: dict[str, float] = {}
        self.children: dict[str, int] = {}
        self._since, self._children_before = started, 0

    def end(self, phase: str, supervisor: Supervisor) -> None:
        """End ``phase`` now; the next one starts here."""
        now, started = time.monotonic(), supervisor.children_started
        self.seconds[phase] = now - self._since
        self.children[phase] = started - self._children_before
        self._since, self._children_before = now, started


def _create_or_resume(prepared: PreparedStudy) -> tuple[optuna.Study, bool]:
    """Create the study (attrs, metric name, baselines) exactly once across a fleet."""
    config = prepared.config
    with storage_lock(config.storage, prepared.study_name):
        study = optuna.create_study(
            storage=prepared.storage,
            study_name=prepared.study_name,
            direction="maximize",
            load_if_exists=True,
        )
        created = "profile" not in study.user_attrs
        if created:
            with deferred():  # all of a new study's attrs, or none of them
                study.set_metric_names([METRIC_NAME])
                study.set_user_attr("profile", dataclasses.asdict(prepared.profile))
                study.set_user_attr(
                    "workload", prepared.workload.description or prepared.workload.name
                )
                study.set_user_attr("objective", config.objective)
                study.set_user_attr(BATCH_PARAM_ATTR, prepared.workload.batch_param)
                study.set_user_attr("workload_options", config.objective_options)
                study.set_user_attr("tuner_version", __version__)
                study.set_user_attr(NPROC_ATTR, prepared.nproc_per_node)
        _check_same_objective(prepared, study)
        stored_options = study.user_attrs.get("workload_options", {})
        if stored_options != config.objective_options:
            raise ConfigError(
                f"study {prepared.study_name} was created with workload options {stored_options}; "
                "use the same options or another --study-name"
            )
    return study, created


def _check_same_objective(prepared: PreparedStudy, study: optuna.Study) -> None:
    """Refuse to add trials of one workload, or one rank count, to a study another created (a
    reused ``--study-name``): their samples/sec are not comparable. File paths compare by file
    name."""
    ranks = study.user_attrs.get(NPROC_ATTR, 1)
    if ranks != prepared.nproc_per_node:
        raise ConfigError(
            f"study {prepared.study_name} was tuned for --nproc-per-node {ranks}; "
            f"use --nproc-per-node {ranks} or another --study-name"
        )
    stored = study.user_attrs.get("objective")
    if stored is not None and objective_label(stored) != objective_label(prepared.config.objective):
        raise ConfigError(
            f"study {prepared.study_name} was created for objective {stored}; "
            f"use --objective {stored} or another --study-name"
        )


def _pipeline_model(
    prepared: PreparedStudy, study: optuna.Study, supervisor: Supervisor, space: SearchSpace
) -> tuple[PipelineModel | None, SearchSpace]:
    """Profile the pipeline (once per study); the model, and the space with its worker range."""
    profile = _pipeline.profile_pipeline(prepared, study, supervisor, space)
    if profile is None:
        return None, space
    config, host_limit = prepared.config, prepared.limits.host_bytes
    if host_limit is not None:  # the ranks share the host's memory: each models its share
        host_limit //= prepared.nproc_per_node
    space = _pipeline.model_space(study, config.storage, space, profile, host_limit)
    model = PipelineModel.build(profile, space, host_limit)
    once_per_study(study, config.storage, BOUND_ATTR, lambda: model.bound)
    _log.info(
        "model: bound %s samples/s (the most the pipeline allows here); num_workers 0..%d",
        f"{model.bound:,.0f}",
        space.max_workers,
    )
    return model, space


def _log_ceiling(space: SearchSpace, ceiling: float | None) -> None:
    """The set-up's first result: the ceiling, and the largest batch the search tries."""
    if ceiling is not None:
        batches = space.batch_choices()
        _log.info(
            "ceiling: %s samples/s; batch %d..%d",
            f"{ceiling:,.0f}",
            batches[0],
            batches[-1],
        )


def _enqueue_first_trials(
    prepared: PreparedStudy,
    study: optuna.Study,
    space: SearchSpace,
    model: PipelineModel | None,
) -> None:
    """The baselines, the model's seeds (under ``--sampler model``), then the warm start from
    similar profiles: once per study, under the lock, all of them or (a stop signal deferred
    until they are queued) none."""
    config = prepared.config
    with storage_lock(config.storage, prepared.study_name), deferred():
        if enqueue_baselines(
            study, space, prepared.fingerprint.physical_cores, prepared.nproc_per_node
        ):
            if model is not None and config.sampler == MODEL_STRATEGY:
                _pipeline.enqueue_model_seed(study, space, model)
                _log.info(
                    "model: its predicted best first (%s samples/s predicted), then its "
                    "corrected picks and the best's neighbours",
                    f"{model.predict(model.best):,.0f}",
                )
            sources = enqueue_warm_start(study, config.objective, prepared.profile, space)
            if sources:
                _log.info("warm start from %s", ", ".join(sources))


def _with_sampler(prepared: PreparedStudy, study: optuna.Study) -> optuna.Study:
    """The study loaded with this run's sampler and pruner; the seed moves on by its trials."""
    config = prepared.config
    trials_before = len(study.get_trials(deepcopy=False))
    return optuna.load_study(
        study_name=prepared.study_name,
        storage=prepared.storage,
        sampler=make_sampler(config.sampler, resumed_seed(config.seed, trials_before)),
        pruner=make_pruner(config.sampler),
    )


def _run_trials(prepared: PreparedStudy, study: optuna.Study, runner: TrialRunner) -> int:
    """Trials until ``--n-trials``, ``--timeout``, the fleet's total, or the ceiling stop."""
    config = prepared.config
    started = time.monotonic()
    trials_run = 0
    stale = StaleTrials(config.heartbeat_interval, config.grace_period)
    total = (
        config.n_trials
        if config.total_trials is None
        else min(config.n_trials or config.total_trials, config.total_trials)
    )
    with tqdm(
        total=total,
        desc=prepared.study_name,
        file=sys.stderr,
        disable=not config.progress,
        unit="trial",
    ) as bar:
        while config.n_trials is None or trials_run < config.n_trials:
            if config.timeout is not None and time.monotonic() - started >= config.timeout:
                break
            _propose(prepared, study, runner)
            asked = with_retry(lambda: _ask(study, prepared, stale), "asking for a trial")
            if asked is None:
                break
            if asked == "wait":
                time.sleep(min(2.0, config.heartbeat_interval))
                continue
            assert isinstance(asked, optuna.Trial)
            state, reason = _run_one(prepared, study, runner, asked)
            trials_run += 1
            postfix = with_retry(
                functools.partial(_postfix, study, asked.number, state, reason), "reading the best"
            )
            bar.set_postfix_str(postfix, refresh=False)
            bar.update()
            runner = _grown(prepared, study, runner)
            stop = _stop_near_ceiling(study, runner, config) or _stop_near_bound(
                study, runner, config
            )
            if stop is not None:
                bar.close()
                _log.info("%s", stop)
                break
    return trials_run


def _run_one(
    prepared: PreparedStudy, study: optuna.Study, runner: TrialRunner, trial: optuna.Trial
) -> tuple[str, str | None]:
    """One trial under its heartbeat; its state and pruned reason."""
    with heartbeat(study._storage, trial._trial_id, prepared.config.heartbeat_interval):
        try:
            outcome = runner.run(study, trial)
        except SearchSpaceChanged as error:
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            raise ConfigError(
                f"study {prepared.study_name} was tuned with another search space ({error}); "
                "use the same flags or another --study-name"
            ) from None
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM (tuner._signals)
            # The supervisor has killed the child; leave no RUNNING trial behind.
            _fail_stopped(study, trial, stop_reason(stop))
            raise
    return outcome.state, outcome.reason


def _fail_stopped(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
    """Fail a trial a stop signal cut short, with ``reason``; one told before it stays as told."""
    try:
        trial.set_user_attr("error", reason)
    except optuna.exceptions.UpdateFinishedTrialError:
        return
    study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)


def _ask(
    study: optuna.Study, prepared: PreparedStudy, stale: StaleTrials
) -> optuna.Trial | str | None:
    """A new trial, ``None`` when the fleet's total is reached, ``"wait"`` while others finish."""
    total = prepared.config.total_trials
    stale.fail(study)
    if total is None:
        return study.ask()
    with storage_lock(prepared.config.storage, prepared.study_name):
        trials = study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
        finished = sum(trial.state in FINISHED for trial in trials)
        running = len(trials) - finished
        if finished >= total:
            return None
        if finished + running >= total:
            return "wait"
        return study.ask()


def _propose(prepared: PreparedStudy, study: optuna.Study, runner: TrialRunner) -> None:
    """Under ``--sampler model``: queue the model's next setting when no trial waits (with
    nothing left to propose, the stop after the last trial has already ended the study)."""
    model = runner.model
    if model is None or prepared.config.sampler != MODEL_STRATEGY:
        return
    with_retry(
        lambda: _pipeline.enqueue_next_setting(study, prepared.config.storage, runner.space, model),
        "queueing the model's next setting",
    )


def _stop_near_bound(study: optuna.Study, runner: TrialRunner, config: StudyConfig) -> str | None:
    """Under ``--sampler model``: stop once the re-measured best is near the bound or held
    against all its neighbours; the candidate is re-measured first, as near the ceiling."""
    model = runner.model
    if model is None or config.sampler != MODEL_STRATEGY:
        return None
    space = runner.space
    candidate = with_retry(
        lambda: _pipeline.bound_stop_candidate(study, model, space), "reading the best"
    )
    if candidate is None:
        return None
    if candidate.number not in remeasured(study):
        rounds = max(2, config.remeasure_rounds)
        remeasure(study, runner, [candidate], rounds, config.storage, sys.stderr, False)
        candidate = None  # its re-measured median may leave another trial the best: ask again
    return with_retry(
        lambda: _pipeline.bound_stop_message(study, model, space, candidate), "reading the best"
    )


def _grown(prepared: PreparedStudy, study: optuna.Study, runner: TrialRunner) -> TrialRunner:
    """The runner over a wider worker range when the best sits at its edge waiting for data
    with CPUs idle; the same runner otherwise."""
    model = runner.model
    if model is None:
        return runner
    grown = with_retry(
        lambda: _pipeline.grow_worker_range(
            study,
            prepared.config.storage,
            runner.space,
            model.profile,
            prepared.limits.host_bytes,
        ),
        "growing the space",
    )
    if grown is None:
        return runner
    _log.info("num_workers range grown to 0..%d", grown.max_workers)
    return dataclasses.replace(runner, space=grown)


def _stop_near_ceiling(study: optuna.Study, runner: TrialRunner, config: StudyConfig) -> str | None:
    """The early-stop message once a re-measured best is within 2% of the ceiling, else None.

    A best whose single window comes that near is re-measured first (two fresh rounds): the
    stop is final, and one disturbed window must not decide it.
    """
    min_trials = 2 + N_STARTUP_TRIALS
    candidate = with_retry(lambda: near_ceiling(study, min_trials), "reading the best")
    if candidate is not None and candidate.number not in remeasured(study):
        rounds = max(2, config.remeasure_rounds)
        remeasure(study, runner, [candidate], rounds, config.storage, sys.stderr, False)
    return with_retry(lambda: ceiling_stop_message(study, min_trials), "reading the best")


def _postfix(study: optuna.Study, number: int, state: str, reason: str | None) -> str:
    try:
        best = f"top window {study.best_value:,.0f} samples/s"
    except ValueError:
        best = "no result yet"
    last = f"#{number} {state}" + (f" ({reason})" if reason else "")
    return f"{best}; {last}"
