"""A workload from a Hugging Face ``transformers.Trainer``, so a Trainer user rewrites nothing.

The dataset and collate function are the ones the Trainer's own training DataLoader loads from
(``Trainer.get_train_dataloader``: unused columns removed, the collator wrapped as the Trainer
wraps it), the step is one real optimizer step as the Trainer takes it (``compute_loss``,
backward through its accelerator, gradient clipping at ``max_grad_norm``, the optimizer from
``create_optimizer``), and ``TrainingArguments``' batch and ``dataloader_*`` fields are the
``pytorch-default`` baseline: what you train with today.

The tuner loads a workload by spec in every trial's child process, so a script exposes a
function of no arguments, ``def workload(): return workload_from_trainer(make_trainer())``, and
``--objective train.py:workload`` builds the Trainer afresh in each child. transformers is never
imported here: the Trainer you pass has already imported it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler

from objectives._from_dataloader import trained_today, widened_range
from objectives._loading import WorkloadError
from objectives._workload import Workload

__all__ = ["workload_from_trainer"]


def workload_from_trainer(
    trainer: Any,
    *,
    name: str = "hf-trainer",
    batch_size_range: tuple[int, int] | None = None,
) -> Workload:
    """The workload of ``trainer``'s training input pipeline and optimizer step.

    Raises :class:`WorkloadError` (one line) for what the tuner cannot measure: no
    ``train_dataset``, an iterable (streaming) dataset, a sampler that builds its own batches.
    """
    args = _training_args(trainer)
    dataset = trainer.train_dataset
    if dataset is None:
        raise WorkloadError(
            "the Trainer has no train_dataset; give Trainer(train_dataset=...) the dataset you "
            "train on"
        )
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise WorkloadError(
            f"the Trainer's train_dataset is an iterable dataset ({type(dataset).__name__}), "
            "which orders and sizes its own stream; the tuner needs a map-style dataset "
            "(datasets.Dataset, not a streaming IterableDataset)"
        )
    loader = trainer.get_train_dataloader()
    batch = int(args.per_device_train_batch_size)
    return Workload(
        name=name,
        dataset=loader.dataset,
        collate_fn=loader.collate_fn,
        make_step=functools.partial(TrainerStep, trainer),
        default_batch_size=batch,
        batch_size_range=batch_size_range or widened_range(batch),
        sampler=_kept_sampler(loader),
        drop_last=bool(args.dataloader_drop_last),
        worker_init_fn=loader.worker_init_fn,
        current=trained_today(
            int(args.dataloader_num_workers),
            args.dataloader_prefetch_factor,
            args.dataloader_pin_memory,
            args.dataloader_persistent_workers,
        ),
        description=f"{name}: {type(trainer.model).__name__} on {type(dataset).__name__}, "
        f"batch {batch}",
    )


class TrainerStep:
    """One micro-batch forward and backward as ``Trainer.training_step`` runs it, and the
    optimizer step the Trainer takes after its accumulated micro-batches."""

    def __init__(self, trainer: Any, device: torch.device) -> None:
        self._trainer = trainer
        self.model = trainer.model.to(device)
        self.model.train()
        # After the move: a new optimizer holds the parameters where they now live.
        self.optimizer = (
            trainer.optimizer if trainer.optimizer is not None else trainer.create_optimizer()
        )
        self._max_grad_norm = trainer.args.max_grad_norm

    def __call__(self, batch: Any) -> None:
        with self._trainer.compute_loss_context_manager():
            loss = self._trainer.compute_loss(self.model, batch)
        self._trainer.accelerator.backward(loss)

    def optimizer_step(self) -> None:
        if self._max_grad_norm and self._max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self._max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _training_args(trainer: Any) -> Any:
    """The trainer's ``TrainingArguments``; anything else is not a Trainer (one line)."""
    needed = ("args", "model", "train_dataset", "get_train_dataloader", "compute_loss")
    if not all(hasattr(trainer, attr) for attr in needed):
        raise WorkloadError(f"expected a transformers.Trainer, got {type(trainer).__name__}")
    if trainer.model is None:
        raise WorkloadError("the Trainer has no model; give Trainer(model=...)")
    return trainer.args


def _kept_sampler(loader: Any) -> Any:
    """The sampler inside the Trainer's batch sampler, or None for its random one (the tuner
    shuffles the same way, with each trial's seed).

    accelerate re-wraps the Trainer's DataLoader (``DataLoaderShard`` with a ``batch_sampler``,
    which may itself be a ``BatchSamplerShard``), so the sampler is read from inside it.
    """
    batch_sampler = loader.batch_sampler
    batch_sampler = getattr(batch_sampler, "batch_sampler", batch_sampler)  # BatchSamplerShard
    if not isinstance(batch_sampler, BatchSampler):
        raise WorkloadError(
            f"the Trainer's DataLoader builds its own batches ({type(batch_sampler).__name__}), "
            "which the tuner cannot size; tune with train_sampling_strategy='random' or "
            "'group_by_length'"
        )
    sampler = batch_sampler.sampler
    return None if isinstance(sampler, RandomSampler) else sampler
