"""The gRPC storage proxy for large fleets, served for real and used by a real study."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from storage.testing import served_proxy
from tests.cli_runner import CliRunner
from tests.conftest import forked_cli, study_cli


@pytest.mark.slow
def test_a_study_through_the_grpc_proxy(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'fleet.db'}"
    with served_proxy(database) as url:
        objective = "tests.tuner_tests.workloads:fast"
        result = study_cli(url, objective, "--n-trials", "3", "--remeasure-top", "0")
        assert result.returncode == 0, result.stderr
    summaries = optuna.get_all_study_summaries(database)
    assert len(summaries) == 1 and summaries[0].n_trials == 3


def test_the_proxy_refuses_a_bad_storage(tmp_path: Path, cli_runner: CliRunner) -> None:
    result = forked_cli(cli_runner, "storage.proxy", "--storage", "nonsense")
    assert result.returncode == 2 and "not a storage URL" in result.stderr
