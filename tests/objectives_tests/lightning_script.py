"""A user's Lightning script: a DataModule, a LightningModule, and the function the tuner loads.

Loaded by the tests as ``path/to/lightning_script.py:attr``, as ``--objective`` takes it: in
the test process and in each trial's child process. The data is generated, the model is one
linear layer, so a trial runs on a CPU in well under a second.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import CombinedLoader
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from objectives import Workload
from tuner.integrations.lightning import workload_from_lightning


class Line(Dataset):
    """``(x, y)`` with ``y = 2 * x.sum() - 1``: a module-level class, picklable for workers."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.linspace(0, 1, 8) * (index % 7)
        return x, 2 * x.sum(dim=0, keepdim=True) - 1


class Stream(IterableDataset):
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(Line()[i] for i in range(64))


class LineData(pl.LightningDataModule):
    """Records its hooks, so a test sees the tuner ran them as ``Trainer.fit`` does."""

    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.prepared = False
        self.stage: str | None = None

    def prepare_data(self) -> None:
        self.prepared = True

    def setup(self, stage: str) -> None:
        self.stage = stage
        self.dataset = Line()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)


class Regressor(pl.LightningModule):
    """Logs in its step, as Lightning modules do: the tuner measures it without a Trainer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> object:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        self.log_dict({"batch_idx": float(batch_idx)})
        return loss

    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def workload() -> Workload:
    """What ``--objective lightning_script.py:workload`` runs in each trial's child."""
    return workload_from_lightning(LineData(), Regressor())


def pair() -> tuple[LineData, Regressor]:
    """A bare ``(datamodule, module)``: refused, the workload is ``workload_from_lightning``'s."""
    return LineData(), Regressor()


class DictLoss(Regressor):
    """Returns ``{"loss": ...}`` and takes no ``batch_idx``, both of which Lightning allows."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> object:  # type: ignore[override]
        return {"loss": super().training_step(batch, 0)}


class Skips(Regressor):
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> object:
        return None


class WithScheduler(Regressor):
    """``(optimizers, schedulers)``: the tuner steps the first optimizer."""

    def configure_optimizers(self) -> object:
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]


class NoOptimizer(Regressor):
    def configure_optimizers(self) -> object:
        return None


class Manual(Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class DictOfLoaders(LineData):
    def train_dataloader(self) -> object:  # type: ignore[override]
        return {"a": super().train_dataloader(), "b": super().train_dataloader()}


class ListOfLoaders(LineData):
    def train_dataloader(self) -> object:  # type: ignore[override]
        return [super().train_dataloader()]


class Combined(LineData):
    def train_dataloader(self) -> object:  # type: ignore[override]
        with warnings.catch_warnings():  # Lightning 2.6's own FutureWarning on torch's pytree
            warnings.simplefilter("ignore", FutureWarning)
            return CombinedLoader({"a": super().train_dataloader()}, mode="max_size_cycle")


class Streaming(LineData):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(Stream(), batch_size=8)


class NoTrainLoader(pl.LightningDataModule):
    """A DataModule with only a validation loader."""

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Line(), batch_size=8)


def combined_pair() -> Workload:
    return workload_from_lightning(Combined(), Regressor())


def no_optimizer_pair() -> Workload:
    return workload_from_lightning(LineData(), NoOptimizer())


class NeedsTrainer(Regressor):
    """Reads the Trainer in its step: measured without one, its trials fail with why."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> object:
        return super().training_step(batch, batch_idx) * (self.trainer.global_step + 1)
