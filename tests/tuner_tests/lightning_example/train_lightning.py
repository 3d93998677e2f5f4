# train_lightning.py
import lightning as L
from my_lightning import Data, Model  # your LightningDataModule and LightningModule

from tuner.integrations.lightning import TunedDataLoaders, workload_from_lightning


def workload():  # what each trial's process runs: --objective train_lightning.py:workload
    return workload_from_lightning(Data(), Model())


def train(**trainer_options) -> L.Trainer:
    tuned = TunedDataLoaders(hardware="auto", objective="train_lightning.py:workload")
    trainer = L.Trainer(callbacks=[tuned], **trainer_options)
    trainer.fit(Model(), datamodule=Data())
    return trainer
