"""The measurement loop: what samples/sec counts, for plain and batch-sampler loaders."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from torch.utils.data import Dataset

from objectives import text_workload
from tests.tuner_tests.workloads import Vectors, fast
from tuner.search._settings import LoaderSettings
from tuner.trial._measure import epoch_mean_batch, measure

CPU = torch.device("cpu")
SMALL_TEXT = {"sequences": 300, "vocab_size": 64, "max_length": 96}


def test_a_plain_loader_counts_the_samples_it_saw() -> None:
    workload = fast()
    settings = LoaderSettings(batch=32, num_workers=0, torch_num_threads=1)
    assert epoch_mean_batch(workload, settings, seed=0) is None
    measured = measure(workload, settings, CPU, window_s=0.2, warmup_s=0.0)
    assert measured.samples_per_sec == pytest.approx(measured.samples / measured.window_s)
    assert measured.epoch_batches == -(-len(workload.dataset) // 32)  # for the diagnosis


def test_a_batch_sampler_counts_each_batch_at_the_epochs_mean_size() -> None:
    workload = text_workload(**SMALL_TEXT)
    settings = LoaderSettings(batch=1024, num_workers=0, torch_num_threads=1)
    plan = list(workload.batch_sampler(workload.dataset, 1024, 0))  # type: ignore[misc]
    mean = epoch_mean_batch(workload, settings, seed=0)
    assert mean == pytest.approx(len(workload.dataset) / len(plan))  # every sequence once
    assert min(map(len, plan)) < mean < max(map(len, plan))  # sizes do vary
    measured = measure(workload, settings, CPU, window_s=0.3, warmup_s=0.0)
    assert measured.samples_per_sec == pytest.approx(measured.batches * mean / measured.window_s)
    assert measured.epoch_batches == len(plan)


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_forked_again_each_epoch_start_a_second_one_after_the_window(
    persistent: bool,
) -> None:
    """From the second epoch, such workers copy the step's memory: the trial's peak holds it."""
    workload = dataclasses.replace(fast(), dataset=Vectors(size=100_000))
    settings = LoaderSettings(
        batch=8, num_workers=1, prefetch_factor=2, persistent_workers=persistent
    )
    measured = measure(workload, settings, CPU, window_s=0.2, warmup_s=0.0)
    assert measured.epochs == 0  # the window stayed inside the first epoch
    assert measured.epoch_starts == (0 if persistent else 1)


class _SlowEpochStart(Dataset):
    """Eight fast samples whose first waits 20 ms: each epoch starts with a pause, as a new
    iterator's workers fetching their first batches make one."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 0:
            time.sleep(0.02)
        return torch.zeros(4)


def test_short_epochs_are_measured_whole() -> None:
    """A time window over short epochs would hold one epoch start more or less by chance."""
    workload = dataclasses.replace(fast(), dataset=_SlowEpochStart())
    settings = LoaderSettings(batch=1, num_workers=0, torch_num_threads=1)
    measured = measure(workload, settings, CPU, window_s=0.3, warmup_s=0.0)
    assert measured.epochs >= 2
    assert measured.samples == 8 * measured.epochs  # whole epochs, each with its start
    assert measured.samples_per_sec == pytest.approx(measured.samples / measured.window_s)
    assert measured.samples_per_sec < 8 / 0.02  # each epoch's pause counted once


def test_an_epoch_longer_than_half_the_window_keeps_the_time_window() -> None:
    workload = dataclasses.replace(fast(), dataset=Vectors(size=100_000))
    settings = LoaderSettings(batch=8, num_workers=0, torch_num_threads=1)
    measured = measure(workload, settings, CPU, window_s=0.2, warmup_s=0.0)
    assert measured.epochs == 0
    assert measured.window_s >= 0.2


class _CountingStep:
    """Counts micro-batches and optimizer steps."""

    def __init__(self, device: torch.device) -> None:
        self.micro_batches = self.optimizer_steps = 0

    def __call__(self, batch: object) -> None:
        self.micro_batches += 1

    def optimizer_step(self) -> None:
        self.optimizer_steps += 1


@pytest.mark.parametrize("min_warmup_batches", [2, 3, 4])
def test_the_window_starts_an_accumulation_run(min_warmup_batches: int) -> None:
    """The warm-up ends on an optimizer step, whatever count it reached: ranks whose warm-ups
    differ then all-reduce on the same micro-batches of the window (tuner.trial._ddp)."""
    steps: list[_CountingStep] = []

    def make_step(device: torch.device) -> _CountingStep:
        steps.append(_CountingStep(device))
        return steps[-1]

    workload = dataclasses.replace(fast(), step=None, make_step=make_step)
    settings = LoaderSettings(batch=8, num_workers=0, accumulation_steps=3)
    at_window: list[tuple[int, int]] = []

    def before_window() -> None:
        at_window.append((steps[0].micro_batches, steps[0].optimizer_steps))

    measure(
        workload, settings, CPU, window_s=0.05, warmup_s=0.0,
        min_warmup_batches=min_warmup_batches, before_window=before_window,
    )  # fmt: skip
    ((micro_batches, optimizer_steps),) = at_window
    first_boundary = 3 * -(-min_warmup_batches // 3)  # the first optimizer step at or after
    assert micro_batches == 3 * optimizer_steps == first_boundary
