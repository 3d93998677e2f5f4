"""The search space: which DataLoader settings a trial may try on this machine and profile.

Conditional where PyTorch is: ``prefetch_factor`` and ``persistent_workers`` exist only with
worker processes; ``pin_memory`` is sampled only on CUDA. Values frozen with ``--fix`` (and
``pin_memory`` off CUDA) are not suggested at all but recorded in the ``settings`` user attr, so
a study can be resumed with other ``--fix`` flags without Optuna seeing changed distributions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from itertools import product
from typing import Any

import optuna

from objectives import Workload
from tuner.search._settings import LoaderSettings

__all__ = ["MAX_WORKERS", "SearchSpace", "SpaceError", "optuna_params", "powers_of_two"]

MAX_PREFETCH_FACTOR = 8
MAX_WORKERS = 256
"""No space goes beyond this many workers (the pipeline model may set any range up to it), and
``--fix num_workers`` may name any count up to it: the range is set after the profile."""


class SpaceError(ValueError):
    """A ``--fix`` or ``--effective-batch`` that the space cannot honour (one-line message)."""


def powers_of_two(low: int, high: int) -> list[int]:
    """The powers of two in ``[low, high]``."""
    values, value = [], 1
    while value <= high:
        if value >= low:
            values.append(value)
        value *= 2
    return values


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def optuna_params(
    settings: LoaderSettings, batch_param: str, cuda: bool, fixed: Collection[str] = ()
) -> dict[str, Any]:
    """The params a trial suggests for ``settings``, the ``fixed`` ones left out: conditional
    as :meth:`SearchSpace.suggest` is (prefetch and persistence only with workers, pinning only
    on CUDA)."""
    params: dict[str, Any] = {"num_workers": settings.num_workers, batch_param: settings.batch}
    if settings.num_workers > 0:
        params["prefetch_factor"] = settings.prefetch_factor
        params["persistent_workers"] = settings.persistent_workers
    if cuda:
        params["pin_memory"] = settings.pin_memory
    params["torch_num_threads"] = settings.torch_num_threads
    params.update(settings.knobs)
    return {name: value for name, value in params.items() if name not in fixed}


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """Bounds for one study on one machine.

    Args:
        workload: the workload (its batch range, batch parameter and knobs).
        max_workers: the top of the ``num_workers`` range: the pipeline model's
            (:func:`tuner.pipeline.worker_range`) once the study is profiled, else
            ``min(2 x logical CPUs, 2 x the profile's vCPUs)``.
        max_threads: the main process's intra-op threads, ``1..usable CPUs``.
        cuda: whether ``pin_memory`` is worth sampling.
        max_batch: the edge found by the batch-size probe (``None``: the workload's bound).
        effective_batch: with gradient accumulation, the batch sizes must divide it.
        fixed: values frozen by the user, by parameter name (already validated).
        multiprocessing_context: passed to the DataLoader when it has workers.
    """

    workload: Workload
    max_workers: int
    max_threads: int
    cuda: bool
    max_batch: int | None = None
    effective_batch: int | None = None
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    multiprocessing_context: str | None = None

    @property
    def batch_param(self) -> str:
        return self.workload.batch_param

    def batch_choices(self) -> list[int]:
        """Powers of two within the workload's range, the probed edge and the effective batch,
        with the workload's own default batch size among them (a user's ``batch_size=48`` is
        what the ``pytorch-default`` baseline runs, so it must be a value the space holds)."""
        low, high = self.workload.batch_size_range
        if self.max_batch is not None:
            high = min(high, self.max_batch)
        if self.effective_batch is not None:
            high = min(high, self.effective_batch)
        choices = powers_of_two(low, high)
        if low <= self.workload.default_batch_size <= high:
            choices = sorted({*choices, self.workload.default_batch_size})
        if self.effective_batch is not None:
            choices = [value for value in choices if self.effective_batch % value == 0]
        if not choices:
            choices = [max(1, min(low, high))]
        return choices

    def parameter_names(self) -> list[str]:
        names = [
            "num_workers",
            self.batch_param,
            "prefetch_factor",
            "persistent_workers",
            "pin_memory",
            "torch_num_threads",
        ]
        return names + list(self.workload.knobs)

    def parse_fixed(self, assignments: list[str]) -> dict[str, Any]:
        """Parse ``--fix name=value`` flags; raise :class:`SpaceError` with one line if bad."""
        fixed: dict[str, Any] = {}
        for assignment in assignments:
            name, sep, text = assignment.partition("=")
            name, text = name.strip(), text.strip()
            if not sep or not name or not text:
                raise SpaceError(f"--fix takes name=value, got {assignment!r}")
            if name not in self.parameter_names():
                known = ", ".join(self.parameter_names())
                raise SpaceError(f"--fix: unknown parameter {name!r} (known: {known})")
            try:
                fixed[name] = self._parse_value(name, text)
            except ValueError as error:
                raise SpaceError(f"--fix {name}: {error}") from None
        if fixed.get("num_workers") == 0 and {"prefetch_factor", "persistent_workers"} & set(fixed):
            raise SpaceError("--fix: prefetch_factor and persistent_workers need num_workers > 0")
        return fixed

    def _parse_value(self, name: str, text: str) -> Any:
        if name in self.workload.knobs:
            choices = list(self.workload.knobs[name])
            for choice in choices:
                if str(choice) == text:
                    return choice
            raise ValueError(f"{text!r} is not one of {', '.join(map(str, choices))}")
        if name in ("persistent_workers", "pin_memory"):
            value = _parse_bool(text)
            if name == "pin_memory" and value and not self.cuda:
                raise ValueError("pin_memory=true needs a CUDA device")
            return value
        try:
            number = int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
        bounds = {
            "num_workers": (0, max(self.max_workers, MAX_WORKERS)),
            "prefetch_factor": (1, MAX_PREFETCH_FACTOR),
            "torch_num_threads": (1, self.max_threads),
        }
        if name == self.batch_param:
            low, high = self.workload.batch_size_range
            if not low <= number <= high:
                raise ValueError(f"{number} is outside {low}..{high}")
            if self.effective_batch is not None and self.effective_batch % number:
                raise ValueError(
                    f"{number} does not divide --effective-batch {self.effective_batch}"
                )
            return number
        low, high = bounds[name]
        if not low <= number <= high:
            raise ValueError(f"{number} is outside {low}..{high} on this machine")
        return number

    def _pick(self, trial: optuna.Trial, name: str, suggest: Any) -> Any:
        return self.fixed[name] if name in self.fixed else suggest()

    def suggest(self, trial: optuna.Trial) -> LoaderSettings:
        """Sample one setting; fixed values are taken, not suggested."""
        num_workers = self._pick(
            trial, "num_workers", lambda: trial.suggest_int("num_workers", 0, self.max_workers)
        )
        batch = self._pick(
            trial,
            self.batch_param,
            lambda: trial.suggest_categorical(self.batch_param, self.batch_choices()),
        )
        prefetch_factor, persistent_workers = None, False
        if num_workers > 0:
            prefetch_factor = self._pick(
                trial,
                "prefetch_factor",
                lambda: trial.suggest_int("prefetch_factor", 1, MAX_PREFETCH_FACTOR),
            )
            persistent_workers = self._pick(
                trial,
                "persistent_workers",
                lambda: trial.suggest_categorical("persistent_workers", [False, True]),
            )
        pin_memory = False
        if self.cuda:
            pin_memory = self._pick(
                trial, "pin_memory", lambda: trial.suggest_categorical("pin_memory", [False, True])
            )
        threads = self._pick(
            trial,
            "torch_num_threads",
            lambda: trial.suggest_int("torch_num_threads", 1, self.max_threads),
        )
        knobs = {
            knob: self._pick(
                trial,
                knob,
                lambda knob=knob, choices=choices: trial.suggest_categorical(knob, list(choices)),
            )
            for knob, choices in self.workload.knobs.items()
        }
        return self.settings(
            num_workers, batch, prefetch_factor, persistent_workers, pin_memory, threads, knobs
        )

    @property
    def base_knobs(self) -> dict[str, Any]:
        """The workload as the user runs it untuned: its default knobs, ``--fix`` ones over them.

        A fixed knob is not searched, so the baselines, the probe and the model run it too:
        a "x over pytorch-default" never credits the tuner with a choice the user made.
        """
        fixed = {knob: value for knob, value in self.fixed.items() if knob in self.workload.knobs}
        return {**self.workload.default_knobs, **fixed}

    def knob_sets(self) -> list[dict[str, Any]]:
        """Every combination of the searched knobs' values (fixed ones as fixed), base first."""
        choices = [
            [self.fixed[knob]] if knob in self.fixed else list(values)
            for knob, values in self.workload.knobs.items()
        ]
        sets = [dict(zip(self.workload.knobs, combo, strict=True)) for combo in product(*choices)]
        base = self.base_knobs
        return [base] + [knobs for knobs in sets if knobs != base]

    def knob_variants(self) -> tuple[tuple[str, Any], ...]:
        """Each searched knob's values other than the base one: what the profile measures."""
        base = self.base_knobs
        return tuple(
            (knob, value)
            for knob, values in self.workload.knobs.items()
            if knob not in self.fixed
            for value in values
            if value != base[knob]
        )

    def main_process_settings(self, batch: int, pin_memory: bool = False) -> LoaderSettings:
        """No workers, one intra-op thread, the base knobs: what the probe and the ceiling
        measure with (memory and the step alone, not the loader's speed)."""
        return self.settings(0, batch, None, False, pin_memory, 1, self.base_knobs)

    def settings(
        self,
        num_workers: int,
        batch: int,
        prefetch_factor: int | None,
        persistent_workers: bool,
        pin_memory: bool,
        torch_num_threads: int,
        knobs: Mapping[str, Any],
    ) -> LoaderSettings:
        """A setting with the derived values (accumulation, context) filled in."""
        accumulation = 1
        if self.effective_batch is not None:
            accumulation = max(1, self.effective_batch // batch)
        return LoaderSettings(
            batch=batch,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers if num_workers > 0 else False,
            pin_memory=pin_memory,
            torch_num_threads=torch_num_threads,
            knobs=dict(knobs),
            accumulation_steps=accumulation,
            multiprocessing_context=self.multiprocessing_context if num_workers > 0 else None,
        )

    def with_fixed(self, settings: LoaderSettings) -> LoaderSettings:
        """``settings`` with the ``--fix`` values in place of its own: how a setting made
        elsewhere (a baseline, a warm start) is bound as every sampled one is.

        A worker count fixed above zero on a setting without workers takes PyTorch's
        ``prefetch_factor=2`` and non-persistent workers unless those are fixed too.
        """
        fixed = self.fixed
        knobs = {**settings.knobs, **{k: v for k, v in fixed.items() if k in self.workload.knobs}}
        return self.settings(
            fixed.get("num_workers", settings.num_workers),
            fixed.get(self.batch_param, settings.batch),
            fixed.get("prefetch_factor", settings.prefetch_factor or 2),
            fixed.get("persistent_workers", settings.persistent_workers),
            fixed.get("pin_memory", settings.pin_memory),
            fixed.get("torch_num_threads", settings.torch_num_threads),
            knobs,
        )

    def params_for(self, settings: LoaderSettings) -> dict[str, Any]:
        """The Optuna params that reproduce ``settings`` (for ``enqueue_trial``)."""
        return optuna_params(settings, self.batch_param, self.cuda, self.fixed)

    def clamp_batch(self, batch: int) -> int:
        """The nearest batch choice not above ``batch`` (baselines and warm starts)."""
        choices = self.batch_choices()
        below = [value for value in choices if value <= batch]
        return below[-1] if below else choices[0]
