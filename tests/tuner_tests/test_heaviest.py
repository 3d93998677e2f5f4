"""The epoch's heaviest batch: which one it is, and that a trial and the ceiling step it."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from objectives import Workload, text_workload
from tests.tuner_tests.workloads import fast
from tuner.search._settings import LoaderSettings
from tuner.trial._ceiling import measure_step_rates
from tuner.trial._heaviest import heaviest_batch, heaviest_indices
from tuner.trial._measure import measure

CPU = torch.device("cpu")
SMALL_TEXT = {"sequences": 300, "vocab_size": 64, "max_length": 96}


def test_a_batch_sampler_gives_its_batch_that_holds_the_longest_sample() -> None:
    workload = text_workload(**SMALL_TEXT)
    lengths = workload.dataset.lengths  # type: ignore[attr-defined]
    settings = LoaderSettings(batch=1024, num_workers=0)
    indices = heaviest_indices(workload, settings, seed=0)
    plan = [list(b) for b in workload.batch_sampler(workload.dataset, 1024, 0)]  # type: ignore[misc]
    assert indices in plan
    assert max(lengths[i] for i in indices) == max(lengths)
    tokens, _ = heaviest_batch(workload, settings, seed=0)
    assert tokens.shape == (len(indices), max(lengths))  # padded as the DataLoader pads it


def test_plain_batches_take_the_longest_samples() -> None:
    text = text_workload(**SMALL_TEXT)
    lengths = text.dataset.lengths  # type: ignore[attr-defined]
    plain = Workload(name="plain", dataset=text.dataset, collate_fn=text.collate_fn)
    indices = heaviest_indices(plain, LoaderSettings(batch=8, num_workers=0), seed=0)
    assert indices is not None and len(indices) == 8
    assert sorted((lengths[i] for i in indices), reverse=True) == sorted(lengths, reverse=True)[:8]


def test_a_dataset_without_lengths_has_none() -> None:
    assert heaviest_batch(fast(), LoaderSettings(batch=8, num_workers=0), seed=0) is None


class LongestSeen:
    """A step that remembers the longest padded batch it was given, in order."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def __call__(self, batch: Any) -> None:
        self.lengths.append(int(batch[0].shape[1]))

    def optimizer_step(self) -> None:
        return None


def recording(step: LongestSeen) -> Workload:
    """The text workload stepped by ``step``, its own model not handed over."""
    return dataclasses.replace(
        text_workload(**SMALL_TEXT), model=None, make_step=lambda device: step
    )


def test_a_trial_steps_the_heaviest_batch_right_after_its_first() -> None:
    step = LongestSeen()
    workload = recording(step)
    longest = max(workload.dataset.lengths)  # type: ignore[attr-defined]
    settings = LoaderSettings(batch=1024, num_workers=1, prefetch_factor=2)
    measured = measure(workload, settings, CPU, window_s=0.1, warmup_s=0.0)
    assert step.lengths[1] == longest
    assert len(step.lengths) >= measured.batches + 2  # untimed: the first batch and the heaviest
    assert measured.own_peak_host_memory_bytes is not None


def test_the_ceiling_steps_the_heaviest_batch_before_it_times() -> None:
    step = LongestSeen()
    workload = recording(step)
    longest = max(workload.dataset.lengths)  # type: ignore[attr-defined]
    settings = LoaderSettings(batch=1024, num_workers=0)
    measure_step_rates(workload, settings, CPU, window_s=0.05, warmup_s=0.0)
    assert step.lengths[0] == longest
