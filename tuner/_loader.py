"""``tuner.loader``: a DataLoader built with a profile's best setting, fitted to the live machine.

The stored optimum was measured on the profile's machines; the machine running the training job
may have fewer usable CPUs or less memory free. Workers are scaled down to the CPUs actually
usable, prefetching to the memory actually available. With ``adapt=True`` the loader re-reads the
machine between epochs (never inside one) and steps ``num_workers`` and ``prefetch_factor`` down
under pressure and back up towards the optimum when the pressure is gone.

The whole setting is applied, not only the DataLoader arguments: the main process's intra-op
threads (``torch.set_num_threads``, logged, ``set_threads=False`` to keep yours), and the
workload's knobs through its ``configure`` when the workload is given. What a bare dataset
cannot take (knobs, a token budget) is a warning, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset

from objectives import Workload
from tuner.insight import BestSetting, NoResultError, best_setting, tune_command
from tuner.machine import (
    CpuLoad,
    GpuReader,
    Profile,
    available_memory_bytes,
    detect_fingerprint,
    load_catalog,
    open_gpu_reader,
    physical_core_count,
    resolve_profile,
    scale_workers,
    total_memory_bytes,
    usable_cpu_count,
    visible_nvml_indices,
)
from tuner.search import LoaderSettings, rule_of_thumb_workers

__all__ = [
    "AdaptiveLoader",
    "MachineState",
    "clamp_to_machine",
    "clamp_to_rank_share",
    "fit_to_machine",
    "live_profile",
    "loader",
    "local_world_size",
    "rank_best_setting",
    "read_machine",
    "warn_unapplied",
]

_log = logging.getLogger("tuner.loader")

HIGH_CPU_PERCENT = 90.0
LOW_AVAILABLE_FRACTION = 0.10
RECOVERED_CPU_PERCENT = 60.0
RECOVERED_AVAILABLE_FRACTION = 0.25
MEMORY_TOLERANCE = 0.15


@dataclasses.dataclass(frozen=True)
class MachineState:
    """What the loader reads between epochs."""

    usable_cpus: int
    cpu_percent: float | None
    available_memory_bytes: int
    total_memory_bytes: int
    gpu_free_fraction: float | None = None

    @property
    def available_fraction(self) -> float:
        """The tightest of host memory and (where present) GPU memory still free."""
        host = 1.0
        if self.total_memory_bytes:
            host = self.available_memory_bytes / self.total_memory_bytes
        return host if self.gpu_free_fraction is None else min(host, self.gpu_free_fraction)


@functools.cache
def _gpu_reader() -> GpuReader:
    return open_gpu_reader(_log)


def _gpu_free_fraction() -> float | None:
    """The least free share of the GPUs this process can use (``CUDA_VISIBLE_DEVICES``')."""
    reader = _gpu_reader()
    visible = set(visible_nvml_indices(reader.devices()))
    fractions = [
        1 - reading.memory_used_bytes / reading.memory_total_bytes
        for reading in reader.read()
        if reading.memory_total_bytes and reading.index in visible
    ]
    return min(fractions) if fractions else None


def read_machine(cpu_load: CpuLoad | None = None) -> MachineState:
    """The machine now; ``cpu_percent`` is the usable cores' load since ``cpu_load``'s last
    reading (None without a meter, or when no clock tick has passed)."""
    shares = cpu_load.read() if cpu_load is not None else None
    return MachineState(
        usable_cpus=usable_cpu_count(),
        cpu_percent=shares.busy_percent if shares is not None else None,
        available_memory_bytes=available_memory_bytes(),
        total_memory_bytes=total_memory_bytes(),
        gpu_free_fraction=_gpu_free_fraction(),
    )


def live_profile(hardware: str, profiles_file: str | None = None) -> Profile:
    """The profile a stored optimum was tuned for, checked against this machine."""
    return resolve_profile(hardware, load_catalog(profiles_file), detect_fingerprint())


def fit_to_machine(settings: LoaderSettings, profile: Profile) -> LoaderSettings:
    """The stored optimum clamped to the live machine (:func:`clamp_to_machine`), as every way
    of applying it does: ``tuner.loader``, the Lightning callback, ``TrainingArguments``."""
    return clamp_to_machine(settings, profile.vcpus, profile.memory_bytes, read_machine())


def clamp_to_machine(
    settings: LoaderSettings, profile_vcpus: int, profile_memory_bytes: int, state: MachineState
) -> LoaderSettings:
    """Fewer usable CPUs: proportionally fewer workers, and no more intra-op threads than CPUs;
    less RAM: a proportionally smaller prefetch.

    RAM within the profile's matching tolerance counts as the same machine; the load of the
    moment is ``adapt``'s business, not this clamp's.
    """
    threads = max(1, min(settings.torch_num_threads, state.usable_cpus))
    settings = dataclasses.replace(settings, torch_num_threads=threads)
    workers = settings.num_workers
    if state.usable_cpus < profile_vcpus:
        workers = scale_workers(workers, profile_vcpus, state.usable_cpus)
    prefetch = settings.prefetch_factor
    smaller = state.total_memory_bytes < (1 - MEMORY_TOLERANCE) * profile_memory_bytes
    if workers > 0 and prefetch is not None and smaller:
        prefetch = max(1, int(prefetch * state.total_memory_bytes / profile_memory_bytes))
    if workers == 0:
        return dataclasses.replace(
            settings, num_workers=0, prefetch_factor=None, persistent_workers=False
        )
    return dataclasses.replace(settings, num_workers=workers, prefetch_factor=prefetch or 2)


def local_world_size() -> int:
    """The ranks on this node, as torchrun tells each of them (``LOCAL_WORLD_SIZE``); 1
    outside torchrun or where the variable is not a positive count."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def clamp_to_rank_share(
    settings: LoaderSettings, profile: Profile, ranks: int, state: MachineState
) -> LoaderSettings:
    """A 1-rank optimum fitted to one of ``ranks`` ranks.

    The node keeps the workers the 1-rank study measured (fitted to this machine by
    :func:`clamp_to_machine`), shared out among the ranks, so an I/O-bound optimum of many
    workers keeps its total and a CPU-bound one ends near the rank's share of the cores; each
    rank gets no more intra-op threads than its share of the CPUs, and a prefetch fitted to its
    share of the memory.

    Args:
        settings: the 1-rank study's optimum.
        profile: the hardware profile that study ran on.
        ranks: the ranks on this node (torchrun's ``LOCAL_WORLD_SIZE``).
        state: this machine now.

    Returns:
        The setting one rank applies.
    """
    whole = clamp_to_machine(settings, profile.vcpus, profile.memory_bytes, state)
    workers = math.floor(whole.num_workers / ranks + 0.5) or min(whole.num_workers, 1)
    cpus = max(1, state.usable_cpus // ranks)
    share = dataclasses.replace(
        state,
        usable_cpus=cpus,
        available_memory_bytes=state.available_memory_bytes // ranks,
        total_memory_bytes=state.total_memory_bytes // ranks,
    )
    per_rank = dataclasses.replace(whole, num_workers=workers)
    return clamp_to_machine(per_rank, cpus, profile.memory_bytes, share)


def rank_best_setting(
    hardware: str = "auto",
    *,
    objective: str,
    storage: str | None = None,
    study_name: str | None = None,
    profiles_file: str | None = None,
    nproc_per_node: int | None = None,
) -> BestSetting:
    """The best setting for one rank of this node, fitted to the live machine: what
    ``tuner.loader``, ``TunedDataLoaders`` and the Hugging Face arguments apply.

    ``nproc_per_node`` (None: ``LOCAL_WORLD_SIZE`` from torchrun's environment, else 1) picks
    that rank count's study. Where it has none, the 1-rank study's optimum is clamped to the
    rank's share of the CPUs and memory (:func:`clamp_to_rank_share`), with a warning naming
    the command that tunes for that many ranks; it is never applied as it is.

    Raises:
        NoResultError: neither study exists, or neither has a finished trial.
    """
    ranks = nproc_per_node or local_world_size()
    look_up = functools.partial(
        best_setting,
        hardware,
        objective=objective,
        storage=storage,
        study_name=study_name,
        profiles_file=profiles_file,
    )
    profile = live_profile(hardware, profiles_file)
    try:
        best = look_up(nproc_per_node=ranks)
    except NoResultError as missing:
        if ranks == 1 or study_name is not None:
            raise
        try:
            best = look_up(nproc_per_node=1)
        except NoResultError:
            raise missing from None
        warnings.warn(
            f"no study tuned for {ranks} ranks per node ({missing}); the 1-rank optimum of "
            f"{best.study_name} is clamped to 1/{ranks} of the CPUs and memory. Tune for "
            f"{ranks} ranks with: {tune_command(hardware, objective, ranks)}",
            stacklevel=3,
        )
        fitted = clamp_to_rank_share(best.settings, profile, ranks, read_machine())
        return dataclasses.replace(best, settings=fitted)
    return dataclasses.replace(best, settings=fit_to_machine(best.settings, profile))


def _rule_of_thumb(batch_size: int) -> LoaderSettings:
    workers = rule_of_thumb_workers(physical_core_count(), local_world_size())
    return LoaderSettings(
        batch=batch_size, num_workers=workers, prefetch_factor=2, persistent_workers=True
    )


class AdaptiveLoader:
    """Iterates like a DataLoader; between epochs, follows the machine's load."""

    def __init__(
        self,
        dataset: Dataset,
        optimum: LoaderSettings,
        batch_param: str,
        dataloader_kwargs: dict[str, Any],
        read: Callable[[], MachineState] | None = None,
    ) -> None:
        self.dataset = dataset
        self.optimum = optimum
        self.current = optimum
        self._batch_param = batch_param
        self._extra = dataloader_kwargs
        # The load between two epoch ends is what the next epoch would compete with.
        self._read = read if read is not None else functools.partial(read_machine, CpuLoad())
        self._loader: DataLoader | None = None

    def _build(self) -> DataLoader:
        kwargs = {**self.current.dataloader_kwargs(self._batch_param), **self._extra}
        return DataLoader(self.dataset, **kwargs)

    def adjust(self) -> LoaderSettings:
        """One step down under pressure, one step back up when it is gone; logs each change."""
        state = self._read()
        current, optimum = self.current, self.optimum
        cpu = state.cpu_percent
        pressured = (cpu is not None and cpu >= HIGH_CPU_PERCENT) or (
            state.available_fraction <= LOW_AVAILABLE_FRACTION
        )
        relaxed = (
            cpu is not None
            and cpu <= RECOVERED_CPU_PERCENT
            and state.available_fraction >= RECOVERED_AVAILABLE_FRACTION
        )
        new = current
        if pressured and current.num_workers > 0:
            if (current.prefetch_factor or 1) > 1:
                new = dataclasses.replace(
                    current, prefetch_factor=(current.prefetch_factor or 2) - 1
                )
            elif current.num_workers > 1:
                new = dataclasses.replace(current, num_workers=current.num_workers - 1)
        elif relaxed and current != optimum:
            if current.num_workers < optimum.num_workers:
                new = dataclasses.replace(current, num_workers=current.num_workers + 1)
            elif (current.prefetch_factor or 0) < (optimum.prefetch_factor or 0):
                new = dataclasses.replace(
                    current, prefetch_factor=(current.prefetch_factor or 0) + 1
                )
        if new != current:
            _log.warning(
                "loader: num_workers %d -> %d, prefetch_factor %s -> %s "
                "(cpu %s%%, %.0f%% memory available)",
                current.num_workers,
                new.num_workers,
                current.prefetch_factor,
                new.prefetch_factor,
                "?" if cpu is None else f"{cpu:.0f}",
                100 * state.available_fraction,
            )
            self.current = new
            self._loader = None
        return self.current

    def __iter__(self) -> Iterator[Any]:
        if self._loader is not None:
            self.adjust()
        if self._loader is None:
            self._loader = self._build()
        return iter(self._loader)

    def __len__(self) -> int:
        if self._loader is None:
            self._loader = self._build()
        return len(self._loader)


def _workload_kwargs(workload: Workload, settings: LoaderSettings) -> dict[str, Any]:
    """What the configured workload adds to the tuned kwargs: batch sampler or sampler, collate,
    shuffle, ``drop_last``, its worker init."""
    built = settings.build_dataloader_kwargs(workload, seed=0)
    plain = settings.dataloader_kwargs(workload.batch_param)
    added = {key: value for key, value in built.items() if key not in plain}
    if workload.worker_init_fn is not None:
        added["worker_init_fn"] = workload.worker_init_fn
    return added


def warn_unapplied(best: BestSetting, dataloader_kwargs: dict[str, Any]) -> None:
    """Say what of the tuned setting a bare dataset cannot take, rather than drop it silently."""
    if best.knobs:
        knobs = ", ".join(f"{knob}={value!r}" for knob, value in best.knobs.items())
        warnings.warn(
            f"tuner.loader: {best.study_name} trial {best.trial_number} was measured with the "
            f"workload knobs {knobs}, which a bare dataset cannot take: pass workload= (its "
            "configure applies them) or apply them in your code "
            "(dataloader-tuner best --format python shows how)",
            stacklevel=3,
        )
    if best.batch_param != "batch_size" and "batch_sampler" not in dataloader_kwargs:
        warnings.warn(
            f"tuner.loader: the tuned {best.batch_param}={best.batch} is a batch sampler's: pass "
            "workload= (its batch sampler takes it) or batch_sampler=",
            stacklevel=3,
        )


def loader(
    dataset: Dataset | None = None,
    *,
    objective: str,
    hardware: str = "auto",
    storage: str | None = None,
    study_name: str | None = None,
    profiles_file: str | None = None,
    workload: Workload | None = None,
    batch_size: int | None = None,
    adapt: bool = False,
    set_threads: bool = True,
    **dataloader_kwargs: Any,
) -> DataLoader | AdaptiveLoader:
    """A DataLoader with the whole best setting stored for ``objective`` on ``hardware``.

    The setting is clamped to this machine (fewer usable CPUs: fewer workers; less RAM: a
    smaller prefetch), and the main process's intra-op threads are set as tuned
    (``torch.set_num_threads``, logged). Inside ``torchrun`` each rank takes the study of its
    node's rank count (``LOCAL_WORLD_SIZE``), else the 1-rank optimum clamped to its share
    of the machine, with a warning (:func:`rank_best_setting`). With no study, or no finished
    trial in it, the rule of thumb is used, with a warning.

    Args:
        dataset: the dataset to load; or give ``workload=`` instead (exactly one of them).
        objective: the study's objective, as it was tuned (``"image"``,
            ``"mypkg.data:workload"``, ...); required, so no study of another workload is
            applied to your data by mistake.
        hardware: the profile the study was run for, or ``"auto"`` for this machine's.
        storage: a database URL; None is ``$TUNER_STORAGE``, else ``sqlite:///tuner.db``.
        study_name: the study's name; None is ``<objective>@<profile>``.
        profiles_file: a JSON catalog of more hardware profiles.
        workload: the workload the study measured: its ``configure`` applies the tuned knobs,
            and its dataset, collate and batch sampler are used.
        batch_size: overrides the tuned batch.
        adapt: return an :class:`AdaptiveLoader`, which steps ``num_workers`` and
            ``prefetch_factor`` down under pressure between epochs, and back up after.
        set_threads: set the tuned intra-op threads (False leaves yours alone).
        **dataloader_kwargs: passed to the DataLoader (``collate_fn``, ``shuffle``, ...).

    Returns:
        A ``torch.utils.data.DataLoader``, or an :class:`AdaptiveLoader` with ``adapt``.

    Raises:
        TypeError: neither or both of ``dataset`` and ``workload``.
        ValueError: ``workload`` tunes another batch parameter than the study, or an unknown
            profile.

    Example::

        loader = tuner.loader(dataset, objective="mypkg.data:workload", shuffle=True)
    """
    if (dataset is None) == (workload is None):
        raise TypeError("tuner.loader takes a dataset or workload=, exactly one of them")
    best: BestSetting | None
    try:
        best = rank_best_setting(
            hardware,
            objective=objective,
            storage=storage,
            study_name=study_name,
            profiles_file=profiles_file,
        )
        settings, batch_param = best.settings, best.batch_param
    except NoResultError as error:
        warnings.warn(f"{error}; using the rule of thumb", stacklevel=2)
        best, batch_param = None, workload.batch_param if workload else "batch_size"
        settings = _rule_of_thumb(batch_size or (workload.default_batch_size if workload else 32))
        settings = fit_to_machine(settings, live_profile(hardware, profiles_file))
    if batch_size is not None:
        settings = dataclasses.replace(settings, batch=batch_size)
    if best is not None and set_threads:
        dataclasses.replace(best, settings=settings).apply(_log)
    if workload is not None:
        dataset, dataloader_kwargs = _from_workload(
            workload, settings, batch_param, dataloader_kwargs
        )
    elif best is not None:
        warn_unapplied(best, dataloader_kwargs)
    assert dataset is not None
    if adapt:
        return AdaptiveLoader(dataset, settings, batch_param, dataloader_kwargs)
    return DataLoader(dataset, **{**settings.dataloader_kwargs(batch_param), **dataloader_kwargs})


def _from_workload(
    workload: Workload,
    settings: LoaderSettings,
    batch_param: str,
    dataloader_kwargs: dict[str, Any],
) -> tuple[Dataset, dict[str, Any]]:
    """The workload's dataset, configured with the tuned knobs, and its DataLoader arguments
    (batch sampler, collate, worker init) under the caller's."""
    if workload.batch_param != batch_param:
        raise ValueError(
            f"workload {workload.name!r} tunes {workload.batch_param}, the study {batch_param}"
        )
    workload = workload.with_knobs(settings.knobs)
    return workload.dataset, {**_workload_kwargs(workload, settings), **dataloader_kwargs}
