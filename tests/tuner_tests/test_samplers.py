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


def test_the_default_model_and_gp_run_every_trial_to_the_end() -> None:
    """A pruned trial is invisible to the Gaussian process, so gp never stops one early, nor
    does the default model strategy, which hands the study to gp once its own picks run out."""
    assert StudyConfig(hardware="auto").sampler == "model"
    assert not _pruned_after_low_report("model")
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


def _study_with_a_wall(seed: int, n_trials: int = 20) -> list[tuple[int, int] | None]:
    """Maximize workers + batch where the sum 12 and over is pruned unrun (a memory model's
    prune), as the tuner answers it: each trial's (workers, batch), None where it ran."""
    study = optuna.create_study(direction="maximize", sampler=make_sampler("gp", seed))
    unrun: list[tuple[int, int] | None] = []
    for _ in range(n_trials):
        trial = study.ask()
        setting = (trial.suggest_int("num_workers", 0, 8), trial.suggest_int("batch", 1, 8))
        if sum(setting) >= 12:
            trial.set_user_attr("pruned_reason", "memory_model")
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            unrun.append(setting)
        else:
            study.tell(trial, float(sum(setting)))
            unrun.append(None)
    return unrun


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gp_does_not_propose_again_what_the_study_answered_without_running(seed: int) -> None:
    """The Gaussian process alone proposed one pruned setting on 14 of these 20 trials."""
    unrun = [setting for setting in _study_with_a_wall(seed) if setting is not None]
    assert len(unrun) <= 8
    assert max(unrun.count(setting) for setting in unrun) <= 2


def _study_of_one_peak(seed: int, n_trials: int = 16) -> list[tuple[int, int]]:
    """Maximize a peak at (2, 3) over two parameters that define the whole setting, a repeat
    answered from its twin as the tuner answers it: each trial's setting."""
    study = optuna.create_study(direction="maximize", sampler=make_sampler("gp", seed))
    values: dict[tuple[int, int], tuple[int, float]] = {}
    settings = []
    for _ in range(n_trials):
        trial = study.ask()
        setting = (trial.suggest_int("num_workers", 0, 4), trial.suggest_int("batch", 0, 6))
        settings.append(setting)
        if setting in values:
            trial.set_user_attr("repeat_of", values[setting][0])
        else:
            values[setting] = (trial.number, -((setting[0] - 2) ** 2) - (setting[1] - 3) ** 2)
        study.tell(trial, values[setting][1])
    return settings


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gp_does_not_spend_trials_repeating_a_measured_setting(seed: int) -> None:
    """A repeat answers from its twin: a proposal that can only repeat goes to TPE instead."""
    settings = _study_of_one_peak(seed)
    assert max(settings.count(setting) for setting in settings) <= 2
    assert len(set(settings)) >= 12
