"""Finding the edge first: the ceiling's climb, or the batch-size probe where the memory wall
stops the ceiling; trials stay below it."""

from __future__ import annotations

from pathlib import Path

import optuna

from objectives import Workload
from tests.conftest import study_cli
from tests.tuner_tests.test_ceiling import sleeping


def test_the_probe_bounds_the_batch_size_by_the_wall(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    result = study_cli(
        storage,
        "tests.tuner_tests.workloads:heavy",
        "--n-trials",
        "4",
        "--memory-limit",
        "900MiB",
        "--remeasure-top",
        "0",
    )
    assert result.returncode == 0, result.stderr
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    largest = study.user_attrs["max_batch_size"]
    # 8 MiB samples, counted twice once collated, under 900 MiB: 64 cannot fit, 8 must.
    assert 8 <= largest < 64
    for trial in study.trials:
        assert trial.user_attrs["settings"]["batch"] <= largest


def cliff() -> Workload:
    """1 ms a step up to 64 samples and half a second beyond: the ceiling's climb stops at 128."""
    return sleeping("cliff", lambda samples: 0.001 if samples <= 64 else 0.5, 256)


def _study(storage: str) -> optuna.Study:
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def test_where_nothing_stops_the_ceiling_its_climb_is_the_edge(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    objective = "tests.tuner_tests.test_probe:cliff"
    result = study_cli(storage, objective, "--n-trials", "2", "--remeasure-top", "0")
    assert result.returncode == 0, result.stderr
    study = _study(storage)
    stepped = {int(b) for row in study.user_attrs["step_samples_per_sec"].values() for b in row}
    # 256 fits (a probe would have stepped it and made it the edge), but steps slower per
    # sample than 64: the space ends where the climb stopped.
    assert max(stepped) == 128
    assert study.user_attrs["max_batch_size"] == 128
    for trial in study.trials:
        assert trial.user_attrs["settings"]["batch"] <= 128
