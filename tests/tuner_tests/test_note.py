"""The study's Markdown note: everything a user needs on the dashboard's first page, rewritten
whole each time, on a study of real measurements."""

from __future__ import annotations

import socket
import statistics

import optuna
import optuna_dashboard
import pytest
import torch

from storage import open_artifact_store
from tests.tuner_tests.test_report import add_measured_trial, build_measured_study, starving
from tuner._attrs import record_loader_defaults_kept, record_remeasured, settings_attrs
from tuner._naming import (
    BASELINE_PYTORCH_DEFAULT,
    BASELINE_RULE_OF_THUMB,
    CEILING_ATTR,
    REMEASURED_ATTR,
)
from tuner.insight import best_trial
from tuner.insight._best import optuna_best, study_best
from tuner.insight._note import save_study_note, study_note
from tuner.search._settings import LoaderSettings
from tuner.trial._measure import measure


def remeasured_the_other_way(url: str) -> optuna.Study:
    """A measured study whose re-measurement picked the second-highest window, not the first.

    The two highest windows are re-measured for real (two rounds each, the tuner's measurement
    loop); the pick is recorded as a re-measurement that ranked them the other way would
    record it, which on a busy machine either order can be. Optuna keeps the highest window.
    """
    study = build_measured_study(url, name="remeasured@local-test")
    top, second = sorted(study.trials, key=lambda t: t.value or 0.0, reverse=True)[:2]
    medians = {}
    for trial in (top, second):
        settings = LoaderSettings.from_attrs(trial.user_attrs["settings"])
        rounds = [
            measure(starving(), settings, torch.device("cpu"), 0.3, 0.05).samples_per_sec
            for _ in range(2)
        ]
        medians[str(trial.number)] = statistics.median(rounds)
    study.set_user_attr(REMEASURED_ATTR, medians)
    study.set_user_attr("best_trial_number", second.number)
    return study


@pytest.fixture
def measured(measured_url: str) -> optuna.Study:
    """The session's measured study (tests/tuner_tests/conftest.py), read only."""
    return optuna.load_study(study_name="starving@local-test", storage=measured_url)


def test_the_note_says_what_the_study_found(measured: optuna.Study) -> None:
    note = study_note(measured)
    best = best_trial(measured)
    assert best is not None
    assert note.startswith(f"# {measured.study_name}\n")
    assert f"## Best: trial {best.number}" in note
    assert f"**{best.value:,.1f} samples/s**" in note
    assert "of the ceiling** (" in note
    assert f"over `{BASELINE_PYTORCH_DEFAULT}`" in note
    assert f"over `{BASELINE_RULE_OF_THUMB}`" in note
    assert f"**Diagnosis: {best.user_attrs['bottleneck']}.**" in note
    settings = best.user_attrs["settings"]
    assert f"| num_workers | {settings['num_workers']} |" in note
    assert "```python\nimport torch\nfrom torch.utils.data import DataLoader" in note
    assert f"    num_workers={settings['num_workers']}," in note
    assert "## Machines" in note
    assert f"| {socket.gethostname()} | local-test |" in note
    assert f"| {len(measured.trials)} |" in note  # every trial ran on this machine


def test_the_note_is_saved_and_rewritten_whole(sqlite_url: str) -> None:
    study = optuna.create_study(storage=sqlite_url, study_name="s", direction="maximize")
    first = save_study_note(study)
    assert "No trial yet." in first
    assert optuna_dashboard.get_note(study) == first

    study.set_user_attr(CEILING_ATTR, 5000.0)
    store = open_artifact_store(sqlite_url)
    settings = LoaderSettings(batch=16, num_workers=1, prefetch_factor=2, torch_num_threads=1)
    add_measured_trial(study, store, settings, window_s=0.2)
    second = save_study_note(study)
    assert "## Best: trial 0" in second and "of the ceiling" in second
    assert optuna_dashboard.get_note(study) == second  # nothing of the first one is left

    third = save_study_note(optuna.create_study(storage=sqlite_url, study_name="t"))
    assert optuna_dashboard.get_note(optuna.load_study(study_name="s", storage=sqlite_url)) == (
        second
    )
    assert "No trial yet." in third


def test_a_study_without_a_completed_trial_says_so(sqlite_url: str) -> None:
    study = optuna.create_study(storage=sqlite_url, direction="maximize")
    trial = study.ask()
    trial.set_user_attr("pruned_reason", "memory_guard: host")
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    note = study_note(study)
    assert "1 trials: 1 pruned" in note
    assert "No trial has completed yet" in note


def test_the_note_says_why_optunas_best_is_another_trial(remeasured_url: str) -> None:
    study = optuna.load_study(study_name="remeasured@local-test", storage=remeasured_url)
    chosen, theirs = study_best(study), optuna_best(study)
    assert chosen is not None and theirs is not None and chosen.trial_number != theirs.number
    note = study_note(study)
    assert f"## Best: trial {chosen.trial_number}" in note
    assert f"**{chosen.samples_per_sec:,.1f} samples/s** (re-measured median)" in note
    again = study.user_attrs[REMEASURED_ATTR][str(theirs.number)]
    assert f"Optuna's own best trial is trial {theirs.number}, not {chosen.trial_number}." in note
    assert f"{theirs.value:,.1f} samples/s in its window (re-measured at {again:,.1f}" in note
    assert f"trial {chosen.trial_number} {chosen.window_samples_per_sec:,.1f}." in note


def test_the_note_says_nothing_of_optuna_when_they_agree(measured: optuna.Study) -> None:
    assert optuna_best(measured).number == best_trial(measured).number
    assert "Optuna's own best trial" not in study_note(measured)


def test_the_note_says_which_loader_knobs_kept_their_defaults() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    settings = LoaderSettings(batch=64, num_workers=2, prefetch_factor=2, persistent_workers=True)
    study.add_trial(optuna.trial.create_trial(value=100.0, user_attrs=settings_attrs(settings)))
    record_remeasured(study, {0: 100.0}, 0)
    assert "Left at defaults" not in study_note(study)
    record_loader_defaults_kept(study, {"pin_memory": "CPU"})
    assert "\nLeft at defaults: pin_memory (CPU).\n" in study_note(study)
