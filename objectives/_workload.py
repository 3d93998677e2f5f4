"""The Workload contract: what the tuner needs to know to measure a training input pipeline.

A workload is user code: the tuner imports it and runs it in every trial's child process and in
that child's DataLoader workers. Everything a workload holds must therefore survive pickling
(DataLoader workers under ``spawn``) and forking (workers under ``fork``): keep datasets and
collate functions at module level, not in closures or lambdas.

Lifetimes, per trial child process:

* ``Workload.configure(knobs)`` is called once with the values the tuner sampled for the
  workload's own knobs and returns the workload to measure (the same object when it has none).
* ``Workload.make_step(device)`` is called once, after the DataLoader exists, to put the model on
  the device; the returned :class:`TrainStep` is called once per micro-batch. A workload that
  hands its model over (``Workload.model``) gets ``make_step(device, model)`` instead: the model
  already on ``device``, and in each rank of ``--nproc-per-node N`` under
  ``DistributedDataParallel``, so the step's backward all-reduces the gradients as training
  does. The step calls that module, never one it holds itself.
* ``TrainStep.optimizer_step()`` is called every ``accumulation_steps`` micro-batches, so
  ``--effective-batch`` keeps the training recipe whatever batch size is tuned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = ["TrainStep", "Workload", "move_to_device"]


class TrainStep(Protocol):
    """One training step on the device, split so the tuner can accumulate gradients."""

    def __call__(self, batch: Any) -> None:
        """Forward and backward one micro-batch that is already on the device."""

    def optimizer_step(self) -> None:
        """Apply and zero the accumulated gradients."""


BatchSamplerFactory = Callable[[Dataset, int, int], Sampler]
"""``factory(dataset, batch_value, seed)``: a batch sampler whose batches are sized by
``batch_value`` (for a token-bucket sampler, the token budget per batch)."""


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move tensors nested in lists, tuples and dicts to ``device``, as a training loop does."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {key: move_to_device(value, device, non_blocking) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(move_to_device(value, device, non_blocking) for value in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(move_to_device(value, device, non_blocking) for value in batch)
    return batch


class _FunctionStep:
    """Adapts a plain ``step(batch, device)`` function to :class:`TrainStep`."""

    def __init__(self, step: Callable[[Any, torch.device], Any], device: torch.device) -> None:
        self._step = step
        self._device = device

    def __call__(self, batch: Any) -> None:
        self._step(batch, self._device)

    def optimizer_step(self) -> None:
        """A plain step function owns its optimizer; nothing to apply here."""


class _MoveOnlyStep:
    """No step given: the batch has already been moved to the device, which is all we measure."""

    def __call__(self, batch: Any) -> None:
        return None

    def optimizer_step(self) -> None:
        return None


@dataclasses.dataclass
class Workload:
    """A dataset and the training step that consumes it.

    Attributes:
        name: short name; the study is called ``<objective>@<hardware>``.
        dataset: a map-style ``torch.utils.data.Dataset``.
        collate_fn: passed to the DataLoader as is (``None``: PyTorch's default collate).
        step: ``step(batch, device)`` consumes one batch that is already on ``device``. Absent
            (and no ``make_step``): the batch is only moved to the device.
        make_step: ``make_step(device) -> TrainStep``, for workloads that let the tuner step the
            optimizer (gradient accumulation); ``make_step(device, model)`` where ``model`` is
            set. Takes precedence over ``step``.
        model: the ``nn.Module`` the step trains, handed over so that the ranks of
            ``--nproc-per-node N`` train it under ``DistributedDataParallel`` (a rank moves it
            to its device, then wraps it: ``device_ids`` on CUDA, none on the CPU), and their
            gradient all-reduce paces them as in training. ``make_step(device, model)`` gets it
            on ``device`` (the module itself in one rank, its DDP wrapper in several) and must
            call what it gets. None: the step is the workload's own, and ranks do not
            all-reduce.
        ddp_kwargs: keyword arguments for ``DistributedDataParallel`` as your training passes
            them (``find_unused_parameters=True`` for a model some of whose parameters a step
            leaves unused); only with ``model``.
        default_batch_size: what the user trains with today; the ``pytorch-default`` baseline.
        batch_size_range: inclusive bounds of the batch-size search (powers of two inside).
        batch_sampler: a :data:`BatchSamplerFactory`; when set, the tuned batch parameter is
            ``batch_param`` and the DataLoader gets ``batch_sampler=`` instead of ``batch_size``.
        batch_param: the name of the tuned batch parameter (``batch_size``, ``max_tokens``).
        knobs: the workload's own categorical knobs, ``name -> choices``; the first choice is
            the default used by the baselines.
        configure: ``configure(**knob_values) -> Workload``; required when ``knobs`` is set.
        description: one line for the study's user attrs and the dashboard note.
        sampler: the sampler every trial's DataLoader draws indices from (``None``: shuffled,
            as training does; an iterable dataset orders its own samples).
        drop_last: passed to the DataLoader as is.
        worker_init_fn: the user's own worker init, run in each worker after the tuner's.
        current: the DataLoader settings trained with today (``num_workers``,
            ``prefetch_factor``, ``pin_memory``, ``persistent_workers``); the ``pytorch-default``
            baseline runs them instead of PyTorch's defaults. Set by :meth:`from_dataloader`.
    """

    name: str
    dataset: Dataset
    collate_fn: Callable[[list[Any]], Any] | None = None
    step: Callable[[Any, torch.device], Any] | None = None
    make_step: Callable[..., TrainStep] | None = None
    default_batch_size: int = 32
    batch_size_range: tuple[int, int] = (8, 512)
    batch_sampler: BatchSamplerFactory | None = None
    batch_param: str = "batch_size"
    knobs: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
    configure: Callable[..., Workload] | None = None
    description: str = ""
    sampler: Sampler | None = None
    drop_last: bool = False
    worker_init_fn: Callable[[int], None] | None = None
    current: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    model: torch.nn.Module | None = None
    ddp_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dataloader(
        cls,
        loader: DataLoader,
        step: Callable[[Any, torch.device], Any] | None = None,
        *,
        make_step: Callable[..., TrainStep] | None = None,
        model: torch.nn.Module | None = None,
        name: str = "dataloader",
        batch_size_range: tuple[int, int] | None = None,
        description: str = "",
    ) -> Workload:
        """The workload of a DataLoader trained with today: its dataset, collate function,
        sampler, ``drop_last`` and worker init as they are, its batch size as the default (the
        search's range widened to take it in) and its worker settings as the
        ``pytorch-default`` baseline; ``model`` and ``make_step(device, model)`` hand the model
        over (:attr:`model`). A :class:`ValueError` (one line) where the tuner cannot size the
        loader's batches (:func:`objectives._from_dataloader.dataloader_fields`).
        """
        from objectives._from_dataloader import dataloader_fields, widened_range

        fields = dataloader_fields(loader)
        return cls(
            name=name,
            step=step,
            make_step=make_step,
            model=model,
            batch_size_range=batch_size_range or widened_range(fields["default_batch_size"]),
            description=description
            or f"{name}: {type(loader.dataset).__name__}, batch {fields['default_batch_size']}",
            **fields,
        )

    def __post_init__(self) -> None:
        low, high = self.batch_size_range
        if not 1 <= low <= high:
            raise ValueError(f"batch_size_range must satisfy 1 <= low <= high, got {low}, {high}")
        if self.knobs and self.configure is None:
            raise ValueError(f"workload {self.name!r} has knobs but no configure function")
        if self.batch_sampler is None and self.batch_param != "batch_size":
            raise ValueError("batch_param other than 'batch_size' needs a batch_sampler")
        for knob, choices in self.knobs.items():
            if not choices:
                raise ValueError(f"knob {knob!r} of workload {self.name!r} has no choices")
        self._check_model()

    def _check_model(self) -> None:
        """A handed-over model needs a step that takes it; DDP options need a model."""
        if self.model is None:
            if self.ddp_kwargs:
                raise ValueError(f"workload {self.name!r} has ddp_kwargs but no model")
            return
        if not isinstance(self.model, torch.nn.Module):
            raise ValueError(
                f"the model of workload {self.name!r} is a {type(self.model).__name__}, "
                "not a torch.nn.Module"
            )
        if self.make_step is None:
            raise ValueError(
                f"workload {self.name!r} hands over a model but no make_step(device, model) "
                "to train it"
            )

    @property
    def dataset_length(self) -> int | None:
        """``len(dataset)``, or None for an iterable dataset that has no length."""
        try:
            return len(self.dataset)  # type: ignore[arg-type]
        except TypeError:
            return None

    @property
    def default_knobs(self) -> dict[str, Any]:
        """The first choice of every knob: what the baselines run."""
        return {knob: choices[0] for knob, choices in self.knobs.items()}

    def with_knobs(self, values: Mapping[str, Any]) -> Workload:
        """The workload configured with the sampled knob values (unknown knobs are an error)."""
        unknown = set(values) - set(self.knobs)
        if unknown:
            raise ValueError(f"workload {self.name!r} has no knob {sorted(unknown)[0]!r}")
        if not self.knobs:
            return self
        assert self.configure is not None
        return self.configure(**{**self.default_knobs, **values})

    def train_step(self, device: torch.device) -> TrainStep:
        """The step the measurement loop calls once per micro-batch; with a :attr:`model`, the
        model is moved to ``device`` and handed to ``make_step``."""
        if self.model is not None and self.make_step is not None:
            return self.make_step(device, self.model.to(device))
        if self.make_step is not None:
            return self.make_step(device)
        if self.step is not None:
            return _FunctionStep(self.step, device)
        return _MoveOnlyStep()
