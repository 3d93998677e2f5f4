"""One DataLoader setting: what a trial measures and what ``tuner.best`` hands back.

Every trial stores its complete setting as the user attr ``settings`` (sampled, fixed and
derived values alike), so the query side never has to reconstruct it from Optuna's params.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch.utils.data import IterableDataset

from objectives import Workload

__all__ = ["LoaderSettings"]


@dataclasses.dataclass(frozen=True)
class LoaderSettings:
    """DataLoader keyword arguments plus the knobs around the loader that compete with it.

    ``batch`` is the workload's batch parameter: ``batch_size`` for most workloads, the token
    budget ``max_tokens`` for a token-bucket sampler. ``accumulation_steps`` micro-batches make
    one optimizer step (``--effective-batch``).
    """

    batch: int
    num_workers: int
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    torch_num_threads: int = 1
    knobs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    accumulation_steps: int = 1
    multiprocessing_context: str | None = None

    def __post_init__(self) -> None:
        if self.num_workers == 0 and (self.prefetch_factor is not None or self.persistent_workers):
            raise ValueError("prefetch_factor and persistent_workers need num_workers > 0")

    def dataloader_kwargs(self, batch_param: str = "batch_size") -> dict[str, Any]:
        """Keyword arguments for ``DataLoader(dataset, **kwargs)`` (batch sampler aside)."""
        kwargs: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if batch_param == "batch_size":
            kwargs = {"batch_size": self.batch, **kwargs}
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor
            kwargs["persistent_workers"] = self.persistent_workers
            if self.multiprocessing_context is not None:
                kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs

    def build_dataloader_kwargs(self, workload: Workload, seed: int) -> dict[str, Any]:
        """The kwargs a trial builds its DataLoader with, batch sampler and collate included."""
        kwargs = self.dataloader_kwargs(workload.batch_param)
        if workload.batch_sampler is not None:
            kwargs.pop("batch_size", None)
            kwargs["batch_sampler"] = workload.batch_sampler(workload.dataset, self.batch, seed)
        elif workload.sampler is not None:
            kwargs["sampler"] = workload.sampler
        elif not isinstance(workload.dataset, IterableDataset):  # it orders its own samples
            kwargs["shuffle"] = True
        if workload.batch_sampler is None and workload.drop_last:
            kwargs["drop_last"] = True
        if workload.collate_fn is not None:
            kwargs["collate_fn"] = workload.collate_fn
        return kwargs

    def to_attrs(self) -> dict[str, Any]:
        """A JSON-safe dict for the trial's ``settings`` user attr."""
        attrs = dataclasses.asdict(self)
        attrs["knobs"] = dict(self.knobs)
        return attrs

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> LoaderSettings:
        fields = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in attrs.items() if key in fields})

    @property
    def reforks_workers(self) -> bool:
        """Whether workers are forked again at each epoch's start (not persistent): from a main
        process that holds the step's memory by then, which is copied as it writes it again."""
        return self.num_workers > 0 and not self.persistent_workers

    def memory_footprint(self) -> tuple[int, int, int, int, int]:
        """The memory-driving parameters, each larger meaning more memory (for the wall)."""
        return (
            self.num_workers,
            self.batch,
            self.prefetch_factor or 0,
            int(self.pin_memory),
            int(self.reforks_workers),
        )

    def dominates(self, other: LoaderSettings) -> bool:
        """True when this setting is at least as large as ``other`` in every memory driver."""
        mine, theirs = self.memory_footprint(), other.memory_footprint()
        return self.knobs == other.knobs and all(a >= b for a, b in zip(mine, theirs, strict=True))
