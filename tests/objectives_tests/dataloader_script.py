"""A user's training script as people write one: a DataLoader, a model, a step. No Workload.

Loaded by the tests as ``path/to/dataloader_script.py:attr``, as ``--objective`` takes it. Each
worker's init leaves a marker file in ``$MARKER_DIR`` (when set), so a test can see the user's
own ``worker_init_fn`` ran in the trial's workers.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler


class Points(Dataset):
    """``(x, y)`` with ``y = 3x + 1``: a module-level class, picklable for spawn workers."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((4,), float(index) / 256)
        return x, 3 * x[:1] + 1


def pairs_collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    return torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch])


def mark_worker(worker_id: int) -> None:
    directory = os.environ.get("MARKER_DIR")
    if directory:
        Path(directory, f"worker-{os.getpid()}-{worker_id}").touch()


MODEL = nn.Linear(4, 1)
OPTIMIZER = torch.optim.SGD(MODEL.parameters(), lr=0.01)


def train_step(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    x, y = batch
    model = MODEL.to(device)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    OPTIMIZER.step()
    OPTIMIZER.zero_grad()


def make_loader() -> DataLoader:
    return DataLoader(
        Points(),
        batch_size=24,
        shuffle=True,
        num_workers=2,
        prefetch_factor=3,
        persistent_workers=True,
        collate_fn=pairs_collate,
        drop_last=True,
        worker_init_fn=mark_worker,
    )


def training() -> tuple[DataLoader, object]:
    """What ``--objective dataloader_script.py:training`` runs: the loader and its step."""
    return make_loader(), train_step


LOADER = DataLoader(Points(), batch_size=16)


def own_batch_sampler() -> DataLoader:
    sampler = BatchSampler(SequentialSampler(range(256)), batch_size=8, drop_last=False)
    return DataLoader(Points(), batch_sampler=_Packed(sampler))


class _Packed:
    """A batch sampler of the user's own: the tuner cannot size its batches."""

    def __init__(self, inner: BatchSampler) -> None:
        self.inner = inner

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


def not_a_loader() -> int:
    return 3
