"""``python -m tuner.study`` end to end, as a user runs it: the guard's verdicts in the study.

Each test runs the CLI as a subprocess on a real SQLite file and reads the study back with
Optuna, so what is checked is what ``tuner.best`` and the dashboard will see.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from tests.conftest import run_cli
from tests.tuner_tests.workloads import SHM_FILE_PREFIX, SHM_FILL_SHARE
from tuner.machine._memory import shm_usage
from tuner.search._settings import LoaderSettings

pytestmark = pytest.mark.slow

MiB = 2**20
GiB = 2**30


def load_trials(db: Path) -> list[FrozenTrial]:
    """The trials of the one study in ``db``."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{db}")
    return study.get_trials(deepcopy=False)


def study_cli(db: Path, objective: str, *flags: str, cwd: Path, returncode: int = 0) -> str:
    """Run the study; check its exit status; its stderr."""
    result = run_cli(
        "tuner.study",
        "--hardware",
        "auto",
        "--objective",
        objective,
        "--storage",
        f"sqlite:///{db}",
        "--no-progress",
        "--remeasure-top",
        "0",
        *flags,
        cwd=cwd,
        timeout=240,
    )
    assert result.returncode == returncode, result.stderr
    return result.stderr


def test_leaky_study_stops_each_leak_before_the_limit_and_walls_only_confirmed_breaches(
    tmp_path: Path,
) -> None:
    db = tmp_path / "t.db"
    stderr = study_cli(
        db,
        "tests.tuner_tests.workloads:leaky",
        "--n-trials",
        "3",
        "--trial-seconds",
        "20",
        "--memory-limit",
        "1.5GiB",
        "--no-probe-batch",
        cwd=tmp_path,
        returncode=1,  # a run with no completed trial has no answer to give
    )
    assert "no trial completed" in stderr.splitlines()[-1]

    trials = load_trials(db)
    assert len(trials) == 3
    assert all(trial.state == TrialState.PRUNED for trial in trials)
    guarded = [t for t in trials if t.user_attrs["pruned_reason"] == "memory_guard: host"]
    walled = [t for t in trials if t.user_attrs["pruned_reason"] == "memory_wall"]
    assert len(guarded) + len(walled) == 3
    # The baselines run first and are never skipped by the wall: both meet the guard.
    assert {t.user_attrs.get("baseline") for t in guarded} >= {"pytorch-default", "rule-of-thumb"}
    for trial in guarded:
        attrs = trial.user_attrs
        assert attrs["guard_limit_bytes"] == 1.5 * GiB
        assert attrs["guard_reading_bytes"] < 1.5 * GiB
        assert 0 < attrs["peak_host_memory_bytes"] < 1.5 * GiB
        assert attrs["kill_seconds"] >= 0
        assert trial.constraints == {"memory": 1.0}
    # A leak is seen coming: stopped on a prediction, which makes no wall.
    assert any(t.user_attrs["guard_predicted"] for t in guarded)
    by_number = {trial.number: trial for trial in trials}
    for trial in walled:
        wall = by_number[trial.user_attrs["dominated_by"]]
        assert wall.number < trial.number
        assert wall.user_attrs["pruned_reason"] == "memory_guard: host"
        assert wall.user_attrs["guard_predicted"] is False
        settings = LoaderSettings.from_attrs(trial.user_attrs["settings"])
        assert settings.dominates(LoaderSettings.from_attrs(wall.user_attrs["settings"]))
        assert trial.constraints == {"memory": 1.0}
        assert "peak_host_memory_bytes" not in trial.user_attrs  # skipped, never run


def test_fast_study_is_never_stopped_by_the_guard(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    study_cli(
        db,
        "tests.tuner_tests.workloads:fast",
        "--sampler",
        "gp",  # every trial asked for runs (the default model may stop on a held best first)
        "--n-trials",
        "5",
        "--trial-seconds",
        "0.5",
        "--warmup-seconds",
        "0.2",
        "--seed",
        "1",
        cwd=tmp_path,
    )

    trials = load_trials(db)
    assert len(trials) == 5
    for trial in trials:
        attrs = trial.user_attrs
        assert trial.state == TrialState.COMPLETE, attrs
        assert "pruned_reason" not in attrs and "guard_reading_bytes" not in attrs
        assert attrs["peak_host_memory_bytes"] > 0
        assert trial.value == attrs["samples_per_sec"] > 0
        assert LoaderSettings.from_attrs(attrs["settings"]).batch in (8, 16, 32, 64)
        assert trial.constraints == {"memory": 0.0}
    # The mix: the main-process baseline and settings with workers both ran.
    assert {LoaderSettings.from_attrs(t.user_attrs["settings"]).num_workers for t in trials} > {0}


def test_a_trial_that_fills_dev_shm_is_pruned_by_the_shm_limit(tmp_path: Path) -> None:
    """``--shm-limit`` a little above what /dev/shm holds now; the workload's processes each
    write an eighth of what was free (:class:`~tests.tuner_tests.workloads.ShmFilling`)."""
    usage = shm_usage()
    assert usage is not None, "no /dev/shm on this machine"
    room = min(64 * MiB, (usage.total_bytes - usage.used_bytes) // (2 * SHM_FILL_SHARE))
    limit = usage.used_bytes + room
    db = tmp_path / "t.db"
    try:
        stderr = study_cli(
            db,
            "tests.tuner_tests.workloads:shm_filling",
            "--n-trials",
            "2",
            "--trial-seconds",
            "20",
            "--shm-limit",
            str(limit),
            "--no-probe-batch",
            cwd=tmp_path,
            returncode=1,  # no trial completes: every one fills /dev/shm
        )
    finally:
        for path in glob.glob(f"/dev/shm/{SHM_FILE_PREFIX}*"):
            os.unlink(path)
    assert "no trial completed" in stderr.splitlines()[-1]
    trials = load_trials(db)
    assert trials and all(trial.state == TrialState.PRUNED for trial in trials)
    guarded = [t for t in trials if t.user_attrs["pruned_reason"] == "memory_guard: shm"]
    assert guarded and guarded[0].number == 0  # the first baseline ran, and filled /dev/shm
    for trial in guarded:
        assert trial.user_attrs["guard_limit_bytes"] == limit
        assert trial.user_attrs["guard_reading_bytes"] > usage.used_bytes  # the fill was seen
    for trial in trials:
        if trial not in guarded:  # skipped: at least as large as a setting that did not fit
            assert trial.user_attrs["pruned_reason"] == "memory_wall", trial.user_attrs
            assert trial.user_attrs["dominated_by"] in [t.number for t in guarded]
