"""The pruner stops trials clearly slower than the best, and nothing else."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import IntDistribution

from tuner.search._pruner import BelowBestPruner


def _study(values: list[float]) -> optuna.Study:
    study = optuna.create_study(direction="maximize", pruner=BelowBestPruner())
    for value in values:
        study.add_trial(
            optuna.trial.create_trial(
                value=value,
                params={"num_workers": 0},
                distributions={"num_workers": IntDistribution(0, 4)},
            )
        )
    return study


def _pruned_after(study: optuna.Study, reports: list[float]) -> bool:
    trial = study.ask()
    for step, value in enumerate(reports, start=1):
        trial.report(value, step)
    return trial.should_prune()


def test_a_trial_below_70_percent_of_the_best_is_pruned() -> None:
    study = _study([1000.0, 500.0])
    assert _pruned_after(study, [690.0])
    assert not _pruned_after(study, [710.0])


def test_the_latest_report_decides() -> None:
    study = _study([1000.0, 500.0])
    assert not _pruned_after(study, [300.0, 900.0])  # a slow first half second, then on pace
    assert _pruned_after(study, [900.0, 300.0])


def test_nothing_is_pruned_before_two_complete_trials_or_a_report() -> None:
    assert not _pruned_after(_study([1000.0]), [10.0])
    assert not _pruned_after(_study([1000.0, 900.0]), [])


def test_the_fraction_is_checked() -> None:
    with pytest.raises(ValueError, match="fraction"):
        BelowBestPruner(fraction=1.5)
