"""A rank's model under ``DistributedDataParallel``, where the workload hands one over.

Contract, in each rank of a multi-rank trial (:mod:`tuner.trial._ranks`), after the process
group is up:

* a workload with a ``model`` (:attr:`objectives.Workload.model`) trains it under DDP: the
  model moves to the rank's device (:meth:`~objectives.Workload.train_step`), is wrapped there
  (``device_ids`` on CUDA, none on the CPU, the workload's ``ddp_kwargs``), and its
  ``make_step(device, model)`` gets the wrapper, so every synchronised backward all-reduces
  the gradients and the slowest rank paces the others, as in training;
* micro-batches that do not end an accumulation run under ``no_sync()``, as Lightning and
  Hugging Face accelerate run them, so ``--effective-batch`` all-reduces once per optimizer step;
* each rank ends its warm-up and its window on its own clock, so the ranks' step counts can
  differ by a step or two: the steps run under DDP's ``Join``, where a rank that stops first
  shadows the others' all-reduces instead of leaving them waiting. While two ranks both step,
  their i-th micro-batches meet in the same collectives, so both must all-reduce on the same
  ones: every phase starts an accumulation run in every rank (the warm-up ends on an optimizer
  step, :meth:`tuner.trial._measure._TrainingLoop.warm_up`), else one rank's gradient
  all-reduce meets the other's next forward and gloo aborts on the size mismatch;
* a workload without a model steps as it is: no collective, the ranks independent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from objectives import TrainStep, Workload

__all__ = ["RankModel"]


class _SyncedStep:
    """``step`` with the all-reduce only on the micro-batch an optimizer step follows."""

    def __init__(
        self, step: TrainStep, module: DistributedDataParallel, accumulation_steps: int
    ) -> None:
        self._step = step
        self._module = module
        self._accumulation_steps = accumulation_steps
        self._micro_batches = 0

    def __call__(self, batch: Any) -> None:
        # Counted as the measuring loop counts: an optimizer step follows every k-th call.
        self._micro_batches += 1
        if self._micro_batches % self._accumulation_steps == 0:
            self._step(batch)
            return
        with self._module.no_sync():
            self._step(batch)

    def optimizer_step(self) -> None:
        self._step.optimizer_step()


class RankModel:
    """One rank's view of the workload's model: the DDP wrapper once the step is made, and the
    context the rank's steps run in.

    Args:
        accumulation_steps: micro-batches per optimizer step, as the trial's setting has them.
    """

    def __init__(self, accumulation_steps: int = 1) -> None:
        self._accumulation_steps = accumulation_steps
        self.module: DistributedDataParallel | None = None
        """The model under DDP, once :meth:`~objectives.Workload.train_step` has made the step;
        None before, and for a workload without a model."""

    def wrap(self, workload: Workload) -> Workload:
        """``workload`` whose step trains its model under DDP; as it is without a model."""
        if workload.model is None or workload.make_step is None:
            return workload
        make_step = functools.partial(self._make_step, workload.make_step, workload.ddp_kwargs)
        return dataclasses.replace(workload, make_step=make_step)

    def _make_step(
        self,
        make_step: Callable[..., TrainStep],
        ddp_kwargs: dict[str, Any],
        device: torch.device,
        model: torch.nn.Module,
    ) -> TrainStep:
        device_ids = [device.index] if device.type == "cuda" else None
        self.module = DistributedDataParallel(model, device_ids=device_ids, **ddp_kwargs)
        return _SyncedStep(make_step(device, self.module), self.module, self._accumulation_steps)

    def stepping(self) -> contextlib.AbstractContextManager[Any]:
        """Where a phase of this rank's steps runs: DDP's ``Join`` once the model is wrapped
        (on leaving, the rank shadows the others' all-reduces until every rank has left), else
        nothing."""
        if self.module is None:
            return contextlib.nullcontext()
        from torch.distributed.algorithms import Join

        return Join([self.module])
