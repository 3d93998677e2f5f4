"""bench.replay on a small synthetic landscape written as bench.search writes its results."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from bench.replay import load, load_profile, main, model_setup, replay_study
from tests.tuner_tests.pipeline.test_model import _profile as profile_like
from tuner.pipeline import PipelineProfile, predict
from tuner.run import StudyConfig
from tuner.search._settings import LoaderSettings

BATCHES = (16, 32, 64, 128)


def _settings(workers: int, batch: int, threads: int) -> LoaderSettings:
    return LoaderSettings(
        batch=batch,
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        persistent_workers=workers > 0,
        torch_num_threads=threads,
        knobs={"collate": "uint8"},
    )


def _speed(settings: LoaderSettings) -> float:
    """One clear optimum at 2 workers, batch 64, 1 thread."""
    return (
        1000.0
        - 150.0 * abs(settings.num_workers - 2)
        - 100.0 * abs(settings.batch.bit_length() - 7)
        - 50.0 * (settings.torch_num_threads - 1)
    )


def _profile() -> PipelineProfile:
    """CPU-bound, image-like: 1.5 ms of CPU per sample in a worker, a step at 800-1,900/s."""
    return profile_like(
        fetch_wall_s=0.002,
        fetch_cpu_s=0.0015,
        collate_s=0.0001,
        ipc_dump_s=0.00005,
        ipc_load_s=0.00005,
        samples_per_batch={b: float(b) for b in BATCHES},
        step_rates={
            1: {16: 800.0, 32: 1200.0, 64: 1500.0, 128: 1300.0},
            2: {16: 1000.0, 32: 1500.0, 64: 1900.0, 128: 1700.0},
        },
        step_cpu_s={1: {b: 1 / 1200 for b in BATCHES}, 2: {b: 2 / 1500 for b in BATCHES}},
        dataset_samples=4096,
    )


def _write_results(
    path: Path,
    grid: list[LoaderSettings],
    speed: Callable[[LoaderSettings], float],
    model: dict[str, Any] | None,
) -> Path:
    """A results file as bench.search writes it: the grid, the baselines, the model's profile."""
    default, rule = _settings(0, 32, 2), _settings(2, 32, 2)
    results = {
        "workload": {"name": "image", "batch_param": "batch_size"},
        "baselines": ["pytorch-default", "rule-of-thumb"],
        "grid": {"points": [{"settings": s.to_attrs(), "samples_per_sec": speed(s)} for s in grid]},
        "side_by_side": [
            {"labels": ["pytorch-default"], "settings": default.to_attrs(), "samples_per_sec": []},
            {"labels": ["rule-of-thumb"], "settings": rule.to_attrs(), "samples_per_sec": []},
        ],
        "model": model,
    }
    path.write_text(json.dumps(results))
    return path


def _grid(workers: Iterable[int] = range(4)) -> list[LoaderSettings]:
    return [_settings(w, b, t) for w, b, t in itertools.product(workers, BATCHES, (1, 2))]


def _is_a_grid_score(score: float, grid: Iterable[LoaderSettings] | None = None) -> bool:
    """Whether ``score`` is one grid point's true speed over the optimum's (1,000): a pick's
    score is the true value of a setting the study measured, never a noisy reading."""
    return any(abs(score - _speed(s) / 1000.0) < 1e-9 for s in grid or _grid())


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    """The landscape of :func:`_speed`, which the profile's model does not know."""
    model = {"profile": _profile().to_attrs()}
    return _write_results(tmp_path / "search-image.json", _grid(), _speed, model)


def test_the_landscape_and_baselines_come_from_the_results(results_file: Path) -> None:
    landscape, baselines, name = load(results_file)
    assert name == "image"
    assert len(landscape.values) == 32 and landscape.best == 1000.0
    assert landscape.workers == [0, 1, 2, 3] and landscape.batches == [16, 32, 64, 128]
    assert set(baselines) == {"pytorch-default", "rule-of-thumb"}


def test_without_noise_a_budget_covering_the_grid_picks_the_optimum(results_file: Path) -> None:
    landscape, baselines, _ = load(results_file)
    scores = replay_study(
        landscape, baselines, "random", seed=0, budgets=[5, 200], noise=0.0
    ).scores
    # The rule of thumb (850) is measured second; five trials pick it or better.
    assert _is_a_grid_score(scores[5]) and scores[5] >= 0.85
    assert scores[200] == 1.0


def test_replays_are_repeatable_per_seed(results_file: Path) -> None:
    landscape, baselines, _ = load(results_file)
    first = replay_study(landscape, baselines, "tpe", seed=3, budgets=[10, 20], noise=0.1)
    again = replay_study(landscape, baselines, "tpe", seed=3, budgets=[10, 20], noise=0.1)
    assert first.scores == again.scores


def test_the_cli_prints_one_row_per_strategy_and_budget(
    results_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "--from-search",
                str(results_file),
                "--seeds",
                "3",
                "--budgets",
                "8,12",
                "--strategies",
                "tpe,random",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert table.count("| tpe |") == 2 and table.count("| random |") == 2


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, results_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--from-search", str(tmp_path / "missing.json")]) == 2
    assert main(["--from-search", str(results_file), "--strategies", "annealing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "bench.replay: no such file: " + str(tmp_path / "missing.json"),
        "bench.replay: unknown strategy annealing",
    ]


def test_pruning_can_be_set_for_every_strategy(results_file: Path) -> None:
    """With the pruner on, gp runs as tpe does; off, tpe runs every trial to the end."""
    landscape, baselines, _ = load(results_file)
    for pruning in ("off", "on"):
        for strategy in ("gp", "tpe"):
            scores = replay_study(landscape, baselines, strategy, 0, [10], 0.1, pruning).scores
            assert _is_a_grid_score(scores[10])


def test_the_model_strategy_runs_and_stops_within_the_budget(results_file: Path) -> None:
    landscape, baselines, _ = load(results_file)
    profiled = load_profile(results_file)
    assert profiled is not None
    profile, bound = profiled
    setup = model_setup(landscape, profile, baselines, bound)
    for seed in range(3):
        study = replay_study(landscape, baselines, "model", seed, [5, 10, 40], 0.1, setup=setup)
        assert all(_is_a_grid_score(score) for score in study.scores.values())
        assert all(study.trials[budget] <= budget for budget in (5, 10, 40))
        assert study.trials[5] <= study.trials[10] <= study.trials[40]
        if study.trials[10] < 10:  # stopped: the pick stands for the larger budgets
            assert study.trials[40] == study.trials[10]
            assert study.scores[40] == study.scores[10]
        assert study == replay_study(
            landscape, baselines, "model", seed, [5, 10, 40], 0.1, setup=setup
        )


def test_a_model_that_agrees_with_the_landscape_finds_the_optimum_in_few_trials(
    tmp_path: Path,
) -> None:
    """The grid is the model's own prediction: its predicted best, queued after the baselines,
    is the optimum, its neighbours confirm it, and the study stops."""
    profile = _profile()

    def speed(settings: LoaderSettings) -> float:
        return predict(profile, settings).samples_per_sec

    model = {"profile": profile.to_attrs(), "bound": 800.0}
    path = _write_results(tmp_path / "search-image.json", _grid(), speed, model)
    landscape, baselines, _ = load(path)
    assert load_profile(path) == (profile, 800.0)
    setup = model_setup(landscape, profile, baselines, bound=800.0)
    assert setup.model.bound == 800.0  # the stored bound, not the model's own
    assert landscape.true_value(setup.model.best) == landscape.best
    study = replay_study(landscape, baselines, "model", 0, [5, 10, 40], 0.0, setup=setup)
    assert study.scores == {5: 1.0, 10: 1.0, 40: 1.0}
    assert study.trials[40] <= 10
    assert study.snapped_trials == 0


def test_a_setting_off_the_grid_is_valued_as_its_nearest_point(tmp_path: Path) -> None:
    """Workers 0, 1, 2, 4, 8: the model's ladder and Optuna's integers fall between them."""
    path = _write_results(tmp_path / "search-image.json", _grid((0, 1, 2, 4, 8)), _speed, None)
    landscape, baselines, _ = load(path)
    three, four = _settings(3, 64, 1), _settings(4, 64, 1)
    assert not landscape.on_grid(three)
    assert landscape.nearest(three) == four
    assert landscape.true_value(three) == _speed(four)
    study = replay_study(landscape, baselines, "random", 0, [20], 0.1)
    assert study.snapped_trials > 0
    assert _is_a_grid_score(study.scores[20], _grid((0, 1, 2, 4, 8)))


def test_the_cli_runs_the_model_strategy_where_the_file_has_a_profile(
    tmp_path: Path, results_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--seeds", "2", "--budgets", "6,12", "--strategies", "model,random"]
    assert main(["--from-search", str(results_file), *argv]) == 0
    out = capsys.readouterr().out
    assert "model: workers 0..3" in out
    assert out.count("| model |") == 2 and out.count("| random |") == 2
    bare = _write_results(tmp_path / "bare.json", _grid(), _speed, None)
    assert main(["--from-search", str(bare), *argv]) == 2
    assert capsys.readouterr().err.strip() == f"bench.replay: no pipeline profile in {bare} (model)"


def test_the_final_race_runs_as_many_extra_rounds_as_asked(results_file: Path) -> None:
    landscape, baselines, _ = load(results_file)
    # Without noise the top candidates stay apart by their true gaps, 5-15%: within the race's
    # margin, so each extra round measures every candidate still in it.
    without, one, two = (
        replay_study(landscape, baselines, "random", 0, [20], 0.0, selection=(2, extra))
        for extra in (0, 1, 2)
    )
    assert 0 < without.selection_reads[20] < one.selection_reads[20] < two.selection_reads[20]
    assert without.scores == one.scores == two.scores  # nothing to resolve without noise
    assert without.holdout_reads == one.holdout_reads == two.holdout_reads


def test_the_final_re_measurement_is_the_tuner_s_selection_and_hold_out(
    results_file: Path,
) -> None:
    """Without noise: contenders within the margin race, the pick's figure is its true value
    from the hold-out's rounds, and each baseline far behind takes one hold-out round."""
    landscape, baselines, _ = load(results_file)
    study = replay_study(landscape, baselines, "random", 0, [20], 0.0)
    assert study.figures[20] == 1.0
    rounds = StudyConfig().remeasure_rounds
    # The pick's rounds; the baselines (850 and 550 against at most 1,000) one round or all.
    assert rounds + len(baselines) <= study.holdout_reads[20] <= rounds * (1 + len(baselines))
    noisy = [replay_study(landscape, baselines, "random", s, [20], 0.1) for s in range(4)]
    assert all(0.7 < replay.figures[20] < 1.3 for replay in noisy)
