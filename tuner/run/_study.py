"""A tuning run: validate everything, create or resume the study, run trials, re-measure, report.

Processes and what survives them: this study process owns the Optuna study, the database
connection and the guard; each trial runs in a child (:mod:`tuner.trial._supervisor`). A child that
dies costs one trial. This process dying leaves its RUNNING trial to the heartbeat: another
worker fails it and runs the re-queued copy. A database restart is ridden out by ``with_retry``.
Every check that can refuse the run happens in :func:`prepare`, before anything is written.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any, TextIO

import optuna
import torch
from optuna.storages import BaseStorage, fail_stale_trials
from optuna.trial import TrialState
from tqdm import tqdm

from objectives import Workload, load_workload
from storage import mask_url, open_storage, storage_lock, with_retry
from tuner import __version__
from tuner._naming import (
    BOUND_ATTR,
    CEILING_ATTR,
    METRIC_NAME,
    STEP_CPU_ATTR,
    STEP_RATES_ATTR,
    study_name,
)
from tuner.fleet._heartbeat import heartbeat
from tuner.fleet._warm_start import enqueue_warm_start
from tuner.insight._note import save_study_note
from tuner.insight._summary import print_summary, remeasured
from tuner.machine import _hardware
from tuner.machine._gpu import GpuReader, open_gpu_reader
from tuner.pipeline import PipelineModel
from tuner.run import _pipeline
from tuner.run._ceiling import ceiling_stop_message, near_ceiling
from tuner.run._probe import probe_max_batch
from tuner.run._remeasure import final_candidates, remeasure
from tuner.run._runner import SearchSpaceChanged, TrialRunner
from tuner.search._baselines import enqueue_baselines
from tuner.search._pruner import BelowBestPruner
from tuner.search._space import SearchSpace, SpaceError
from tuner.trial._artifacts import open_artifact_store
from tuner.trial._guard import GuardLimits, MemoryGuard, default_limits
from tuner.trial._supervisor import Supervisor

__all__ = [
    "SAMPLERS",
    "ConfigError",
    "StudyConfig",
    "make_pruner",
    "make_sampler",
    "prepare",
    "run_study",
]

_log = logging.getLogger("tuner")

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class ConfigError(ValueError):
    """An argument that cannot be honoured; one line, exit code 2."""


@dataclasses.dataclass
class StudyConfig:
    hardware: str
    objective: str = "image"
    objective_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    storage: str = "sqlite:///tuner.db"
    study_name: str | None = None
    n_trials: int | None = 20
    total_trials: int | None = None
    timeout: float | None = None
    device: str = "auto"
    seed: int | None = None
    trial_seconds: float = 3.0
    warmup_seconds: float = 1.0
    trial_timeout: float | None = None
    fix: list[str] = dataclasses.field(default_factory=list)
    effective_batch: int | None = None
    sampler: str = "gp"
    memory_limit: str | None = None
    shm_limit: str | None = None
    gpu_memory_limit: str | None = None
    probe_batch: bool = True
    remeasure_top: int = 3
    remeasure_rounds: int = 2
    multiprocessing_context: str | None = None
    heartbeat_interval: int = 10
    grace_period: int | None = None
    profiles_file: str | None = None
    artifact_dir: str | None = None
    progress: bool = True


@dataclasses.dataclass
class PreparedStudy:
    """A validated run: nothing has been written yet."""

    config: StudyConfig
    profile: _hardware.Profile
    fingerprint: _hardware.Fingerprint
    workload: Workload
    space: SearchSpace
    device: str
    limits: GuardLimits
    storage: BaseStorage
    study_name: str


def _resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {requested}: CUDA is not available on this machine")
        return requested
    if requested == "cpu":
        return requested
    raise ConfigError(f"--device must be auto, cpu or cuda[:N], got {requested!r}")


def _gpu_index(device: str) -> int:
    """The device's index for NVML: ``cuda:N`` is N (NVML counts as CUDA does by default)."""
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


def prepare(config: StudyConfig) -> PreparedStudy:
    """Check every argument against this machine and the storage; raise one-line errors."""
    for name in ("n_trials", "total_trials", "effective_batch", "trial_timeout", "timeout"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if config.trial_seconds <= 0 or config.warmup_seconds < 0:
        raise ConfigError("--trial-seconds must be positive and --warmup-seconds not negative")
    if config.sampler not in SAMPLERS:
        raise ConfigError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {config.sampler!r}")
    fingerprint = _hardware.detect_fingerprint()
    catalog = _hardware.load_catalog(config.profiles_file)
    profile = _hardware.resolve_profile(config.hardware, catalog, fingerprint)
    differences = _hardware.profile_mismatches(profile, fingerprint)
    if differences and config.hardware != _hardware.AUTO_PROFILE:
        raise ConfigError(
            f"this machine does not match profile {profile.name}: {'; '.join(differences)}"
            " (use --hardware auto to tune this machine as it is)"
        )
    workload = load_workload(config.objective, config.objective_options)
    device = _resolve_device(config.device)
    max_workers = max(0, min(2 * fingerprint.logical_cpus, 2 * profile.vcpus))
    space = SearchSpace(
        workload=workload,
        max_workers=max_workers,
        max_threads=max(1, fingerprint.usable_cpus),
        cuda=device.startswith("cuda"),
        effective_batch=config.effective_batch,
        multiprocessing_context=config.multiprocessing_context,
    )
    if config.effective_batch is not None:
        low, high = workload.batch_size_range
        if not [
            b for b in space.batch_choices() if low <= b <= high and config.effective_batch % b == 0
        ]:
            raise SpaceError(
                f"--effective-batch {config.effective_batch}: "
                f"no power of two in {low}..{high} divides it"
            )
    space = dataclasses.replace(space, fixed=space.parse_fixed(config.fix))
    gpu_total = None
    if space.cuda:
        reader = open_gpu_reader(_log)
        totals = {d.index: d.memory_total_bytes for d in reader.devices()}
        gpu_total = totals.get(_gpu_index(device))
        reader.close()
    try:
        limits = default_limits(
            config.memory_limit, config.shm_limit, config.gpu_memory_limit, gpu_total
        )
    except ValueError as error:
        raise ConfigError(f"memory limit: {error}") from None
    storage = open_storage(
        config.storage,
        heartbeat_interval=config.heartbeat_interval,
        grace_period=config.grace_period,
    )
    name = config.study_name or study_name(config.objective, profile.name)
    return PreparedStudy(
        config, profile, fingerprint, workload, space, device, limits, storage, name
    )


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
            study.set_metric_names([METRIC_NAME])
            study.set_user_attr("profile", dataclasses.asdict(prepared.profile))
            study.set_user_attr("workload", prepared.workload.description or prepared.workload.name)
            study.set_user_attr("objective", config.objective)
            study.set_user_attr("batch_param", prepared.workload.batch_param)
            study.set_user_attr("workload_options", config.objective_options)
            study.set_user_attr("tuner_version", __version__)
        stored_options = study.user_attrs.get("workload_options", {})
        if stored_options != config.objective_options:
            raise ConfigError(
                f"study {prepared.study_name} was created with workload options {stored_options}; "
                "use the same options or another --study-name"
            )
    return study, created


def _probe(prepared: PreparedStudy, study: optuna.Study, supervisor: Supervisor) -> int | None:
    """The study's ``max_batch_size``: probed once, by whichever worker gets there first."""
    if "max_batch_size" in study.user_attrs:
        return study.user_attrs["max_batch_size"]
    space = prepared.space
    if not prepared.config.probe_batch or space.batch_param in space.fixed:
        return None
    candidates = space.batch_choices()
    if space.batch_param == "batch_size":
        candidates = [
            b for b in candidates if b <= max(candidates[0], len(prepared.workload.dataset))
        ]
    # Memory, not speed, is probed: one intra-op thread, which no machine makes pathological.
    settings = space.settings(
        0, candidates[0], None, False, space.cuda, 1, prepared.workload.default_knobs
    )
    job = _runner(prepared, supervisor).job(settings)

    def probe(batches: list[int]) -> tuple[int | None, str | None]:
        if not batches:
            return None, None
        deadline_s = _trial_deadline(prepared.config) * 2
        return probe_max_batch(supervisor, job, settings, batches, deadline_s=deadline_s)

    # The largest first: on a roomy machine it fits, and one run settles the probe. Else double
    # from the batch the user trains with, as Lightning's finder does; only if even that does
    # not fit, look below it.
    largest, reason = probe(candidates[-1:])
    default = space.clamp_batch(prepared.workload.default_batch_size)
    for batches in (
        [b for b in candidates[:-1] if b >= default],
        [b for b in candidates if b < default],
    ):
        if largest is not None:
            break
        largest, next_reason = probe(batches)
        reason = next_reason or reason
    if largest is None:
        raise ConfigError(
            f"even batch {candidates[0]} does not fit under the memory limits ({reason}); "
            "raise --memory-limit/--gpu-memory-limit or use a smaller workload"
        )
    with storage_lock(prepared.config.storage, prepared.study_name):
        attrs = study.user_attrs  # a fresh read: another worker may have probed meanwhile
        if "max_batch_size" not in attrs:
            study.set_user_attr("max_batch_size", largest)
            return largest
        return attrs["max_batch_size"]


def _ceiling(prepared: PreparedStudy, study: optuna.Study, runner: TrialRunner) -> float | None:
    """The study's ``ceiling_samples_per_sec``: the step alone on prepared data, measured once."""
    if CEILING_ATTR in study.user_attrs:
        return float(study.user_attrs[CEILING_ATTR])
    space, config = prepared.space, prepared.config
    batches = space.batch_choices()
    settings = space.settings(
        0, batches[-1], None, False, False, 1, prepared.workload.default_knobs
    )
    job = {
        **runner.job(settings),
        "mode": "ceiling",
        "batches": batches,
        "threads": sorted({1, space.max_threads}),
        # Short windows over every batch size: the ceiling is their maximum, so a reading
        # disturbed downwards rarely decides it, and a window this long holds several steps.
        "window_s": min(config.trial_seconds, CEILING_WINDOW_S),
        "warmup_s": min(config.warmup_seconds, CEILING_WINDOW_S / 2),
    }
    outcome = runner.supervisor.run(job, _trial_deadline(config) * 2)
    if outcome.state != "complete":
        _log.warning("ceiling not measured: %s", outcome.error or outcome.reason)
        return None
    ceiling = float(outcome.attrs[CEILING_ATTR])
    with storage_lock(prepared.config.storage, prepared.study_name):
        attrs = study.user_attrs  # a fresh read: another worker may have measured it meanwhile
        if CEILING_ATTR in attrs:
            return float(attrs[CEILING_ATTR])
        study.set_user_attr(CEILING_ATTR, ceiling)
        _store_step_rates(study, outcome.attrs)
    return ceiling


def _store_step_rates(study: optuna.Study, attrs: dict[str, Any]) -> None:
    """The step's rate per batch and thread count, for the pipeline profile (measured once)."""
    for key in (STEP_RATES_ATTR, STEP_CPU_ATTR):
        if key in attrs:
            study.set_user_attr(key, attrs[key])


def _pipeline_model(
    prepared: PreparedStudy, study: optuna.Study, runner: TrialRunner
) -> PipelineModel | None:
    """Profile the pipeline (once per study), set the worker range from it, build the model."""
    space, config = prepared.space, prepared.config
    settings = space.settings(
        0,
        space.clamp_batch(prepared.workload.default_batch_size),
        None,
        False,
        False,
        1,
        prepared.workload.default_knobs,
    )
    profile = _pipeline.profile_pipeline(
        study,
        config.storage,
        prepared.study_name,
        runner.supervisor,
        runner.job(settings),
        float(prepared.fingerprint.usable_cpus),
        space.batch_choices(),
        _trial_deadline(config),
    )
    if profile is None:
        return None
    host_limit = prepared.limits.host_bytes
    prepared.space = runner.space = _pipeline.model_space(
        study, config.storage, prepared.study_name, space, profile, host_limit
    )
    model = PipelineModel.build(profile, prepared.space, host_limit)
    if BOUND_ATTR not in study.user_attrs:
        with storage_lock(config.storage, prepared.study_name):
            study.set_user_attr(BOUND_ATTR, model.bound)
    return model


CEILING_WINDOW_S = 0.3


def _trial_deadline(config: StudyConfig) -> float:
    """How long a trial child may take before it is killed as hung."""
    if config.trial_timeout is not None:
        return config.trial_timeout
    return 60.0 + 3 * (config.warmup_seconds + config.trial_seconds)


def _runner(
    prepared: PreparedStudy, supervisor: Supervisor, gpu: GpuReader | None = None
) -> TrialRunner:
    config = prepared.config
    machine = {
        "profile": _hardware.auto_profile_name(prepared.fingerprint),
        **prepared.fingerprint.to_attrs(),
    }
    return TrialRunner(
        supervisor=supervisor,
        space=prepared.space,
        objective=str(Path(config.objective).resolve())
        if _is_file_objective(config.objective)
        else config.objective,
        objective_options=config.objective_options,
        device=prepared.device,
        window_s=config.trial_seconds,
        warmup_s=config.warmup_seconds,
        deadline_s=_trial_deadline(config),
        seed=config.seed or 0,
        machine_attrs=machine,
        gpu=gpu,
        gpu_index=_gpu_index(prepared.device) if gpu is not None else None,
        artifact_store=open_artifact_store(config.storage, config.artifact_dir),
    )


def _is_file_objective(objective: str) -> bool:
    return objective.rpartition(":")[0].endswith(".py")


def _ask(study: optuna.Study, prepared: PreparedStudy) -> optuna.Trial | str | None:
    """A new trial, ``None`` when the fleet's total is reached, ``"wait"`` while others finish."""
    total = prepared.config.total_trials
    fail_stale_trials(study)
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


N_STARTUP_TRIALS = 6
"""The samplers' random start; with the baselines, the trials before the study may stop early."""


SAMPLERS = ("gp", "tpe", "random", "model")
MODEL_STRATEGY = "model"
"""``--sampler model``: the pipeline model's best and neighbours first, then ``gp``, stopping once
the best is near the bound or the model's pick held."""


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """The sampler ``--sampler name`` runs: ``gp`` (also under ``model``), ``tpe`` or ``random``."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # group=True: the space is conditional (prefetch only with workers); constant_liar (on by
        # default in Optuna 5) keeps concurrent workers of a fleet from sampling the same point.
        tpe = optuna.samplers.TPESampler(seed=seed, group=True, n_startup_trials=N_STARTUP_TRIALS)
        if name == "tpe":
            return tpe
        # The Gaussian process models the parameters every trial has (workers, batch, threads,
        # knobs); TPE learns the conditional ones (prefetch, persistent workers) from the trials
        # that have them. Running trials of a fleet enter its acquisition as pending points.
        return optuna.samplers.GPSampler(
            seed=seed,
            n_startup_trials=N_STARTUP_TRIALS,
            independent_sampler=tpe,
            warn_independent_sampling=False,
        )


def make_pruner(sampler: str) -> optuna.pruners.BasePruner:
    """No early stopping under ``gp``: the Gaussian process learns from complete trials only,
    so a stopped trial would teach it nothing and leave the region open to be proposed again
    (replayed on measured grids, ``bench.replay``: ``gp`` unpruned found the top more often than
    ``tpe`` pruned or unpruned). TPE learns from stopped trials, so ``tpe`` keeps the pruner."""
    if sampler in ("gp", MODEL_STRATEGY):
        return optuna.pruners.NopPruner()
    return BelowBestPruner()


def _sampler(config: StudyConfig, trials_before: int) -> optuna.samplers.BaseSampler:
    # A resumed run with the same --seed would replay the first run's draws (the random sampler
    # exactly, TPE in its start and candidates): the seed moves on with the study.
    return make_sampler(
        config.sampler, None if config.seed is None else config.seed + trials_before
    )


@dataclasses.dataclass
class StudyResult:
    study: optuna.Study
    trials_run: int
    best_trial: optuna.trial.FrozenTrial | None
    remeasured: dict[int, float]


def run_study(config: StudyConfig, out: TextIO = sys.stderr) -> StudyResult:
    """Run the study described by ``config``; see the module docstring for what survives what."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # We run the heartbeat ourselves around ask/tell (see _heartbeat), which Optuna cannot see.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    prepared = prepare(config)
    study, created = _create_or_resume(prepared)
    print(
        f"{'created' if created else 'resuming'} study {prepared.study_name} "
        f"in {mask_url(config.storage)} (device {prepared.device})",
        file=out,
    )
    reader = open_gpu_reader(_log)
    if not reader.available:
        print(f"GPU memory guard off ({getattr(reader, 'reason', 'no GPU')})", file=out)
    gpu = reader if prepared.space.cuda and reader.available else None
    gpu_index = _gpu_index(prepared.device) if gpu is not None else None
    guard = MemoryGuard(prepared.limits, gpu=gpu, gpu_index=gpu_index)
    supervisor = Supervisor(guard)
    max_batch = _probe(prepared, study, supervisor)
    prepared.space = dataclasses.replace(prepared.space, max_batch=max_batch)
    runner = _runner(prepared, supervisor, gpu)
    runner.ceiling = _ceiling(prepared, study, runner)
    runner.model = _pipeline_model(prepared, study, runner)
    with storage_lock(config.storage, prepared.study_name):
        if enqueue_baselines(study, prepared.space, prepared.fingerprint.physical_cores):
            _seed_from_model(study, prepared, runner.model, out)
            sources = enqueue_warm_start(study, config.objective, prepared.profile, prepared.space)
            if sources:
                print(f"warm start from {', '.join(sources)}", file=out)
    trials_before = len(study.get_trials(deepcopy=False))
    study = optuna.load_study(
        study_name=prepared.study_name,
        storage=prepared.storage,
        sampler=_sampler(config, trials_before),
        pruner=make_pruner(config.sampler),
    )
    started = time.monotonic()
    trials_run = 0
    total = (
        config.n_trials
        if config.total_trials is None
        else min(config.n_trials or config.total_trials, config.total_trials)
    )
    bar = tqdm(
        total=total, desc=prepared.study_name, file=out, disable=not config.progress, unit="trial"
    )
    try:
        while config.n_trials is None or trials_run < config.n_trials:
            if config.timeout is not None and time.monotonic() - started >= config.timeout:
                break
            asked = with_retry(lambda: _ask(study, prepared), "asking for a trial")
            if asked is None:
                break
            if asked == "wait":
                time.sleep(min(2.0, config.heartbeat_interval))
                continue
            assert isinstance(asked, optuna.Trial)
            trial = asked
            with heartbeat(study._storage, trial._trial_id, config.heartbeat_interval):
                try:
                    outcome = runner.run(study, trial)
                except SearchSpaceChanged as error:
                    study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                    raise ConfigError(
                        f"study {prepared.study_name} was tuned with another search space "
                        f"({error}); "
                        "use the same flags or another --study-name"
                    ) from None
                except KeyboardInterrupt:
                    # The supervisor has killed the child; leave no RUNNING trial behind.
                    trial.set_user_attr("error", "interrupted")
                    study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                    raise
            trials_run += 1
            bar.set_postfix_str(
                _postfix(study, trial.number, outcome.state, outcome.reason), refresh=False
            )
            bar.update()
            _grow_space(study, prepared, runner, out)
            stop = _stop_near_ceiling(study, runner, config) or _stop_near_bound(
                study, runner, config
            )
            if stop is not None:
                bar.close()
                print(stop, file=out)
                break
    finally:
        bar.close()
    medians = remeasure(
        study,
        runner,
        final_candidates(study, config.remeasure_top),
        config.remeasure_rounds,
        config.storage,
        out,
        config.progress,
    )
    best = print_summary(study, prepared.space.batch_param, out=sys.stdout)
    with storage_lock(config.storage, prepared.study_name):
        with_retry(lambda: save_study_note(study), "writing the study note")
    return StudyResult(study, trials_run, best, medians)


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


def _seed_from_model(
    study: optuna.Study, prepared: PreparedStudy, model: PipelineModel | None, out: TextIO
) -> None:
    """Under ``--sampler model``: the model's best and neighbours right after the baselines."""
    if model is None or prepared.config.sampler != MODEL_STRATEGY:
        return
    count = _pipeline.enqueue_model_seeds(study, prepared.space, model)
    print(
        f"model: bound {model.bound:,.0f} samples/s; {count} seeds from its predicted best "
        f"({model.predict(model.best):,.0f} samples/s predicted)",
        file=out,
    )


def _stop_near_bound(study: optuna.Study, runner: TrialRunner, config: StudyConfig) -> str | None:
    """Under ``--sampler model``: stop once the re-measured best is near the bound or the
    model's seeded best held; the candidate is re-measured first, as near the ceiling."""
    model = runner.model
    if model is None or config.sampler != MODEL_STRATEGY:
        return None
    candidate = with_retry(lambda: _pipeline.bound_stop_candidate(study, model), "reading the best")
    if candidate is not None and candidate.number not in remeasured(study):
        rounds = max(2, config.remeasure_rounds)
        remeasure(study, runner, [candidate], rounds, config.storage, sys.stderr, False)
    return with_retry(lambda: _pipeline.bound_stop_message(study, model), "reading the best")


def _grow_space(
    study: optuna.Study, prepared: PreparedStudy, runner: TrialRunner, out: TextIO
) -> None:
    """Widen the worker range when the best sits at its edge waiting for data, CPUs idle."""
    if runner.model is None:
        return
    grown = with_retry(
        lambda: _pipeline.grow_worker_range(
            study,
            prepared.config.storage,
            prepared.study_name,
            prepared.space,
            runner.model.profile,
            prepared.limits.host_bytes,
        ),
        "growing the space",
    )
    if grown is not None:
        prepared.space = runner.space = grown
        print(f"num_workers range grown to 0..{grown.max_workers}", file=out)


def _postfix(study: optuna.Study, number: int, state: str, reason: str | None) -> str:
    try:
        best = f"best {study.best_value:,.0f} samples/s"
    except ValueError:
        best = "no result yet"
    last = f"#{number} {state}" + (f" ({reason})" if reason else "")
    return f"{best}; {last}"
