"""The ceiling: the step alone on a prepared batch, and the early stop once the best is near it.

``compute_bound`` is a workload whose loader is trivially fast (a batch is a view of a prebuilt
tensor) and whose step takes 50 ms without using a CPU, as a GPU-bound step does: every
DataLoader setting reaches the ceiling, so a study of it should stop after its first trials.
"""

from __future__ import annotations

import time

import optuna
import pytest
import torch
from optuna.distributions import IntDistribution
from torch.utils.data import Dataset

from objectives import Workload
from tests.conftest import run_cli
from tests.tuner_tests.workloads import fast
from tuner._ceiling import CEILING_ATTR, ceiling_stop_message, efficiency, measure_ceiling
from tuner._measure import measure
from tuner._settings import LoaderSettings

STEP_S = 0.05
BATCH = 64
CPU = torch.device("cpu")


class Prebuilt(Dataset):
    """Samples that cost nothing: a batch is a slice of one tensor made up front."""

    def __init__(self, size: int = 4096, width: int = 64) -> None:
        self.data = torch.rand(size, width, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.data[: len(indices)].clone()  # a view would ship the whole storage


def _as_is(batch: torch.Tensor) -> torch.Tensor:
    return batch


def _device_bound_step(batch: torch.Tensor, device: torch.device) -> None:
    batch.sum().item()
    time.sleep(STEP_S)


def compute_bound() -> Workload:
    return Workload(
        name="compute_bound",
        dataset=Prebuilt(),
        step=_device_bound_step,
        collate_fn=_as_is,
        default_batch_size=BATCH,
        batch_size_range=(BATCH, BATCH),
    )


def test_the_ceiling_is_the_step_alone_and_a_fast_loader_reaches_it() -> None:
    workload = compute_bound()
    settings = LoaderSettings(batch=BATCH, num_workers=0, torch_num_threads=1)
    ceiling = measure_ceiling(workload, settings, CPU, window_s=0.5, warmup_s=0.05)
    assert 0.8 * BATCH / STEP_S < ceiling <= BATCH / STEP_S
    measured = measure(workload, settings, CPU, window_s=0.5, warmup_s=0.05)
    share = efficiency(measured.samples_per_sec, ceiling)
    assert share is not None and share >= 0.95


def test_a_slow_loader_stays_far_below_the_ceiling() -> None:
    workload = fast()  # its step is a sum: the loader is everything
    settings = LoaderSettings(batch=32, num_workers=0, torch_num_threads=1)
    ceiling = measure_ceiling(workload, settings, CPU, window_s=0.3, warmup_s=0.05)
    measured = measure(workload, settings, CPU, window_s=0.3, warmup_s=0.05)
    assert efficiency(measured.samples_per_sec, ceiling) < 0.5  # type: ignore[operator]


def test_the_ceiling_is_the_best_over_the_batches_tried() -> None:
    workload = fast()
    settings = LoaderSettings(batch=8, num_workers=0, torch_num_threads=1)
    small = measure_ceiling(workload, settings, CPU, window_s=0.2, warmup_s=0.0)
    either = measure_ceiling(workload, settings, CPU, window_s=0.2, warmup_s=0.0, batches=[8, 64])
    # The step costs about the same per batch whatever its size: 64 per step is far faster.
    assert either > 2 * small


def _study_with_one_measured_trial(url: str, workload: Workload, batch: int) -> optuna.Study:
    settings = LoaderSettings(batch=batch, num_workers=0, torch_num_threads=1)
    study = optuna.create_study(storage=url, direction="maximize")
    study.set_user_attr(
        CEILING_ATTR, measure_ceiling(workload, settings, CPU, window_s=0.4, warmup_s=0.05)
    )
    measured = measure(workload, settings, CPU, window_s=0.4, warmup_s=0.05)
    study.add_trial(
        optuna.trial.create_trial(
            value=measured.samples_per_sec,
            params={"num_workers": 0},
            distributions={"num_workers": IntDistribution(0, 4)},
            user_attrs={"settings": settings.to_attrs(), **measured.to_attrs()},
        )
    )
    return study


def test_a_best_near_the_ceiling_stops_the_study(sqlite_url: str) -> None:
    study = _study_with_one_measured_trial(sqlite_url, compute_bound(), BATCH)
    message = ceiling_stop_message(study, fraction=0.95)
    assert message is not None and message.startswith("stopping early: trial 0")
    assert "of the ceiling" in message


def test_a_best_far_from_the_ceiling_goes_on(sqlite_url: str) -> None:
    study = _study_with_one_measured_trial(sqlite_url, fast(), 32)
    assert ceiling_stop_message(study) is None
    bare = optuna.create_study(storage=sqlite_url, study_name="no-ceiling", direction="maximize")
    assert ceiling_stop_message(bare) is None


@pytest.mark.slow
def test_a_study_of_a_compute_bound_workload_stops_early(sqlite_url: str) -> None:
    result = run_cli(
        "tuner.study",
        "--hardware",
        "auto",
        "--objective",
        "tests.tuner_tests.test_ceiling:compute_bound",
        "--n-trials",
        "5",
        "--trial-seconds",
        "0.5",
        "--warmup-seconds",
        "0.1",
        "--no-progress",
        "--no-probe-batch",
        "--remeasure-top",
        "0",
        "--storage",
        sqlite_url,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "stopping early" in result.stdout + result.stderr
    (summary,) = optuna.get_all_study_summaries(sqlite_url)
    study = optuna.load_study(study_name=summary.study_name, storage=sqlite_url)
    ceiling = study.user_attrs[CEILING_ATTR]
    assert 0.8 * BATCH / STEP_S < ceiling <= BATCH / STEP_S
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert 0 < len(trials) < 5
    assert all(trial.user_attrs["efficiency"] > 0.5 for trial in trials)
