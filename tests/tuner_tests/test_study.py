"""Study-level choices that need no subprocess: the strategies, and how a resumed study seeds."""

from __future__ import annotations

import optuna
import pytest

from tuner.run._study import SAMPLERS, StudyConfig, _sampler, make_pruner, make_sampler
from tuner.search._pruner import BelowBestPruner


def _first_draws(sampler: optuna.samplers.BaseSampler) -> list[int]:
    study = optuna.create_study(sampler=sampler)
    return [study.ask().suggest_int("num_workers", 0, 1000) for _ in range(5)]


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_resumed_seed_moves_on_by_the_trials_the_study_holds(name: str) -> None:
    config = StudyConfig(hardware="auto", seed=3, sampler=name)
    assert _first_draws(_sampler(config, 0)) == _first_draws(_sampler(config, 0))
    assert _first_draws(_sampler(config, 10)) != _first_draws(_sampler(config, 0))


def test_no_seed_stays_unseeded() -> None:
    config = StudyConfig(hardware="auto", sampler="random")
    assert _first_draws(_sampler(config, 0)) != _first_draws(_sampler(config, 0))


def test_the_default_strategy_is_the_gaussian_process_without_pruning() -> None:
    assert StudyConfig(hardware="auto").sampler == "gp"
    assert isinstance(make_sampler("gp", 0), optuna.samplers.GPSampler)
    # A pruned trial is invisible to the Gaussian process, so gp runs every trial to the end.
    assert isinstance(make_pruner("gp"), optuna.pruners.NopPruner)
    assert isinstance(make_pruner("tpe"), BelowBestPruner)
    assert isinstance(make_pruner("random"), BelowBestPruner)


def test_gp_models_the_conditional_parameters_with_tpe() -> None:
    """prefetch_factor exists only with workers; GP leaves it to its independent sampler."""
    study = optuna.create_study(direction="maximize", sampler=make_sampler("gp", 1))

    def objective(trial: optuna.Trial) -> float:
        workers = trial.suggest_int("num_workers", 0, 4)
        prefetch = trial.suggest_int("prefetch_factor", 1, 8) if workers else 0
        return workers + prefetch

    study.optimize(objective, n_trials=14)
    assert isinstance(make_sampler("gp", 1)._independent_sampler, optuna.samplers.TPESampler)
    assert study.best_value >= 8
