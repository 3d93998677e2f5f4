"""The pipeline's steps in a run, on real SQLite studies: the early stop near the bound or on a
confirmed seed, and the worker range growing when the best waits at its edge."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import pytest
from optuna.distributions import IntDistribution

from tests.tuner_tests.pipeline.test_model import _decoding, _profile, _space
from tuner._naming import REMEASURED_ATTR
from tuner.pipeline import PipelineModel
from tuner.run._pipeline import (
    CORRECTED_ATTR,
    MODEL_SEED_ATTR,
    WORKER_RANGE_ATTR,
    bound_stop_candidate,
    bound_stop_message,
    enqueue_model_seed,
    enqueue_next_setting,
    grow_worker_range,
)
from tuner.search._settings import LoaderSettings

SPACE = _space(max_workers=64)


def _add(
    study: optuna.Study,
    value: float,
    workers: int,
    settings: LoaderSettings | None = None,
    **attrs: Any,
) -> None:
    if settings is None:
        settings = _space(max_workers=64).settings(
            workers, 32, 2 if workers else None, workers > 0, False, 1, {}
        )
    study.add_trial(
        optuna.trial.create_trial(
            value=value,
            params={"num_workers": settings.num_workers},
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
    assert bound_stop_candidate(study, _model(100.0), SPACE) is None  # no seed yet
    study.enqueue_trial({"num_workers": 8}, user_attrs={MODEL_SEED_ATTR: "predicted-best"})
    _add(study, 99.0, 8, **{MODEL_SEED_ATTR: "neighbour"})
    assert bound_stop_candidate(study, _model(100.0), SPACE) is None  # a seed still waits


def test_the_seeds_are_queued_in_order_and_the_study_waits_for_all_of_them(
    study: optuna.Study,
) -> None:
    space = _space(max_workers=8)
    model = PipelineModel.build(_decoding(), space, None)
    enqueue_model_seed(study, space, model)
    queued = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert [t.user_attrs[MODEL_SEED_ATTR] for t in queued] == ["predicted-best", "within-cores"]
    assert queued[0].user_attrs["settings"] == model.best.to_attrs()
    # The predicted best measured near the bound: the study still waits for the other seed.
    trial = study.ask()
    assert trial.user_attrs[MODEL_SEED_ATTR] == "predicted-best"
    study.tell(trial, 1_000.0)
    assert bound_stop_candidate(study, dataclasses.replace(model, bound=1_000.0), space) is None


def test_a_best_near_the_bound_stops_once_re_measured(study: optuna.Study) -> None:
    _add(study, 50.0, 0, baseline="pytorch-default")
    _add(study, 97.0, 16, **{MODEL_SEED_ATTR: "predicted-best"})
    model = _model(100.0)
    # A bound can sit under what the machine delivers: the worker steps each side come first.
    assert bound_stop_candidate(study, model, SPACE) is None
    _add(study, 90.0, 12, **{MODEL_SEED_ATTR: "neighbour"})
    assert bound_stop_candidate(study, model, SPACE) is None
    _add(study, 91.0, 24, **{MODEL_SEED_ATTR: "neighbour"})
    best = bound_stop_candidate(study, model, SPACE)
    assert best is not None and best.number == 1
    assert bound_stop_message(study, model, SPACE) is None  # not re-measured yet
    study.set_user_attr(REMEASURED_ATTR, {"1": 96.0})
    message = bound_stop_message(study, model, SPACE)
    assert message is not None and "96.0% of the bound" in message


def test_a_best_near_the_bound_waits_for_the_knob_trial_its_profile_calls_for(
    study: optuna.Study,
) -> None:
    """Epochs of 1 s against 16 workers' 160 ms of starts: persistence is measured before the
    study may stop, however near the bound the best is."""
    space = _space(max_workers=64)
    profile = _profile(dataset_samples=2_000)
    model = dataclasses.replace(PipelineModel.build(profile, space, None), bound=2_000.0)
    best = space.settings(16, 32, 2, True, False, 1, {})
    _add(study, 1_990.0, 16, best, **{MODEL_SEED_ATTR: "predicted-best"})
    _add(study, 1_800.0, 12, **{MODEL_SEED_ATTR: "neighbour"})
    _add(study, 1_800.0, 24, **{MODEL_SEED_ATTR: "neighbour"})
    assert bound_stop_candidate(study, model, space) is None
    off = dataclasses.replace(best, persistent_workers=False)
    _add(study, 1_700.0, 16, off, **{MODEL_SEED_ATTR: "knob:persistent_workers"})
    stop = bound_stop_candidate(study, model, space)
    assert stop is not None and stop.number == 0


def test_the_next_setting_is_queued_once_and_the_best_stops_when_its_neighbours_are_slower(
    study: optuna.Study, sqlite_url: str
) -> None:
    model = _model(1e9)  # a bound never reached: only the neighbours can stop the study
    _add(study, 50.0, 0, baseline="pytorch-default")
    seed = model.best
    _add(study, model.predict(seed), seed.num_workers, seed, **{MODEL_SEED_ATTR: "predicted-best"})
    measured = 0
    while bound_stop_candidate(study, model, SPACE) is None:
        proposal = enqueue_next_setting(study, sqlite_url, SPACE, model)
        assert proposal is not None
        assert enqueue_next_setting(study, sqlite_url, SPACE, model) is None  # one waits
        trial = study.ask()
        why = trial.user_attrs[MODEL_SEED_ATTR]
        assert why in ("corrected", "neighbour") or why.startswith("knob:")
        assert trial.user_attrs[CORRECTED_ATTR] == pytest.approx(proposal.corrected_samples_per_sec)
        study.tell(trial, 0.95 * model.predict(seed))  # every other setting a little slower
        measured += 1
        assert measured < 20, "the neighbours never ran out"
    assert bound_stop_candidate(study, model, SPACE).number == 1  # type: ignore[union-attr]
    assert measured >= 1
    study.set_user_attr(REMEASURED_ATTR, {"1": model.predict(seed)})
    message = bound_stop_message(study, model, SPACE)
    assert message is not None and "held against all its neighbours" in message


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
