"""Study-level choices that need no subprocess: how the sampler is seeded on a resumed study."""

from __future__ import annotations

import optuna
import pytest

from tuner._study import StudyConfig, _sampler


def _first_draws(sampler: optuna.samplers.BaseSampler) -> list[int]:
    study = optuna.create_study(sampler=sampler)
    return [study.ask().suggest_int("num_workers", 0, 1000) for _ in range(5)]


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_a_resumed_seed_moves_on_by_the_trials_the_study_holds(name: str) -> None:
    config = StudyConfig(hardware="auto", seed=3, sampler=name)
    assert _first_draws(_sampler(config, 0)) == _first_draws(_sampler(config, 0))
    assert _first_draws(_sampler(config, 10)) != _first_draws(_sampler(config, 0))


def test_no_seed_stays_unseeded() -> None:
    config = StudyConfig(hardware="auto", sampler="random")
    assert _first_draws(_sampler(config, 0)) != _first_draws(_sampler(config, 0))
