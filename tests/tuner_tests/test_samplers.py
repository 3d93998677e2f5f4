"""The strategies ``--sampler`` names: seeding across resumes, and the pruner each one runs with."""

from __future__ import annotations

import optuna
import pytest

from tuner.run import SAMPLERS, StudyConfig, make_pruner, make_sampler
from tuner.run._samplers import resumed_seed


def _first_draws(sampler: optuna.samplers.BaseSampler) -> list[int]:
    study = optuna.create_study(sampler=sampler)
    return [study.ask().suggest_int("num_workers", 0, 1000) for _ in range(5)]


def test_a_resumed_seed_moves_on_by_the_trials_the_study_holds() -> None:
    assert resumed_seed(3, 0) == 3
    assert resumed_seed(3, 10) == 13
    assert resumed_seed(None, 10) is None


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_seed_decides_the_draws(name: str) -> None:
    assert _first_draws(make_sampler(name, 3)) == _first_draws(make_sampler(name, 3))
    assert _first_draws(make_sampler(name, 13)) != _first_draws(make_sampler(name, 3))


def _pruned_after_low_report(sampler: str) -> bool:
    """Two complete trials at 100, then one reporting 10 twice: does the pruner stop it?"""
    study = optuna.create_study(direction="maximize", pruner=make_pruner(sampler))
    for _ in range(2):
        study.add_trial(optuna.trial.create_trial(value=100.0))
    trial = study.ask()
    trial.report(10.0, 1)
    trial.report(10.0, 2)
    return trial.should_prune()


def test_the_default_gp_runs_every_trial_to_the_end() -> None:
    """A pruned trial is invisible to the Gaussian process, so gp never stops one early."""
    assert StudyConfig(hardware="auto").sampler == "gp"
    assert not _pruned_after_low_report("gp")


@pytest.mark.parametrize("name", ["tpe", "random"])
def test_the_other_strategies_stop_a_trial_far_below_the_best(name: str) -> None:
    assert _pruned_after_low_report(name)


def test_gp_finds_the_top_of_a_conditional_space() -> None:
    """prefetch_factor exists only with workers; GP leaves it to its TPE independent sampler."""
    study = optuna.create_study(direction="maximize", sampler=make_sampler("gp", 1))

    def objective(trial: optuna.Trial) -> float:
        workers = trial.suggest_int("num_workers", 0, 4)
        prefetch = trial.suggest_int("prefetch_factor", 1, 8) if workers else 0
        return workers + prefetch

    study.optimize(objective, n_trials=14)
    assert study.best_value >= 8
