"""A workload from the DataLoader a user trains with: what it keeps, and a real study of it."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler, WeightedRandomSampler

from objectives import Workload, WorkloadError, load_workload
from tests.conftest import study_cli
from tests.objectives_tests import dataloader_script
from tuner._attrs import trial_settings
from tuner.search import SearchSpace, baseline_settings
from tuner.search._settings import LoaderSettings

SCRIPT = Path(dataloader_script.__file__)


def test_the_loader_gives_its_dataset_collate_drop_last_init_batch_and_worker_settings() -> None:
    loader = dataloader_script.make_loader()
    workload = Workload.from_dataloader(loader, dataloader_script.train_step)
    assert isinstance(workload.dataset, dataloader_script.Points)
    assert workload.collate_fn is dataloader_script.pairs_collate
    assert workload.drop_last is True
    assert workload.worker_init_fn is dataloader_script.mark_worker
    assert workload.default_batch_size == 24
    assert workload.batch_size_range == (8, 512)
    assert workload.sampler is None  # shuffle=True: the tuner shuffles the same way
    assert dict(workload.current) == {
        "num_workers": 2,
        "prefetch_factor": 3,
        "pin_memory": False,
        "persistent_workers": True,
    }
    kwargs = LoaderSettings(batch=24, num_workers=1, prefetch_factor=2).build_dataloader_kwargs(
        workload, seed=0
    )
    assert kwargs["shuffle"] is True and kwargs["drop_last"] is True
    assert kwargs["collate_fn"] is dataloader_script.pairs_collate


def test_a_sampler_of_the_users_own_is_kept_and_a_large_batch_widens_the_range() -> None:
    points = dataloader_script.Points()
    weighted = WeightedRandomSampler(torch.ones(len(points)), num_samples=64)
    workload = Workload.from_dataloader(DataLoader(points, batch_size=1024, sampler=weighted))
    assert workload.sampler is weighted and workload.batch_size_range == (8, 1024)
    kwargs = LoaderSettings(batch=16, num_workers=0).build_dataloader_kwargs(workload, seed=0)
    assert kwargs["sampler"] is weighted and "shuffle" not in kwargs
    ordered = Workload.from_dataloader(DataLoader(points, batch_size=4))
    assert isinstance(ordered.sampler, SequentialSampler)  # no shuffle today: none in trials
    assert ordered.collate_fn is None and ordered.current["num_workers"] == 0


def test_the_pytorch_default_baseline_is_the_users_loader_exactly() -> None:
    points = dataloader_script.Points()
    weighted = WeightedRandomSampler(torch.ones(len(points)), num_samples=192)
    loader = DataLoader(
        points, batch_size=48, sampler=weighted, num_workers=2, prefetch_factor=4, drop_last=True
    )
    workload = Workload.from_dataloader(loader, dataloader_script.train_step)
    space = SearchSpace(workload=workload, max_workers=8, max_threads=2, cuda=False)
    assert 48 in space.batch_choices() and {8, 16, 32, 64} <= set(space.batch_choices())
    today = baseline_settings(space, physical_cores=2)["pytorch-default"]
    assert today.batch == 48  # not rounded down to a power of two
    assert (today.num_workers, today.prefetch_factor, today.persistent_workers) == (2, 4, False)
    kwargs = today.build_dataloader_kwargs(workload, seed=0)
    assert kwargs["batch_size"] == 48 and kwargs["sampler"] is weighted
    assert kwargs["drop_last"] is True and kwargs["num_workers"] == 2


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("own_batch_sampler", "batch_sampler of its own, which the tuner cannot size"),
        ("not_a_loader", "returned a value of type int; expected a Workload, a DataLoader"),
    ],
)
def test_what_cannot_be_tuned_is_one_clear_line(attr: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message) as caught:
        load_workload(f"{SCRIPT}:{attr}")
    assert "\n" not in str(caught.value)


def test_an_attr_that_is_a_loader_or_a_loader_and_step_loads() -> None:
    assert load_workload(f"{SCRIPT}:LOADER").default_batch_size == 16
    workload = load_workload(f"{SCRIPT}:training")
    assert workload.name == "training" and workload.step is not None


@pytest.mark.slow
def test_a_study_of_a_users_dataloader_runs_its_settings_as_the_baseline_and_its_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("MARKER_DIR", str(markers))
    url = f"sqlite:///{tmp_path / 't.db'}"
    objective = f"{SCRIPT}:training"
    result = study_cli(url, objective, "--n-trials", "4", "--remeasure-top", "0")
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name=None, storage=url)
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == 4
    baseline = next(t for t in finished if t.user_attrs.get("baseline") == "pytorch-default")
    today = trial_settings(baseline)
    assert (today.num_workers, today.prefetch_factor, today.persistent_workers) == (2, 3, True)
    assert today.batch == 24  # the user's own batch size, though not a power of two
    assert any(markers.iterdir())  # the user's worker_init_fn ran in the trials' workers
