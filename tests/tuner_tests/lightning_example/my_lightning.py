"""The user's own DataModule and LightningModule that the README's Lightning example imports.

Generated data and one linear layer, so the example trains on a CPU in a second. Loaded by
file path (``--objective .../train_lightning.py:workload`` puts this folder on ``sys.path``).
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Pairs(Dataset):
    """``(x, y)`` with ``y = x.mean()``: module-level, so DataLoader workers can import it."""

    def __len__(self) -> int:
        return 1024

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((16,), (index % 13) / 13)
        return x, x.mean(dim=0, keepdim=True)


class Data(L.LightningDataModule):
    """Trains with batches of 24 in the main process today (no workers)."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 24

    def setup(self, stage: str) -> None:
        self.train_set, self.val_set = Pairs(), Pairs()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> object:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.05)
