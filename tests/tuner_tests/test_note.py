"""The study's Markdown note: everything a user needs on the dashboard's first page, rewritten
whole each time, on a study of real measurements."""

from __future__ import annotations

import socket

import optuna
import optuna_dashboard
import pytest

from tests.tuner_tests.test_report import add_measured_trial, build_measured_study
from tuner._naming import BASELINE_PYTORCH_DEFAULT, BASELINE_RULE_OF_THUMB, CEILING_ATTR
from tuner.insight._note import save_study_note, study_note
from tuner.insight._summary import best_trial
from tuner.search._settings import LoaderSettings
from tuner.trial._artifacts import open_artifact_store


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> optuna.Study:
    return build_measured_study(f"sqlite:///{tmp_path_factory.mktemp('note') / 'tuner.db'}")


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
