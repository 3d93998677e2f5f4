"""bench.replay on a small synthetic landscape written as bench.search writes its results."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from bench.replay import load, main, replay
from tuner.search._settings import LoaderSettings


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


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    grid = [
        _settings(w, b, t) for w, b, t in itertools.product(range(4), (16, 32, 64, 128), (1, 2))
    ]
    default, rule = _settings(0, 32, 2), _settings(2, 32, 2)
    results = {
        "workload": {"name": "image", "batch_param": "batch_size"},
        "baselines": ["pytorch-default", "rule-of-thumb"],
        "grid": {
            "points": [{"settings": s.to_attrs(), "samples_per_sec": _speed(s)} for s in grid]
        },
        "side_by_side": [
            {"labels": ["pytorch-default"], "settings": default.to_attrs(), "samples_per_sec": []},
            {"labels": ["rule-of-thumb"], "settings": rule.to_attrs(), "samples_per_sec": []},
        ],
    }
    path = tmp_path / "search-image.json"
    path.write_text(json.dumps(results))
    return path


def test_the_landscape_and_baselines_come_from_the_results(results_file: Path) -> None:
    landscape, baselines, name = load(results_file)
    assert name == "image"
    assert len(landscape.values) == 32 and landscape.best == 1000.0
    assert landscape.workers == [0, 1, 2, 3] and landscape.batches == [16, 32, 64, 128]
    assert set(baselines) == {"pytorch-default", "rule-of-thumb"}


def test_without_noise_a_budget_covering_the_grid_picks_the_optimum(results_file: Path) -> None:
    landscape, baselines, _ = load(results_file)
    scores = replay(landscape, baselines, "random", seed=0, budgets=[5, 200], noise=0.0)
    assert 0.0 < scores[5] <= 1.0
    assert scores[200] == 1.0


def test_replays_are_repeatable_per_seed(results_file: Path) -> None:
    landscape, baselines, _ = load(results_file)
    first = replay(landscape, baselines, "tpe", seed=3, budgets=[10, 20], noise=0.1)
    assert first == replay(landscape, baselines, "tpe", seed=3, budgets=[10, 20], noise=0.1)


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
            scores = replay(landscape, baselines, strategy, 0, [10], 0.1, pruning)
            assert 0.0 < scores[10] <= 1.0
