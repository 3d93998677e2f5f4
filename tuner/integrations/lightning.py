"""A study's best setting in a Lightning ``Trainer`` run: one callback, no training code changed.

``Trainer(callbacks=[TunedDataLoaders(objective="train_lightning.py:workload")])`` looks up
the best setting of ``<objective>@<hardware>`` when ``fit`` sets up, fits it to the live machine
as :func:`tuner.loader` does (fewer usable CPUs: fewer workers), and applies all of it:

* the training DataLoader: the DataModule's (or LightningModule's) ``train_dataloader`` is
  wrapped for the run, so each loader it returns, at the start and at every
  ``reload_dataloaders_every_n_epochs``, is rebuilt by :func:`tuned_dataloader` with the
  tuned ``batch_size``, ``num_workers``, ``prefetch_factor``, ``pin_memory`` and
  ``persistent_workers``, its dataset, collate, sampler, ``drop_last`` and worker init kept.
  Lightning calls the hook after the callbacks' ``setup``, and records the rebuilt loader's
  arguments as it records the user's (it re-creates the loader for a distributed sampler).
  A loader given to ``fit(train_dataloaders=...)`` is replaced for the run the same way.
  Validation and test loaders are left alone: the study measured training;
* the main process's intra-op threads, ``torch.set_num_threads`` (``set_threads=False``
  keeps yours);
* ``Trainer.accumulate_grad_batches`` set to the setting's ``accumulation_steps`` when the
  study kept an effective batch (``--effective-batch``) with smaller micro-batches.

Without a study (or a finished trial) the run trains with the user's own loader, with a warning.

Lightning's ``BatchSizeFinder`` callback and ``Tuner.scale_batch_size`` answer another
question: the largest batch that fits in memory. This tuner looks for the loader setting with
the most samples/sec, batch size among the rest, under a memory guard. Use one or the other for
the batch size; to keep theirs, run the study with ``--fix batch_size=N`` (N what they found)
so only the loader around it is tuned. With both callbacks in one run, this one's batch size
is what trains (a warning says so).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BatchSizeFinder, GradientAccumulationScheduler
from torch.utils.data import DataLoader

from objectives import Workload
from tuner._loader import _unapplied, fit_to_machine, live_profile
from tuner.insight import BestSetting, NoResultError, best_setting
from tuner.search import LoaderSettings

__all__ = ["TunedDataLoaders", "tuned_dataloader"]

_log = logging.getLogger("tuner.integrations.lightning")


def tuned_dataloader(loader: DataLoader, setting: BestSetting | LoaderSettings) -> DataLoader:
    """``loader`` rebuilt with the tuned DataLoader arguments, everything else kept: dataset,
    collate, sampler (a plain ``shuffle=True`` stays a shuffle), ``drop_last``, worker init,
    generator and timeout. A :class:`ValueError` (one line) where the setting cannot apply."""
    best = setting if isinstance(setting, BestSetting) else None
    settings = setting.settings if isinstance(setting, BestSetting) else setting
    if best is not None and best.batch_param != "batch_size":
        raise ValueError(
            f"the tuned {best.batch_param}={best.batch} is a batch sampler's, not a DataLoader "
            "batch_size: build the loader with the workload's batch sampler (tuner.loader)"
        )
    if best is not None:
        _unapplied(best, {})  # knobs: a rebuilt loader cannot take them, say so
    try:
        workload = Workload.from_dataloader(loader)
    except ValueError as error:
        raise ValueError(f"cannot rebuild the DataLoader with the tuned setting: {error}") from None
    kwargs = settings.build_dataloader_kwargs(workload, seed=0)
    kept = {
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "timeout": loader.timeout,
    }
    if settings.num_workers > 0 and "multiprocessing_context" not in kwargs:
        kept["multiprocessing_context"] = loader.multiprocessing_context
    return DataLoader(workload.dataset, **kwargs, **kept)


class TunedDataLoaders(pl.Callback):
    """Trains with the best setting stored for ``<objective>@<hardware>`` (module docstring).

    ``objective`` is the ``--objective`` the study ran (``train_lightning.py:workload``; the
    study name keeps only the file's name); ``storage`` defaults to ``TUNER_STORAGE`` or the
    SQLite file beside the user, ``study_name`` names another study, as ``--study-name`` does.
    ``best`` is the setting applied, fitted to this machine (None before ``setup`` or without
    a study).
    """

    def __init__(
        self,
        hardware: str = "auto",
        *,
        objective: str,
        storage: str | None = None,
        study_name: str | None = None,
        set_threads: bool = True,
        profiles_file: str | None = None,
    ) -> None:
        self.hardware = hardware
        self.objective = objective
        self.storage = storage
        self.study_name = study_name
        self.set_threads = set_threads
        self.profiles_file = profiles_file
        self.best: BestSetting | None = None
        self._undo: list[Callable[[], None]] = []

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        try:
            best = best_setting(
                self.hardware,
                objective=self.objective,
                storage=self.storage,
                study_name=self.study_name,
                profiles_file=self.profiles_file,
            )
        except NoResultError as error:
            warnings.warn(
                f"TunedDataLoaders: {error}; training with your own DataLoader", stacklevel=2
            )
            return
        self.best = best = self._fitted(best)
        if any(isinstance(callback, BatchSizeFinder) for callback in trainer.callbacks):
            warnings.warn(
                f"TunedDataLoaders: BatchSizeFinder's batch size is replaced by the tuned "
                f"batch_size={best.batch}; to keep theirs, tune with --fix batch_size=N",
                stacklevel=2,
            )
        self._replace_train_loader(trainer, pl_module, best)
        self._set_accumulation(trainer, pl_module, best.accumulation_steps)
        if self.set_threads:
            best.apply(_log)
        _log.info("TunedDataLoaders: %s; %s", best.summary(), best.dataloader_kwargs)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The DataModule, module and Trainer as they were: they may be fitted again."""
        if stage == "fit":
            while self._undo:
                self._undo.pop()()

    def _fitted(self, best: BestSetting) -> BestSetting:
        """The stored optimum clamped to the live machine, as :func:`tuner.loader` clamps it."""
        profile = live_profile(self.hardware, self.profiles_file)
        return dataclasses.replace(best, settings=fit_to_machine(best.settings, profile))

    def _replace_train_loader(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, best: BestSetting
    ) -> None:
        source: Any = trainer.datamodule
        data_source = getattr(trainer.fit_loop, "_data_source", None)
        given = getattr(data_source, "instance", None)
        if source is None and given is not None and given is not pl_module:
            # fit(train_dataloaders=loader): Lightning holds the loader itself.
            if not isinstance(given, DataLoader):
                raise ValueError(
                    f"TunedDataLoaders tunes one torch DataLoader; fit() was given a "
                    f"{type(given).__name__}"
                )
            data_source.instance = tuned_dataloader(given, best)
            self._undo.append(lambda: setattr(data_source, "instance", given))
            return
        source = source if source is not None else pl_module
        original = source.train_dataloader
        had_own = "train_dataloader" in vars(source)

        def train_dataloader() -> DataLoader:
            loader = original()
            if not isinstance(loader, DataLoader):
                raise ValueError(
                    f"TunedDataLoaders tunes one torch DataLoader; {type(source).__name__}."
                    f"train_dataloader() returned a {type(loader).__name__}"
                )
            return tuned_dataloader(loader, best)

        vars(source)["train_dataloader"] = train_dataloader

        def undo() -> None:
            if had_own:
                vars(source)["train_dataloader"] = original
            else:
                vars(source).pop("train_dataloader", None)

        self._undo.append(undo)

    def _set_accumulation(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, steps: int
    ) -> None:
        if steps <= 1:
            return
        if not pl_module.automatic_optimization:
            warnings.warn(
                f"TunedDataLoaders: the setting accumulates {steps} micro-batches, which manual "
                "optimization does itself; accumulate_grad_batches left alone",
                stacklevel=3,
            )
            return
        if any(isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks):
            warnings.warn(
                f"TunedDataLoaders: GradientAccumulationScheduler sets the accumulation; the "
                f"tuned accumulation_steps={steps} is not applied",
                stacklevel=3,
            )
            return
        before = trainer.accumulate_grad_batches
        if before not in (1, steps):
            _log.warning("accumulate_grad_batches %d -> %d, as tuned", before, steps)
        trainer.accumulate_grad_batches = steps
        self._undo.append(lambda: setattr(trainer, "accumulate_grad_batches", before))
