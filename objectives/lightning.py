"""A workload from a PyTorch Lightning DataModule and LightningModule, without a ``Trainer``.

The tuner measures the DataLoader the DataModule trains with (``train_dataloader()``, taken as
:meth:`Workload.from_dataloader` takes any loader) under the module's own ``training_step``,
forward, backward and optimizer step, so the samples/sec are those of the user's training.

A trial's child process loads the workload by spec, so a user script exposes a function of no
arguments that builds it there::

    # train_lightning.py
    def workload():
        return workload_from_lightning(MyDataModule(), MyModule())

    python -m tuner.study --hardware auto --objective train_lightning.py:workload

(``--objective`` also takes a function returning the ``(datamodule, module)`` pair.)

No ``Trainer`` is attached while measuring, so ``self.log``/``self.log_dict`` are silenced
during the step (Lightning would warn at every call, and logging is not what is tuned), and a
module that needs the trainer (manual optimization, ``self.trainer`` in its step) is refused or
fails its trials with Lightning's own error. Importing this module imports Lightning; importing
:mod:`objectives` does not.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from objectives._workload import Workload

try:
    import lightning.pytorch as pl
except ImportError as error:  # pragma: no cover - the optional extra is not installed
    raise ImportError(
        "objectives.lightning needs Lightning: pip install 'dataloader-tuner[lightning]'"
    ) from error

__all__ = ["LightningStep", "first_optimizer", "workload_from_lightning"]


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
    :class:`ValueError` (one line) where the loader or the module is not one the tuner can
    measure.
    """
    if not isinstance(module, pl.LightningModule):
        raise ValueError(f"expected a LightningModule, got {type(module).__name__}")
    if not module.automatic_optimization:
        raise ValueError(
            f"{type(module).__name__} uses manual optimization (automatic_optimization=False), "
            "which needs a Trainer; give Workload.from_dataloader(loader, step) a step of your own"
        )
    if first_optimizer(module.configure_optimizers()) is None:  # refused here, not per trial
        raise ValueError(_no_optimizer(module))
    loader = _train_loader(datamodule)
    return Workload.from_dataloader(
        loader,
        make_step=LightningStep.factory(module),
        name=name,
        batch_size_range=batch_size_range,
        description=f"{name}: {type(module).__name__} on {type(datamodule).__name__}'s loader",
    )


def _train_loader(datamodule: Any) -> DataLoader:
    """The DataModule's training DataLoader, set up as ``Trainer.fit`` would."""
    kind = type(datamodule).__name__
    if not callable(getattr(datamodule, "train_dataloader", None)) or _not_overridden(datamodule):
        raise ValueError(
            f"{kind} has no train_dataloader(); the tuner measures its training loader"
        )
    for hook, args in (("prepare_data", ()), ("setup", ("fit",))):
        if callable(getattr(datamodule, hook, None)):
            getattr(datamodule, hook)(*args)
    loader = datamodule.train_dataloader()
    if isinstance(loader, Mapping | list | tuple) or type(loader).__name__ == "CombinedLoader":
        raise ValueError(
            f"{kind}.train_dataloader() returned a {type(loader).__name__} of loaders; the tuner "
            "measures one torch DataLoader: return one, or tune each with Workload.from_dataloader"
        )
    if not isinstance(loader, DataLoader):
        raise ValueError(
            f"{kind}.train_dataloader() returned a {type(loader).__name__}, not a torch DataLoader"
        )
    if isinstance(loader.dataset, IterableDataset):
        raise ValueError(
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


class LightningStep:
    """A :class:`~objectives.TrainStep` running ``module.training_step`` without a Trainer.

    The batch hooks the Trainer calls around a batch's transfer (``on_before_batch_transfer``,
    ``on_after_batch_transfer``) run on the moved batch, so a module that augments there is
    measured with its augmentation.
    """

    def __init__(self, module: pl.LightningModule, device: torch.device) -> None:
        self.module = module.to(device)
        self.module.train()
        optimizer = first_optimizer(self.module.configure_optimizers())
        if optimizer is None:
            raise ValueError(_no_optimizer(module))
        self.optimizer = optimizer
        self._with_index = _takes_batch_idx(module)
        self.batch_idx = 0

    @classmethod
    def factory(cls, module: pl.LightningModule) -> Any:
        """``make_step(device)`` for :class:`Workload`: the module moves to the device once."""

        def make_step(device: torch.device) -> LightningStep:
            return cls(module, device)

        return make_step

    def __call__(self, batch: Any) -> None:
        module = self.module
        with _logging_silenced(module), torch.enable_grad():
            batch = module.on_before_batch_transfer(batch, 0)
            batch = module.on_after_batch_transfer(batch, 0)
            args = (batch, self.batch_idx) if self._with_index else (batch,)
            output = module.training_step(*args)
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
