"""PyTorch Lightning, both ways: a DataModule and module in as a workload, the tuned setting out.

**In**, :func:`workload_from_lightning`, without a ``Trainer``: the tuner measures the
DataLoader the DataModule trains with (``train_dataloader()``, taken as
:meth:`Workload.from_dataloader` takes any loader) under the module's own ``training_step``,
forward, backward and optimizer step, so the samples/sec are those of the user's training.
The module is handed over as the workload's model, its ``training_step`` as the forward that
``DistributedDataParallel`` wraps (as Lightning's DDP strategy wraps it), so the ranks of
``--nproc-per-node N`` all-reduce its gradients.

A trial's child process loads the workload by spec, so a user script exposes a function of no
arguments that builds it there::

    # train_lightning.py
    def workload():
        return workload_from_lightning(MyDataModule(), MyModule())

    python -m tuner.study --hardware auto --objective train_lightning.py:workload

No ``Trainer`` is attached while measuring, so ``self.log``/``self.log_dict`` are silenced
during the step (Lightning would warn at every call, and logging is not what is tuned), and a
module that needs the trainer (manual optimization, ``self.trainer`` in its step) is refused or
fails its trials with Lightning's own error.

**Out**, :class:`TunedDataLoaders`, one callback, no training code changed:
``Trainer(callbacks=[TunedDataLoaders(objective="train_lightning.py:workload")])`` looks up the
best setting of ``<objective>@<hardware>`` when ``fit`` sets up, fits it to the live machine as
:func:`tuner.loader` does (fewer usable CPUs: fewer workers), and applies all of it:

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

What this module refuses raises :class:`objectives.WorkloadError` (one line). It imports Lightning
(``pip install 'dataloader-tuner[lightning]'``); importing :mod:`tuner` or :mod:`objectives` does
not.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from objectives import Workload, WorkloadError
from tuner._loader import rank_best_setting, warn_unapplied
from tuner.insight import BestSetting, NoResultError
from tuner.search import LoaderSettings

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import BatchSizeFinder, GradientAccumulationScheduler
except ImportError as error:  # pragma: no cover - the optional extra is not installed
    raise ImportError(
        "tuner.integrations.lightning needs Lightning: pip install 'dataloader-tuner[lightning]'"
    ) from error

__all__ = [
    "LightningStep",
    "TrainingStepModule",
    "TunedDataLoaders",
    "first_optimizer",
    "tuned_dataloader",
    "workload_from_lightning",
]

_log = logging.getLogger("tuner.integrations.lightning")


def workload_from_lightning(
    datamodule: Any,
    module: pl.LightningModule,
    *,
    name: str = "lightning",
    batch_size_range: tuple[int, int] | None = None,
) -> Workload:
    """The workload of ``datamodule.train_dataloader()`` stepped by ``module.training_step``.

    ``prepare_data()`` and ``setup("fit")`` run first, as ``Trainer.fit`` runs them, where the
    DataModule has them; they run in every trial's process, so ``prepare_data`` must be
    idempotent (download only what is missing), as Lightning asks of it anyway. A
    :class:`~objectives.WorkloadError` (one line) where the loader or the module is not one the
    tuner can measure.
    """
    if not isinstance(module, pl.LightningModule):
        raise WorkloadError(f"expected a LightningModule, got {type(module).__name__}")
    if not module.automatic_optimization:
        raise WorkloadError(
            f"{type(module).__name__} uses manual optimization (automatic_optimization=False), "
            "which needs a Trainer; give Workload.from_dataloader(loader, step) a step of your own"
        )
    if first_optimizer(module.configure_optimizers()) is None:  # refused here, not per trial
        raise WorkloadError(_no_optimizer(module))
    loader = _train_loader(datamodule)
    try:
        return Workload.from_dataloader(
            loader,
            make_step=LightningStep.factory(module),
            model=TrainingStepModule(module),
            name=name,
            batch_size_range=batch_size_range,
            description=f"{name}: {type(module).__name__} on {type(datamodule).__name__}'s loader",
        )
    except ValueError as error:  # the loader's own, one line: say it as this module does
        raise WorkloadError(str(error)) from None


def _train_loader(datamodule: Any) -> DataLoader:
    """The DataModule's training DataLoader, set up as ``Trainer.fit`` would."""
    kind = type(datamodule).__name__
    if not callable(getattr(datamodule, "train_dataloader", None)) or _not_overridden(datamodule):
        raise WorkloadError(
            f"{kind} has no train_dataloader(); the tuner measures its training loader"
        )
    for hook, args in (("prepare_data", ()), ("setup", ("fit",))):
        if callable(getattr(datamodule, hook, None)):
            getattr(datamodule, hook)(*args)
    loader = datamodule.train_dataloader()
    if isinstance(loader, Mapping | list | tuple) or type(loader).__name__ == "CombinedLoader":
        raise WorkloadError(
            f"{kind}.train_dataloader() returned a {type(loader).__name__} of loaders; the tuner "
            "measures one torch DataLoader: return one, or tune each with Workload.from_dataloader"
        )
    if not isinstance(loader, DataLoader):
        raise WorkloadError(
            f"{kind}.train_dataloader() returned a {type(loader).__name__}, not a torch DataLoader"
        )
    if isinstance(loader.dataset, IterableDataset):
        raise WorkloadError(
            f"{kind}.train_dataloader() has an IterableDataset ({type(loader.dataset).__name__}), "
            "whose samples repeat per worker unless it shards by get_worker_info(); if it does, "
            "give Workload.from_dataloader(loader, make_step=LightningStep.factory(module))"
        )
    return loader


def _not_overridden(datamodule: Any) -> bool:
    """True for a LightningDataModule that keeps Lightning's ``train_dataloader`` (it raises)."""
    if not isinstance(datamodule, pl.LightningDataModule):
        return False
    return type(datamodule).train_dataloader is pl.LightningDataModule.train_dataloader


def first_optimizer(configured: Any) -> torch.optim.Optimizer | None:
    """The first optimizer of whatever ``configure_optimizers`` returned, in any of Lightning's
    forms: an optimizer, a list or tuple of them, a dict with ``"optimizer"``, a list of such
    dicts, or ``(optimizers, schedulers)``. None where there is none."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured
    if isinstance(configured, Mapping):
        return first_optimizer(configured.get("optimizer"))
    if isinstance(configured, list | tuple) and configured:
        return first_optimizer(configured[0])
    return None


def _no_optimizer(module: pl.LightningModule) -> str:
    return (
        f"{type(module).__name__}.configure_optimizers() returned no optimizer; "
        "the tuner measures the whole step, optimizer included"
    )


class TrainingStepModule(torch.nn.Module):
    """``module.training_step`` as ``forward``: what ``DistributedDataParallel`` calls, so its
    gradient hooks are armed around the training step, as Lightning's DDP strategy arranges."""

    def __init__(self, module: pl.LightningModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any) -> Any:
        return self.module.training_step(*args)


class LightningStep:
    """A :class:`~objectives.TrainStep` running ``module.training_step`` without a Trainer.

    The batch hooks the Trainer calls around a batch's transfer (``on_before_batch_transfer``,
    ``on_after_batch_transfer``) run on the moved batch, so a module that augments there is
    measured with its augmentation. ``forward``, where given, is the
    :class:`TrainingStepModule` of ``module`` on ``device`` (under DDP in a rank of several),
    called in place of ``module.training_step``.
    """

    def __init__(
        self,
        module: pl.LightningModule,
        device: torch.device,
        forward: torch.nn.Module | None = None,
    ) -> None:
        self.module = module.to(device)
        self._forward = forward if forward is not None else module.training_step
        self.module.train()
        optimizer = first_optimizer(self.module.configure_optimizers())
        if optimizer is None:
            raise WorkloadError(_no_optimizer(module))
        self.optimizer = optimizer
        self._with_index = _takes_batch_idx(module)
        self.batch_idx = 0

    @classmethod
    def factory(cls, module: pl.LightningModule) -> Any:
        """``make_step(device)`` for :class:`Workload`, or ``make_step(device, model)`` with
        the module's :class:`TrainingStepModule` handed over: the module moves to the device
        once."""

        def make_step(device: torch.device, model: torch.nn.Module | None = None) -> LightningStep:
            return cls(module, device, model)

        return make_step

    def __call__(self, batch: Any) -> None:
        module = self.module
        with _logging_silenced(module), torch.enable_grad():
            batch = module.on_before_batch_transfer(batch, 0)
            batch = module.on_after_batch_transfer(batch, 0)
            args = (batch, self.batch_idx) if self._with_index else (batch,)
            output = self._forward(*args)
        self.batch_idx += 1
        loss = output.get("loss") if isinstance(output, Mapping) else output
        if loss is None:  # Lightning's "skip this batch"
            return
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"training_step returned {type(output).__name__}; expected a loss tensor, "
                "a dict with 'loss', or None"
            )
        loss.backward()

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _takes_batch_idx(module: pl.LightningModule) -> bool:
    """Lightning passes ``batch_idx`` only to a ``training_step`` that takes a second argument."""
    try:
        parameters = inspect.signature(module.training_step).parameters.values()
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def _no_log(*args: Any, **kwargs: Any) -> None:
    """``self.log`` while measuring: there is no Trainer to log to."""


@contextlib.contextmanager
def _logging_silenced(module: pl.LightningModule) -> Iterator[None]:
    """``log``/``log_dict`` as no-ops for the step, then the module's own again (it may later
    train under a Trainer in the same process)."""
    saved = {name: module.__dict__[name] for name in ("log", "log_dict") if name in module.__dict__}
    module.__dict__["log"] = module.__dict__["log_dict"] = _no_log
    try:
        yield
    finally:
        for name in ("log", "log_dict"):
            if name in saved:
                module.__dict__[name] = saved[name]
            else:
                del module.__dict__[name]


def tuned_dataloader(loader: DataLoader, setting: BestSetting | LoaderSettings) -> DataLoader:
    """``loader`` rebuilt with the tuned DataLoader arguments, everything else kept: dataset,
    collate, sampler (a plain ``shuffle=True`` stays a shuffle), ``drop_last``, worker init,
    generator and timeout. A :class:`~objectives.WorkloadError` (one line) where the setting
    cannot apply."""
    best = setting if isinstance(setting, BestSetting) else None
    settings = setting.settings if isinstance(setting, BestSetting) else setting
    if best is not None and best.batch_param != "batch_size":
        raise WorkloadError(
            f"the tuned {best.batch_param}={best.batch} is a batch sampler's, not a DataLoader "
            "batch_size: build the loader with the workload's batch sampler (tuner.loader)"
        )
    if best is not None:
        warn_unapplied(best, {})  # knobs: a rebuilt loader cannot take them, say so
    try:
        workload = Workload.from_dataloader(loader)
    except ValueError as error:
        raise WorkloadError(
            f"cannot rebuild the DataLoader with the tuned setting: {error}"
        ) from None
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
            best = rank_best_setting(
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
        self.best = best
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

    def _replace_train_loader(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, best: BestSetting
    ) -> None:
        source: Any = trainer.datamodule
        data_source = getattr(trainer.fit_loop, "_data_source", None)
        given = getattr(data_source, "instance", None)
        if source is None and given is not None and given is not pl_module:
            # fit(train_dataloaders=loader): Lightning holds the loader itself.
            if not isinstance(given, DataLoader):
                raise WorkloadError(
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
                raise WorkloadError(
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
