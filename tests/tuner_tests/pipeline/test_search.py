"""The model's bounded search against every setting of the space, and its cost on big nodes.

The search rates a ladder of worker counts, a few thread counts and every batch and knob set,
then climbs around its best (``tuner.pipeline._model._search``). On the small machines where
every setting can still be rated, it must find what rating every setting finds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.scale import counted_predictions, synthetic_profile, synthetic_space
from objectives import Workload
from tests.tuner_tests.pipeline.test_model import _cpu_bound, _decoding, _profile, _space
from tuner.pipeline import PipelineProfile, _model, predicted_best
from tuner.pipeline._model import _fixed_or, _pick, _rate, _search, _within_cores, candidate_setting
from tuner.search import SearchSpace
from tuner.search._settings import LoaderSettings

STORED = json.loads((Path(__file__).parent / "data/stored_profiles.json").read_text())
"""The image, storage and text profiles of stored ``bench.search`` runs on 2 cores, with their
grids' batch range and knobs (``source`` names the run in docs/data)."""

TIE_WIDTH = 1.01
"""``_pick`` counts settings within 1% of each other as tied and takes the cheaper: the search
over every setting answers no closer than that, so neither need the bounded one."""

Admit = Callable[[LoaderSettings], bool] | None


def _every_setting(space: SearchSpace) -> list[LoaderSettings]:
    """Every worker count, batch value, thread count and knob set of ``space``."""
    return [
        candidate_setting(space, workers, batch, threads, knobs)
        for knobs in space.knob_sets()
        for workers in _fixed_or(space, "num_workers", range(space.max_workers + 1))
        for batch in _fixed_or(space, space.batch_param, space.batch_choices())
        for threads in _fixed_or(space, "torch_num_threads", range(1, space.max_threads + 1))
    ]


def _exhaustive(
    profile: PipelineProfile, space: SearchSpace, ideal: bool, admit: Admit
) -> LoaderSettings | None:
    settings = [s for s in _every_setting(space) if admit is None or admit(s)]
    return _pick((_rate(profile, s, ideal), s) for s in settings)[1]


def _unused_batch_sampler(*args: Any) -> Any:
    raise NotImplementedError("the model reads the profile only")


def _stored_space(name: str, cores: int, max_workers: int) -> SearchSpace:
    entry = STORED[name]
    token_budget = entry["batch_param"] != "batch_size"
    workload = Workload(
        name=name,
        dataset=[],  # type: ignore[arg-type]  # never loaded
        batch_size_range=tuple(entry["batch_range"]),  # type: ignore[arg-type]
        batch_param=entry["batch_param"],
        batch_sampler=_unused_batch_sampler if token_budget else None,
        knobs=entry["knobs"],
        configure=_unused_batch_sampler if entry["knobs"] else None,
    )
    return SearchSpace(workload=workload, max_workers=max_workers, max_threads=cores, cuda=False)


def _within(profile: PipelineProfile) -> Admit:
    return lambda s: s.num_workers > 0 and _within_cores(profile, s)


MACHINES = [(2, 1), (4, 1), (4, 2)]
"""(usable cores, ranks): the stored machine, twice its cores, and those shared by two ranks."""


@pytest.mark.parametrize("name", sorted(STORED))
@pytest.mark.parametrize(("cores", "ranks"), MACHINES)
def test_on_the_stored_profiles_the_bounded_search_finds_what_rating_everything_finds(
    name: str, cores: int, ranks: int
) -> None:
    stored = PipelineProfile.from_attrs(STORED[name]["profile"])
    profile = dataclasses.replace(stored, usable_cores=float(cores), ranks=ranks)
    for max_workers in (2 * cores, 16, 64):
        space = _stored_space(name, cores, max_workers)
        for ideal in (False, True):
            for admit in (None, _within(profile)):
                expected = _exhaustive(profile, space, ideal, admit)
                assert _search(profile, space, ideal, admit)[1] == expected


SYNTHETIC: dict[str, Callable[[], tuple[PipelineProfile, SearchSpace]]] = {
    "waiting": lambda: (_profile(), _space(max_workers=64)),
    "cpu-bound": lambda: (_cpu_bound(), _space(max_workers=16)),
    "decoding": lambda: (_decoding(), _space(max_workers=8)),
    "scale 2 cores": lambda: (synthetic_profile(2), synthetic_space(2)),
    "scale 4 cores": lambda: (synthetic_profile(4), synthetic_space(4)),
    "scale 4 cores, 2 ranks": lambda: (synthetic_profile(4, 2), synthetic_space(4)),
}


@pytest.mark.parametrize("case", sorted(SYNTHETIC))
def test_on_synthetic_profiles_the_bounded_best_is_predicted_within_the_tie_width(
    case: str,
) -> None:
    profile, space = SYNTHETIC[case]()
    for ideal in (False, True):
        for admit in (None, _within(profile)):
            expected = _exhaustive(profile, space, ideal, admit)
            found = _search(profile, space, ideal, admit)[1]
            assert (found is None) == (expected is None)
            if found is not None and expected is not None:
                ratio = _rate(profile, found, ideal) / _rate(profile, expected, ideal)
                assert 1 / TIE_WIDTH <= ratio <= TIE_WIDTH


def test_the_search_keeps_what_the_user_fixed() -> None:
    space = _space(max_workers=64, fixed={"num_workers": 3, "torch_num_threads": 2})
    best = predicted_best(_decoding(), space)
    assert (best.num_workers, best.torch_num_threads) == (3, 2)


def test_the_threads_tried_are_one_a_ranks_cores_all_and_the_measured_ones() -> None:
    assert _model._model_threads(synthetic_profile(96, 8), synthetic_space(96)) == [1, 12, 96]
    two_rows = dataclasses.replace(synthetic_profile(8), step_rates={1: {}, 3: {}})
    assert _model._model_threads(two_rows, synthetic_space(8)) == [1, 3, 8]


@pytest.mark.parametrize("vcpus", [4, 8, 48, 96, 192])
@pytest.mark.parametrize("ranks", [1, 4, 8])
def test_a_studys_model_set_up_stays_within_20000_predictions(vcpus: int, ranks: int) -> None:
    from bench.scale import set_up

    result = set_up(vcpus, ranks)
    assert 0 < result.predictions <= 20_000
    assert 1 <= result.worker_range <= _model.HARD_MAX_WORKERS


def test_the_count_is_of_the_one_prediction_function() -> None:
    profile, space = synthetic_profile(4), synthetic_space(4)
    with counted_predictions() as count:
        _model.predict(profile, candidate_setting(space, 1, 8, 1, space.base_knobs))
    assert count == [1]
    assert _model.predict.__name__ == "predict"  # put back on the way out


def _fewest_workers_by_scan(
    profile: PipelineProfile, space: SearchSpace, batch: int, threads: int, knobs: Any
) -> int:
    """``workers_needed`` by rating every worker count, fewest first."""

    def rate(workers: int) -> float:
        settings = space.settings(
            workers, batch, 2 if workers else None, workers > 0, False, threads, knobs
        )
        return _model.predict(profile, settings).ideal_samples_per_sec

    most = rate(_model.HARD_MAX_WORKERS)
    return next(
        (w for w in range(_model.HARD_MAX_WORKERS + 1) if rate(w) >= 0.97 * most),
        _model.HARD_MAX_WORKERS,
    )


@pytest.mark.parametrize("case", sorted(SYNTHETIC))
def test_the_workers_needed_are_the_fewest_a_scan_of_every_count_finds(case: str) -> None:
    profile, space = SYNTHETIC[case]()
    for batch in space.batch_choices():
        for threads in range(1, space.max_threads + 1):
            for knobs in space.knob_sets():
                expected = _fewest_workers_by_scan(profile, space, batch, threads, knobs)
                assert _model.workers_needed(profile, space, batch, threads, knobs) == expected


@pytest.mark.parametrize("name", sorted(STORED))
@pytest.mark.parametrize(("cores", "ranks"), MACHINES)
def test_on_the_stored_profiles_the_workers_needed_are_a_scans(
    name: str, cores: int, ranks: int
) -> None:
    stored = PipelineProfile.from_attrs(STORED[name]["profile"])
    profile = dataclasses.replace(stored, usable_cores=float(cores), ranks=ranks)
    space = _stored_space(name, cores, 2 * cores)
    for batch in space.batch_choices():
        for threads in range(1, cores + 1):
            for knobs in space.knob_sets():
                expected = _fewest_workers_by_scan(profile, space, batch, threads, knobs)
                assert _model.workers_needed(profile, space, batch, threads, knobs) == expected
