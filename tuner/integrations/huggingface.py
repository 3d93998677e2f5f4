"""Hugging Face ``transformers``, both ways: a ``Trainer`` in as a workload, the setting out.

**In**, :func:`workload_from_trainer`, so a Trainer user rewrites nothing: the dataset and
collate function are the ones the Trainer's own training DataLoader loads from
(``Trainer.get_train_dataloader``: unused columns removed, the collator wrapped as the Trainer
wraps it), the step is one real optimizer step as the Trainer takes it (``compute_loss``,
backward through its accelerator, gradient clipping at ``max_grad_norm``, the optimizer from
``create_optimizer``; the model handed over, so the ranks of ``--nproc-per-node N`` train it
under ``DistributedDataParallel`` with the Trainer's own DDP options), and
``TrainingArguments``' batch and ``dataloader_*`` fields are the
``pytorch-default`` baseline: what you train with today. The tuner loads a workload by spec in
every trial's child process, so a script exposes a function of no arguments,
``def workload(): return workload_from_trainer(make_trainer())``, and ``--objective
train.py:workload`` builds the Trainer afresh in each child.

**Out**, :func:`tuned_training_arguments`, its fields (:func:`training_arguments`) and the
``--format hf`` snippet (:func:`training_arguments_snippet`): ``TrainingArguments`` carries the
batch and every DataLoader knob (``dataloader_*``) but not the main process's intra-op threads,
which compete with the DataLoader workers for the same cores; both set them with
``torch.set_num_threads``.

What this module refuses raises :class:`objectives.WorkloadError` (one line). It never imports
transformers (the Trainer and the ``TrainingArguments`` you pass have imported it), so importing
it needs no extra, and ``python -m tuner.best --format hf`` works without transformers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler

from objectives import Workload, WorkloadError, trained_today, widened_range
from tuner._loader import rank_best_setting
from tuner.insight import BestSetting

__all__ = [
    "TrainerStep",
    "training_arguments",
    "training_arguments_snippet",
    "tuned_training_arguments",
    "workload_from_trainer",
]


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
        model=trainer.model,
        ddp_kwargs=_ddp_kwargs(trainer),
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


def _ddp_kwargs(trainer: Any) -> dict[str, Any]:
    """The ``DistributedDataParallel`` options the Trainer's accelerator passes (from
    ``TrainingArguments.ddp_*``: ``find_unused_parameters`` unless the model checkpoints
    activations, ...), or none where it holds none."""
    handler = getattr(getattr(trainer, "accelerator", None), "ddp_handler", None)
    return dict(handler.to_kwargs()) if handler is not None else {}


class TrainerStep:
    """One micro-batch forward and backward as ``Trainer.training_step`` runs it, and the
    optimizer step the Trainer takes after its accumulated micro-batches. ``model``, where
    given, is the Trainer's model on ``device`` (under DDP in a rank of several): the module
    the loss is computed through."""

    def __init__(self, trainer: Any, device: torch.device, model: Any = None) -> None:
        self._trainer = trainer
        self.model = model if model is not None else trainer.model.to(device)
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


def tuned_training_arguments(
    args: Any,
    hardware: str = "auto",
    *,
    objective: str,
    storage: str | None = None,
    study_name: str | None = None,
    set_threads: bool = True,
    profiles_file: str | None = None,
) -> Any:
    """``args`` (a ``TrainingArguments``) with the tuned batch, accumulation and DataLoader
    fields of ``<objective>@<hardware>``, fitted to the live machine as ``tuner.loader`` fits
    them (fewer usable CPUs: fewer workers; under torchrun, the study of its rank count, else
    the 1-rank optimum clamped to the rank's share, with a warning:
    :func:`tuner._loader.rank_best_setting`), everything else as it was; a new object.

    With ``set_threads`` the tuned intra-op threads are set too (:meth:`BestSetting.apply`,
    logged), since TrainingArguments cannot carry them. Raises ``tuner.NoResultError`` when
    there is no study or no finished trial, :class:`~objectives.WorkloadError` when the study
    tuned a batch sampler's budget (:func:`training_arguments`).
    """
    best = rank_best_setting(
        hardware,
        objective=objective,
        storage=storage,
        study_name=study_name,
        profiles_file=profiles_file,
    )
    tuned = dataclasses.replace(args, **training_arguments(best))
    if set_threads:
        best.apply()
    return tuned


def training_arguments(best: BestSetting) -> dict[str, Any]:
    """The ``TrainingArguments`` fields of ``best``'s setting.

    ``gradient_accumulation_steps`` is ``accumulation_steps``, so a study run with
    ``--effective-batch`` keeps the effective batch. The intra-op threads are not among them
    (TrainingArguments has no such field): :meth:`BestSetting.apply` sets them. Raises
    :class:`~objectives.WorkloadError` where the study tuned a batch sampler's budget.
    """
    if best.batch_param != "batch_size":
        raise WorkloadError(
            f"study {best.study_name} tuned {best.batch_param}, a batch sampler's budget; "
            "TrainingArguments take a per_device_train_batch_size"
        )
    workers = best.settings.num_workers
    return {
        "per_device_train_batch_size": best.batch,
        "gradient_accumulation_steps": best.accumulation_steps,
        "dataloader_num_workers": workers,
        "dataloader_prefetch_factor": best.settings.prefetch_factor if workers else None,
        "dataloader_pin_memory": best.settings.pin_memory,
        "dataloader_persistent_workers": best.settings.persistent_workers if workers else False,
    }


def training_arguments_snippet(best: BestSetting) -> str:
    """The ``--format hf`` code: threads, then ``TrainingArguments`` with the tuned fields."""
    lines = [
        f"# {best.summary()}",
        "import torch",
        "from transformers import TrainingArguments",
        "",
        "# TrainingArguments has no thread setting, yet the training step's intra-op threads",
        "# share the cores with the DataLoader workers: set them as tuned, before training.",
        f"torch.set_num_threads({best.torch_num_threads})",
        "args = TrainingArguments(",
        '    output_dir="trainer_output",  # yours, with the rest of your arguments',
        *(f"    {key}={value!r}," for key, value in training_arguments(best).items()),
        ")",
    ]
    if best.knobs:
        lines.append(f"# the workload's knobs, applied by its configure(): {best.knobs!r}")
    return "\n".join(lines)
