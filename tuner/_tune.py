"""``tuner.tune``: a study run from Python, the same run as ``dataloader-tuner study``.

Both build a :class:`~tuner.run.StudyConfig` and call :func:`~tuner.run.run_study`; this one
prints nothing on stdout. What the run does (each set-up phase, early stops) is logged to the
``tuner.run`` logger at INFO, which shows only where the caller configures logging; a progress bar
goes to stderr only with ``show_progress_bar=True``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from storage import default_storage_url
from tuner.insight import BestSetting, NoResultError, study_best
from tuner.run import StudyConfig, no_result_message, run_study

__all__ = ["tune"]

_log = logging.getLogger("tuner.run")


def tune(
    objective: str,
    *,
    hardware: str = "auto",
    n_trials: int | None = 20,
    timeout: float | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    profiles_file: str | None = None,
    objective_options: Mapping[str, Any] | None = None,
    sampler: str = StudyConfig.sampler,
    seed: int | None = None,
    device: str = "auto",
    fix: Mapping[str, Any] | None = None,
    effective_batch: int | None = None,
    multiprocessing_context: str | None = None,
    trial_seconds: float = StudyConfig.trial_seconds,
    warmup_seconds: float = StudyConfig.warmup_seconds,
    trial_timeout: float | None = None,
    probe_batch: bool = True,
    remeasure_top: int = StudyConfig.remeasure_top,
    remeasure_rounds: int = StudyConfig.remeasure_rounds,
    memory_limit: str | None = None,
    shm_limit: str | None = None,
    gpu_memory_limit: str | None = None,
    total_trials: int | None = None,
    heartbeat_interval: int = StudyConfig.heartbeat_interval,
    grace_period: int | None = None,
    artifact_dir: str | None = None,
    show_progress_bar: bool = False,
    nproc_per_node: int | str = 1,
) -> BestSetting:
    """Tune ``objective``'s DataLoader on this machine and return the best setting.

    The run is the one ``dataloader-tuner study`` makes (each keyword is the flag of the same
    name; ``dataloader-tuner study --help`` and docs/cli.md say more). A study that exists is
    resumed: its trials count towards the result.

    Args:
        objective: ``"image"``, ``"text"``, ``"storage"`` (the built-in workloads), or your
            own as ``"pkg.module:attr"`` or ``"path/file.py:attr"``, where ``attr`` is an
            :class:`objectives.Workload` or a function returning one. User code is imported
            and run, in this process and in each trial's child.
        hardware: a profile name from the catalog, or ``"auto"`` for this machine.
        n_trials: trials for this call; None runs until ``timeout`` or ``total_trials``.
        timeout: seconds for this whole call; None for no limit.
        storage: a database URL; None is ``$TUNER_STORAGE``, else ``sqlite:///tuner.db``.
        study_name: None names the study ``<objective>@<profile>``.
        profiles_file: a JSON catalog of more hardware profiles.
        objective_options: a built-in workload's options, e.g. ``{"samples": 512}``.
        sampler: ``"model"``, ``"gp"``, ``"tpe"`` or ``"random"``.
        seed: the sampler's seed, for a repeatable search.
        device: ``"auto"``, ``"cpu"`` or ``"cuda[:N]"``.
        fix: parameters to freeze, e.g. ``{"batch_size": 64}``.
        effective_batch: keep this effective batch through gradient accumulation.
        multiprocessing_context: the workers' start method (``"fork"``, ``"spawn"``,
            ``"forkserver"``); None for the platform's.
        trial_seconds: each trial's measurement window.
        warmup_seconds: each trial's run before its window.
        trial_timeout: seconds before a trial is killed as hung; None for 60 + 3x its windows.
        probe_batch: find the largest batch that fits first.
        remeasure_top: settings re-measured side by side at the end (0: none).
        remeasure_rounds: hold-out rounds of the pick and the baselines after the selection;
            their median is the returned figure.
        memory_limit: host memory budget, a size (``"12G"``) or a share (``"80%"``); None for
            90% of RAM or the cgroup limit.
        shm_limit: ``/dev/shm`` budget; None for 90% of it.
        gpu_memory_limit: device memory budget; None for 95% of the device.
        total_trials: stop once the study holds this many finished trials (a fleet's total).
        heartbeat_interval: seconds between a running trial's heartbeats.
        grace_period: seconds without a heartbeat before a trial is failed and retried.
        artifact_dir: the trials' artifact store; None for ``tuner-artifacts`` beside an
            SQLite file, else ``./tuner-artifacts``.
        show_progress_bar: a progress bar on stderr.
        nproc_per_node: training processes per node, as ``torchrun --nproc-per-node``: each
            trial runs that many ranks, and the study is that rank count's; ``"auto"`` is the
            CUDA GPU count, else 1.

    Returns:
        The study's best setting (:class:`BestSetting`), as :func:`tuner.best_setting` reads
        it afterwards.

    Raises:
        NoResultError: no trial of the study completed (every one failed or was pruned).
        KeyboardInterrupt: Ctrl-C, or SIGTERM as its subclass :class:`tuner.Terminated`, once
            the running trial's processes are gone and the trial is failed. In the main
            thread, where SIGTERM's handler is the default, the call handles SIGTERM so and
            restores the handler on return; a handler of the caller's own is left alone.
        ValueError: an argument this machine or the storage cannot honour (an unknown
            profile, a bad limit, a storage URL that cannot be opened, ...), raised before
            anything is written.

    Example::

        import tuner

        best = tuner.tune(objective="mypkg.data:workload", n_trials=20)
        loader = DataLoader(dataset, **best.dataloader_kwargs)
    """
    config = StudyConfig(
        hardware=hardware,
        objective=objective,
        objective_options=dict(objective_options or {}),
        storage=storage or default_storage_url(),
        study_name=study_name,
        n_trials=n_trials,
        total_trials=total_trials,
        timeout=timeout,
        device=device,
        seed=seed,
        trial_seconds=trial_seconds,
        warmup_seconds=warmup_seconds,
        trial_timeout=trial_timeout,
        fix=[f"{name}={value}" for name, value in (fix or {}).items()],
        effective_batch=effective_batch,
        sampler=sampler,
        memory_limit=memory_limit,
        shm_limit=shm_limit,
        gpu_memory_limit=gpu_memory_limit,
        probe_batch=probe_batch,
        remeasure_top=remeasure_top,
        remeasure_rounds=remeasure_rounds,
        multiprocessing_context=multiprocessing_context,
        heartbeat_interval=heartbeat_interval,
        grace_period=grace_period,
        profiles_file=profiles_file,
        artifact_dir=artifact_dir,
        progress=show_progress_bar,
        nproc_per_node=nproc_per_node,
    )
    result = run_study(config)
    best = study_best(result.study)
    if best is None:
        raise NoResultError(no_result_message(result.study))
    _log.info("%s", best.summary())
    return best
