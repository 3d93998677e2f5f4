"""A user workload as a project would write one, loaded by the tests as ``module:attr``."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from objectives import Workload


class SquaresDataset(Dataset):
    """``(x, x**2)`` pairs: a module-level class, so ``spawn`` workers can unpickle it."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        value = torch.tensor([float(index)])
        return value, value**2


def square_step(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    """Checks the batch arrived on the device; a plain step function owns no optimizer."""
    inputs, targets = batch
    assert inputs.device.type == device.type
    assert torch.equal(inputs**2, targets)


def make_workload() -> Workload:
    return Workload(name="squares", dataset=SquaresDataset(40), step=square_step)


WORKLOAD = make_workload()
