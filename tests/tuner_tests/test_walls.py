"""The memory wall from stored trials: confirmed breaches only, falls, and the model's re-test."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner._attrs import trial_settings
from tuner.pipeline._profile import KNOB_COST_FIELDS, knob_key
from tuner.run._runner import _answer_from_storage, measured_twin
from tuner.run._walls import (
    MODEL_RETEST_ATTR,
    PREDICTED_PEAK_ATTR,
    RETEST_ATTR,
    WallVerdict,
    calibrated_prior,
    memory_figures,
    memory_walls,
    prior_memory_figures,
    wall_verdict,
)
from tuner.search._memory_model import MemoryFigures, predicted_peak_bytes
from tuner.search._settings import LoaderSettings

MiB = 2**20
LIMIT = 1000 * MiB
FIGURES = MemoryFigures(main_bytes=200 * MiB, worker_bytes=20 * MiB, sample_bytes=0.5 * MiB)


def setting(workers: int, batch: int, prefetch: int = 2, persistent: bool = True) -> LoaderSettings:
    return LoaderSettings(
        batch=batch,
        num_workers=workers,
        prefetch_factor=prefetch if workers else None,
        persistent_workers=persistent and workers > 0,
    )


def trial(number: int, settings: LoaderSettings, state: TrialState, **attrs: Any) -> FrozenTrial:
    frozen = optuna.trial.create_trial(
        state=state,
        value=100.0 if state == TrialState.COMPLETE else None,
        params={"num_workers": settings.num_workers},
        distributions={"num_workers": IntDistribution(0, 8)},
        user_attrs={"settings": settings.to_attrs(), **attrs},
    )
    frozen.number = number
    return frozen


def complete(number: int, settings: LoaderSettings) -> FrozenTrial:
    peak = predicted_peak_bytes(settings, FIGURES)
    return trial(number, settings, TrialState.COMPLETE, peak_host_memory_bytes=peak)


def guard_pruned(number: int, settings: LoaderSettings, predicted: bool) -> FrozenTrial:
    return trial(
        number,
        settings,
        TrialState.PRUNED,
        pruned_reason="memory_guard: host",
        guard_predicted=predicted,
    )


def test_only_confirmed_breaches_make_walls() -> None:
    trials = [
        guard_pruned(0, setting(2, 64), predicted=True),
        guard_pruned(1, setting(4, 128), predicted=False),
        trial(2, setting(4, 256), TrialState.PRUNED, pruned_reason="cuda_oom"),
        trial(3, setting(1, 16), TrialState.PRUNED, pruned_reason="pruner"),
    ]
    assert [number for number, _ in memory_walls(trials)] == [1, 2]


def test_a_wall_falls_once_a_larger_setting_completes() -> None:
    trials = [guard_pruned(0, setting(2, 64), predicted=False), complete(1, setting(2, 128))]
    assert memory_walls(trials) == []


def test_dominated_setting_is_pruned_without_a_model() -> None:
    trials = [guard_pruned(0, setting(2, 64), predicted=False)]
    verdict = wall_verdict(trials, setting(4, 64), LIMIT)
    assert (verdict.dominated_by, verdict.retest_of, verdict.predicted_peak_bytes) == (
        0,
        None,
        None,
    )
    assert wall_verdict(trials, setting(1, 64), LIMIT).dominated_by is None


def measured() -> list[FrozenTrial]:
    grid = [setting(0, 16), setting(1, 32), setting(2, 16, 4), setting(1, 64, 4), setting(0, 64)]
    return [complete(number, settings) for number, settings in enumerate(grid)]


def test_reforked_workers_are_fitted_only_where_the_window_crossed_an_epoch() -> None:
    figures = dataclasses.replace(FIGURES, refork_sample_bytes=0.2 * MiB)
    reforked = setting(2, 128, persistent=False)
    peak = predicted_peak_bytes(reforked, figures)
    crossed = trial(5, reforked, TrialState.COMPLETE, peak_host_memory_bytes=peak, epochs=1)
    fitted = memory_figures([*measured(), crossed], setting(1, 64))
    assert fitted is not None and fitted.refork_sample_bytes == pytest.approx(0.2 * MiB)
    # A window inside the first epoch is left out, not fitted low: the epoch the trial started
    # after it read only part of the copies (50-79% on text).
    inside = trial(
        5, reforked, TrialState.COMPLETE, peak_host_memory_bytes=peak - 50 * MiB, epoch_starts=1
    )
    unfitted = memory_figures([*measured(), inside], setting(1, 64))
    assert unfitted is not None and unfitted.refork_sample_bytes is None
    assert unfitted.main_bytes == pytest.approx(FIGURES.main_bytes)


def test_the_model_re_tests_a_wall_once_when_a_dominated_setting_fits() -> None:
    wall = guard_pruned(4, setting(2, 32), predicted=False)  # the model puts it at 312 MiB
    candidate = setting(2, 32, 4)  # dominates the wall; the model: 356 MiB, far below 1000 MiB
    verdict = wall_verdict([*measured(), wall], candidate, LIMIT)
    assert verdict.retest_of == 4 and verdict.dominated_by is None
    assert verdict.predicted_peak_bytes == predicted_peak_bytes(candidate, FIGURES)
    retest = guard_pruned(5, candidate, predicted=False)
    retest.user_attrs[RETEST_ATTR] = 4
    again = wall_verdict([*measured(), wall, retest], setting(4, 32, 4), LIMIT)
    assert (again.retest_of, again.dominated_by) == (None, 4)


def test_no_re_test_where_the_model_says_it_does_not_fit() -> None:
    wall = guard_pruned(4, setting(2, 256), predicted=False)
    candidate = setting(2, 512, 4)  # 200 + 40 + 512 * 9 * 0.5 MiB: far above the limit
    verdict = wall_verdict([*measured(), wall], candidate, LIMIT)
    assert (verdict.dominated_by, verdict.retest_of) == (4, None)
    assert verdict.predicted_peak_bytes is not None and verdict.predicted_peak_bytes > LIMIT
    assert PREDICTED_PEAK_ATTR == "predicted_peak_host_memory_bytes"


def test_a_setting_stopped_twice_on_a_prediction_is_not_run_a_third_time() -> None:
    leaky = setting(2, 64)
    once = [guard_pruned(0, leaky, predicted=True)]
    assert measured_twin(once, leaky) is None  # one prediction may be wrong: run it again
    twice = [*once, guard_pruned(1, leaky, predicted=True)]
    twin = measured_twin(twice, leaky)
    assert twin is not None and twin.number == 1
    assert memory_walls(twice) == []  # and still no wall for the settings around it
    assert measured_twin(twice, setting(2, 128)) is None


def test_the_model_prunes_unrun_a_setting_it_puts_over_the_limit_without_a_wall() -> None:
    over = setting(4, 512, 2)  # 200 + 80 + 512 * (1 + 4) * 0.5 MiB = 1560 MiB before any queue
    verdict = wall_verdict(measured(), over, LIMIT)
    assert verdict.over_limit and verdict.dominated_by is None
    answered = _answer_from_storage(measured(), over, verdict)
    assert answered is not None and answered.state == "pruned"
    assert answered.reason == "memory_model"
    assert answered.attrs[PREDICTED_PEAK_ATTR] == predicted_peak_bytes(over, FIGURES)
    pruned = trial(4, over, TrialState.PRUNED, pruned_reason="memory_model")
    assert memory_walls([*measured(), pruned]) == []  # unconfirmed: no wall
    fits = setting(2, 64, 2)  # 200 + 40 + 64 * 5 * 0.5 = 400 MiB
    assert not wall_verdict(measured(), fits, LIMIT).over_limit
    assert _answer_from_storage(measured(), fits, wall_verdict(measured(), fits, LIMIT)) is None
    # Without enough measured trials there is no model, and nothing is pruned on it.
    assert not wall_verdict(measured()[:3], over, LIMIT).over_limit


def test_a_baseline_is_measured_again_but_not_run_past_the_limit() -> None:
    """The speedups are over the baseline's own measurement, not a twin's; the user's setting
    that the model puts over the limit is pruned unrun as any other."""
    over = setting(4, 512, 2)
    verdict = wall_verdict(measured(), over, LIMIT)
    answered = _answer_from_storage(measured(), over, verdict, baseline=True)
    assert answered is not None and answered.reason == "memory_model"
    twin = measured()[0]
    again = trial_settings(twin)
    verdict = wall_verdict(measured(), again, LIMIT)
    assert _answer_from_storage(measured(), again, verdict) is not None  # a repeat
    assert _answer_from_storage(measured(), again, verdict, baseline=True) is None  # runs


def test_a_full_queue_alone_does_not_prune_unrun() -> None:
    """The queue fills batch by batch, where the step is the slower side: the guard sees it."""
    queued = setting(4, 256, 2)  # workers' first batches: 920 MiB; the full queue: 1432 MiB
    verdict = wall_verdict(measured(), queued, LIMIT)
    assert not verdict.over_limit
    assert verdict.predicted_peak_bytes == predicted_peak_bytes(queued, FIGURES)
    assert verdict.predicted_peak_bytes > LIMIT
    assert predicted_peak_bytes(queued, FIGURES, queue_full=False) == 920 * MiB


def test_the_profiles_prior_prunes_before_the_trials_give_figures_then_gives_way() -> None:
    over = setting(4, 256, 2)
    prior = MemoryFigures(200 * MiB, 20 * MiB, 0.5 * MiB, 0.5 * MiB, max_in_flight=4)
    early = measured()[:3]
    verdict = wall_verdict(early, over, LIMIT, prior)
    # 200 + 80 + 256 * (1 + 4) * 0.5 MiB = 920 MiB under 1000: the queue stops at 4 batches.
    assert verdict.predicted_peak_bytes == predicted_peak_bytes(over, prior)
    assert not verdict.over_limit
    huge = dataclasses.replace(prior, worker_bytes=200 * MiB)
    assert wall_verdict([], over, LIMIT, huge).over_limit
    # Once the trials fit figures of their own, those decide.
    fitted = wall_verdict(measured(), over, LIMIT, huge)
    assert fitted.predicted_peak_bytes == predicted_peak_bytes(over, FIGURES)


def test_the_prior_comes_from_the_profiles_memory_for_the_settings_knobs() -> None:
    from tests.tuner_tests.pipeline.test_model import _profile

    knobs = {"collate": "uint8"}
    costs = {field: getattr(_profile(), field) for field in KNOB_COST_FIELDS}
    profile = _profile(
        worker_fork_bytes=30 * MiB,
        step_peak_bytes={8: 108 * MiB, 64: 164 * MiB},
        knob_costs={knob_key("collate", "uint8"): {**costs, "sample_bytes": 256.0}},
    )
    figures = prior_memory_figures(profile, knobs)
    assert figures is not None
    assert figures.main_bytes == pytest.approx(100 * MiB)
    assert figures.step_sample_bytes == pytest.approx(1 * MiB)
    assert (figures.worker_bytes, figures.sample_bytes) == (30 * MiB, 256.0)
    assert prior_memory_figures(profile, {})
    assert prior_memory_figures(_profile(), knobs) is None  # an older profile: no memory
    assert prior_memory_figures(None, knobs) is None


def test_the_prior_is_scaled_by_measured_over_predicted_at_the_nearest_complete_trial() -> None:
    doubled = MemoryFigures(400 * MiB, 40 * MiB, 1 * MiB)  # twice what the trials measure
    early = measured()[:3]
    candidate = setting(2, 32, 2)
    assert wall_verdict([], candidate, LIMIT, doubled).predicted_peak_bytes == (
        predicted_peak_bytes(candidate, doubled)
    )
    scaled = wall_verdict(early, candidate, LIMIT, doubled).predicted_peak_bytes
    assert scaled == pytest.approx(predicted_peak_bytes(candidate, FIGURES), abs=1)
    over = setting(4, 512, 2)  # before a queue, doubled: 3120 MiB; as measured: 1560 MiB
    assert wall_verdict([], over, LIMIT, doubled).over_limit
    assert wall_verdict(early, over, LIMIT, doubled).over_limit
    # Nearest the candidate is a trial that measured a quarter of the prior: it decides.
    low = trial(3, setting(2, 32, 2), TrialState.COMPLETE, peak_host_memory_bytes=180 * MiB)
    near = calibrated_prior(doubled, setting(2, 64, 2), [(setting(2, 32, 2), 180.0 * MiB)])
    assert near.main_bytes == pytest.approx(400 * MiB * 180 / 640)
    assert not wall_verdict([*early, low], setting(4, 64, 2), LIMIT, doubled).over_limit


def test_a_setting_the_model_pruned_unrun_runs_under_the_guard_when_proposed_again() -> None:
    over = setting(4, 512, 2)
    skipped = trial(5, over, TrialState.PRUNED, pruned_reason="memory_model")
    verdict = wall_verdict([*measured(), skipped], over, LIMIT)
    assert (verdict.over_limit, verdict.model_retest_of) == (False, 5)
    assert _answer_from_storage([*measured(), skipped], over, verdict) is None  # it runs
    retest = guard_pruned(6, over, predicted=True)
    retest.user_attrs[MODEL_RETEST_ATTR] = 5
    third = wall_verdict([*measured(), skipped, retest], over, LIMIT)
    assert third.over_limit and third.model_retest_of is None  # tested once: pruned again
    other = wall_verdict([*measured(), skipped], setting(4, 512, 3), LIMIT)
    assert other.over_limit  # another setting's first proposal is the model's to prune


def test_what_was_measured_answers_before_any_prediction() -> None:
    over = setting(4, 256, 2)
    measured_once = trial(0, over, TrialState.COMPLETE, peak_host_memory_bytes=900 * MiB)
    said_over = WallVerdict(2000 * MiB, over_limit=True)
    answered = _answer_from_storage([measured_once], over, said_over)
    assert answered is not None and answered.state == "complete"
    assert answered.attrs["repeat_of"] == 0
