"""The batches a measurement prepares: the loader's own, fetched in parallel only where
samples wait on storage."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch.utils.data import Dataset

from objectives import Workload
from tuner.trial._fetch import fetched_batches


class Samples(Dataset[tuple[int, int]]):
    """Sample ``i`` is ``(i, pid that fetched it)``, after ``wait_s`` off the CPU."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[int, int]:
        time.sleep(self.wait_s)
        return index, os.getpid()


PLAN = [[5, 3, 9], [0, 1], [63, 62, 61, 60]]

# More workers than cores, on purpose (as in a trial child, which filters the same warning).
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def test_samples_that_wait_are_fetched_by_workers_into_the_same_batches() -> None:
    batches = fetched_batches(Workload(name="waits", dataset=Samples(0.05)), PLAN)
    assert [batch[0].tolist() for batch in batches] == PLAN  # collated as the loader collates
    pids = {pid for batch in batches for pid in batch[1].tolist()}
    assert os.getpid() not in pids


def test_samples_that_compute_are_fetched_here() -> None:
    batches = fetched_batches(Workload(name="computes", dataset=Samples(0.0)), PLAN)
    assert [batch[0].tolist() for batch in batches] == PLAN
    assert {pid for batch in batches for pid in batch[1].tolist()} == {os.getpid()}


def test_a_collate_of_the_workloads_own_is_applied_to_each_batch() -> None:
    def count(samples: list[tuple[int, int]]) -> torch.Tensor:
        return torch.tensor([len(samples)])

    workload = Workload(name="counted", dataset=Samples(0.05), collate_fn=count)
    assert [int(batch) for batch in fetched_batches(workload, PLAN)] == [3, 2, 4]
