from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tuner
from tests.conftest import best_cli, study_cli
from tests.tuner_tests import workloads
from tuner._loader import AdaptiveLoader, MachineState, clamp_to_machine
from tuner.machine import auto_profile_name, detect_fingerprint
from tuner.search._settings import LoaderSettings

GIB = 2**30
OPTIMUM = LoaderSettings(batch=64, num_workers=8, prefetch_factor=4, persistent_workers=True)


def _state(
    cpus: int = 8, cpu_percent: float = 10.0, available_gib: float = 30.0, total_gib: float = 32.0
) -> MachineState:
    return MachineState(cpus, cpu_percent, int(available_gib * GIB), int(total_gib * GIB))


def test_clamping_to_fewer_cpus_and_less_memory() -> None:
    assert clamp_to_machine(OPTIMUM, 8, 32 * GIB, _state()) == OPTIMUM
    fewer = clamp_to_machine(OPTIMUM, 8, 32 * GIB, _state(cpus=4))
    assert fewer.num_workers == 4 and fewer.prefetch_factor == 4
    tight = clamp_to_machine(OPTIMUM, 8, 32 * GIB, _state(available_gib=6, total_gib=8))
    assert tight.num_workers == 8 and tight.prefetch_factor == 1
    assert clamp_to_machine(OPTIMUM, 8, 32 * GIB, _state(available_gib=2)) == OPTIMUM
    none = clamp_to_machine(
        LoaderSettings(batch=8, num_workers=1, prefetch_factor=2), 8, 32 * GIB, _state(cpus=1)
    )
    assert (
        none.num_workers == 0 and none.prefetch_factor is None and none.persistent_workers is False
    )


def test_adapt_steps_down_under_pressure_and_back_up(caplog: pytest.LogCaptureFixture) -> None:
    states = iter(
        [
            _state(cpu_percent=99),
            _state(cpu_percent=99),
            _state(available_gib=1),
            _state(),
            _state(),
            _state(),
            _state(),
        ]
    )
    dataset = TensorDataset(torch.arange(32.0))
    optimum = LoaderSettings(batch=8, num_workers=2, prefetch_factor=4, persistent_workers=True)
    adaptive = AdaptiveLoader(dataset, optimum, "batch_size", {}, read=lambda: next(states))
    with caplog.at_level(logging.WARNING, logger="tuner.loader"):
        seen = []
        for _ in range(8):
            assert sum(len(b[0]) for b in adaptive) == 32  # a whole epoch, whatever the setting
            seen.append((adaptive.current.num_workers, adaptive.current.prefetch_factor))
    assert seen[:4] == [(2, 4), (2, 3), (2, 2), (2, 1)]
    assert seen[4:7] == [(2, 2), (2, 3), (2, 4)]
    assert len(caplog.records) >= 6


def test_loader_falls_back_to_the_rule_of_thumb(tmp_path: Path) -> None:
    dataset = TensorDataset(torch.arange(16.0))
    with pytest.warns(UserWarning, match="rule of thumb"):
        loader = tuner.loader(
            dataset, objective="image", storage=f"sqlite:///{tmp_path / 'none.db'}", batch_size=4
        )
    assert isinstance(loader, DataLoader) and loader.batch_size == 4
    assert loader.num_workers >= 1


KNOBBED = "tests.tuner_tests.workloads:knobbed"


@pytest.fixture(autouse=True)
def _keep_threads() -> Iterator[None]:
    """tuner.loader sets the process's intra-op threads; give the next test its own back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def knobbed_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A real study of a workload with a knob, its best away from the default; its stderr."""
    url = f"sqlite:///{tmp_path_factory.mktemp('knobbed') / 't.db'}"
    flags = ("--n-trials", "4", "--remeasure-top", "0", "--fix", "collate=stacked")
    result = study_cli(url, KNOBBED, *flags)
    assert result.returncode == 0, result.stderr
    return url, result.stderr


@pytest.mark.slow
def test_loader_uses_the_stored_best(knobbed_study: tuple[str, str]) -> None:
    url, stderr = knobbed_study
    best = json.loads(best_cli(url, KNOBBED, "--format", "json").stdout)
    assert best["knobs"] == {"collate": "stacked"}
    other_threads = 1 if best["torch_num_threads"] > 1 else 2
    torch.set_num_threads(other_threads)
    with pytest.warns(UserWarning, match="knobs collate='stacked'.*pass workload="):
        loader = tuner.loader(TensorDataset(torch.arange(64.0)), objective=KNOBBED, storage=url)
    assert isinstance(loader, DataLoader)
    assert loader.batch_size == best["dataloader"]["batch_size"]
    assert loader.num_workers == best["dataloader"]["num_workers"]
    assert torch.get_num_threads() == best["torch_num_threads"]
    assert auto_profile_name(detect_fingerprint()) in stderr


@pytest.mark.slow
def test_loader_applies_the_knobs_through_the_workload(
    knobbed_study: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = knobbed_study
    setting = tuner.best_setting(objective=KNOBBED, storage=url)
    torch.set_num_threads(1 if setting.torch_num_threads > 1 else 2)
    with caplog.at_level(logging.INFO, logger="tuner.loader"):
        loader = tuner.loader(workload=workloads.knobbed(), objective=KNOBBED, storage=url)
    assert isinstance(loader, DataLoader)
    assert loader.collate_fn is workloads.stacking_collate
    assert {key: getattr(loader, key) for key in setting.dataloader_kwargs} == (
        setting.dataloader_kwargs
    )
    assert torch.get_num_threads() == setting.torch_num_threads
    assert f"torch.set_num_threads({setting.torch_num_threads})" in caplog.text
    images, labels = next(iter(loader))
    assert len(images) == setting.batch and labels.dtype == torch.int64


@pytest.mark.slow
def test_set_threads_false_keeps_the_callers_threads(knobbed_study: tuple[str, str]) -> None:
    url, _ = knobbed_study
    setting = tuner.best_setting(objective=KNOBBED, storage=url)
    mine = setting.torch_num_threads + 1
    torch.set_num_threads(mine)
    tuner.loader(workload=workloads.knobbed(), objective=KNOBBED, storage=url, set_threads=False)
    assert torch.get_num_threads() == mine


@pytest.mark.slow
def test_loader_takes_a_dataset_or_a_workload(knobbed_study: tuple[str, str]) -> None:
    url, _ = knobbed_study
    with pytest.raises(TypeError, match="exactly one"):
        tuner.loader(objective=KNOBBED, storage=url)
    with pytest.raises(TypeError, match="exactly one"):
        tuner.loader(
            TensorDataset(torch.arange(8.0)),
            workload=workloads.knobbed(),
            objective=KNOBBED,
            storage=url,
        )


def test_gpu_memory_counts_as_pressure() -> None:
    assert _state().available_fraction > 0.9
    gpu_full = MachineState(8, 10.0, 30 * GIB, 32 * GIB, gpu_free_fraction=0.05)
    assert gpu_full.available_fraction == 0.05
