"""Finding the edge first: the ceiling's climb, or the batch-size probe where the memory wall
stops the ceiling; trials stay below it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from objectives import Workload
from tests.conftest import study_cli
from tests.tuner_tests.test_ceiling import sleeping
from tests.tuner_tests.workloads import heavy
from tuner._naming import STEP_PEAK_ATTR, STEP_RATES_ATTR
from tuner.run._probe import PEAK_OVER_LIMIT, climbed_edge, probe_max_batch
from tuner.search import SearchSpace
from tuner.trial._outcome import TrialOutcome
from tuner.trial._protocol import Fits

MiB = 2**20
LIMIT = 900 * MiB
PEAKS = {4: 220 * MiB, 8: 290 * MiB, 16: 430 * MiB, 32: 700 * MiB, 64: 1250 * MiB}
"""The heavy workload's step peaks as a ceiling child reads them (8 MiB samples, twice)."""


@pytest.mark.slow
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
    peaks = study.user_attrs.get(STEP_PEAK_ATTR, {})
    assert all(peak < 900 * MiB for batch, peak in peaks.items() if int(batch) <= largest)
    for trial in study.trials:
        assert trial.user_attrs["settings"]["batch"] <= largest


def cliff() -> Workload:
    """1 ms a step up to 64 samples and half a second beyond: the ceiling's climb stops at 128."""
    return sleeping("cliff", lambda samples: 0.001 if samples <= 64 else 0.5, 256)


def _study(storage: str) -> optuna.Study:
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


@pytest.mark.slow
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


def _prepared() -> Any:
    space = SearchSpace(workload=heavy(), max_workers=2, max_threads=1, cuda=False)
    return SimpleNamespace(
        space=space, workload=space.workload, limits=SimpleNamespace(host_bytes=LIMIT)
    )


def test_a_climb_whose_peak_crossed_the_limit_between_readings_does_not_fit_there() -> None:
    """The flake this guards against: the guard read the heavy workload before and after its
    batch of 64 peaked, so the climb stepped 64 and made it the edge."""
    rates = {"1": {str(batch): 100.0 for batch in PEAKS}}
    peaks = {str(batch): peak for batch, peak in PEAKS.items()}
    attrs = {STEP_RATES_ATTR: rates, STEP_PEAK_ATTR: peaks}
    assert climbed_edge(_prepared(), attrs) == 32
    assert climbed_edge(_prepared(), {STEP_RATES_ATTR: rates}) == 64  # no peaks: as stepped


class _Supervisor:
    """Runs a probe as a child whose guard never stopped it, reporting ``PEAKS``."""

    def __init__(self) -> None:
        self.guard = SimpleNamespace(limits=SimpleNamespace(host_bytes=LIMIT))
        self.runs: list[tuple[int, ...]] = []

    def run(self, job: Any, deadline_s: float, on_message: Callable[[Fits], None]) -> Any:
        self.runs.append(job.batches)
        for batch in job.batches:
            on_message(Fits(batch, PEAKS.get(batch, PEAKS[64] + batch * MiB)))
        return TrialOutcome("complete")


class _Job:
    def __init__(self, **fields: Any) -> None:
        self.batches = fields.get("batches", ())

    def replace(self, **changes: Any) -> _Job:
        return _Job(**changes)


@pytest.mark.parametrize("candidates", [[4, 8, 16, 32, 64], [4, 8, 16, 32, 64, 128]])
def test_a_probe_whose_peak_crossed_the_limit_between_readings_does_not_fit_there(
    candidates: list[int],
) -> None:
    supervisor = _Supervisor()
    largest, reason = probe_max_batch(supervisor, _Job(), candidates, 60.0)  # type: ignore[arg-type]
    assert (largest, reason) == (32, PEAK_OVER_LIMIT)
    assert supervisor.runs == [tuple(candidates), (48,)]  # and the size between is tried
