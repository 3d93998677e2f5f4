"""The pipeline's steps in a run, on real SQLite studies: the early stop near the bound or on a
confirmed seed, and the worker range growing when the best waits at its edge."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import pytest
from optuna.distributions import IntDistribution

from tests.tuner_tests.pipeline.test_model import _profile, _space
from tuner._naming import REMEASURED_ATTR
from tuner.pipeline import PipelineModel
from tuner.run._pipeline import (
    MODEL_SEED_ATTR,
    WORKER_RANGE_ATTR,
    bound_stop_candidate,
    bound_stop_message,
    grow_worker_range,
)


def _add(study: optuna.Study, value: float, workers: int, **attrs: Any) -> None:
    settings = _space(max_workers=64).settings(
        workers, 32, 2 if workers else None, workers > 0, False, 1, {}
    )
    study.add_trial(
        optuna.trial.create_trial(
            value=value,
            params={"num_workers": workers},
            distributions={"num_workers": IntDistribution(0, 64)},
            user_attrs={"settings": settings.to_attrs(), **attrs},
        )
    )


@pytest.fixture
def study(sqlite_url: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=sqlite_url, study_name="s", direction="maximize")


def _model(bound: float) -> PipelineModel:
    model = PipelineModel.build(_profile(), _space(max_workers=64), None)
    return dataclasses.replace(model, bound=bound)


def test_no_stop_before_the_seeds_are_measured(study: optuna.Study) -> None:
    _add(study, 100.0, 0, baseline="pytorch-default")
    assert bound_stop_candidate(study, _model(100.0)) is None  # no seed yet
    study.enqueue_trial({"num_workers": 8}, user_attrs={MODEL_SEED_ATTR: "predicted-best"})
    _add(study, 99.0, 8, **{MODEL_SEED_ATTR: "neighbour"})
    assert bound_stop_candidate(study, _model(100.0)) is None  # a seed still waits


def test_a_best_near_the_bound_stops_once_re_measured(study: optuna.Study) -> None:
    _add(study, 50.0, 0, baseline="pytorch-default")
    _add(study, 97.0, 16, **{MODEL_SEED_ATTR: "predicted-best"})
    model = _model(100.0)
    best = bound_stop_candidate(study, model)
    assert best is not None and best.number == 1
    assert bound_stop_message(study, model) is None  # not re-measured yet
    study.set_user_attr(REMEASURED_ATTR, {"1": 96.0})
    message = bound_stop_message(study, model)
    assert message is not None and "96.0% of the bound" in message


def test_a_seeded_best_is_confirmed_by_two_trials_that_do_not_beat_it(study: optuna.Study) -> None:
    _add(study, 50.0, 0, baseline="pytorch-default")
    _add(study, 80.0, 16, **{MODEL_SEED_ATTR: "predicted-best"})
    _add(study, 60.0, 8, **{MODEL_SEED_ATTR: "neighbour"})
    model = _model(1000.0)
    _add(study, 70.0, 4)
    assert bound_stop_candidate(study, model) is None
    _add(study, 75.0, 2)
    assert bound_stop_candidate(study, model).number == 1  # type: ignore[union-attr]
    _add(study, 90.0, 32)  # the sampler beat the seed: no longer confirmed
    assert bound_stop_candidate(study, model) is None


def test_the_range_grows_when_the_best_waits_for_data_at_its_edge(
    study: optuna.Study, sqlite_url: str
) -> None:
    space = _space(max_workers=8)
    _add(study, 100.0, 4, bottleneck="input-bound", advice="raise num_workers")
    assert grow_worker_range(study, sqlite_url, space, _profile(), None) is None  # not at edge
    _add(study, 200.0, 8, bottleneck="input-bound", advice="raise num_workers")
    grown = grow_worker_range(study, sqlite_url, space, _profile(), None)
    assert grown is not None and grown.max_workers == 16
    assert study.user_attrs[WORKER_RANGE_ATTR] == 16
    # Memory caps the growth: 10 workers fit in half of 2 GiB at 100 MiB each.
    heavy = dataclasses.replace(_profile(), worker_uss_bytes=100 * 2**20, sample_bytes=0.0)
    capped = grow_worker_range(study, sqlite_url, space, heavy, 2 * 2**30)
    assert capped is not None and capped.max_workers == 16  # never below what is stored


def test_a_compute_bound_best_at_the_edge_keeps_the_range(
    study: optuna.Study, sqlite_url: str
) -> None:
    _add(study, 200.0, 8, bottleneck="compute-bound", advice="the step is the limit")
    assert grow_worker_range(study, sqlite_url, _space(max_workers=8), _profile(), None) is None
    fixed = _space(max_workers=8, fixed={"num_workers": 8})
    assert grow_worker_range(study, sqlite_url, fixed, _profile(), None) is None
