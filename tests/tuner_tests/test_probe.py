"""Finding the edge first: the batch-size probe stops at the memory wall, and trials stay below."""

from __future__ import annotations

from pathlib import Path

import optuna

from tests.conftest import study_cli


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
