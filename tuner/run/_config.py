"""What a run is asked to do, checked before anything is written.

:class:`StudyConfig` is the CLI's flags as data; :func:`prepare` checks every one of them against
this machine and the storage and returns a :class:`PreparedStudy`, or raises one-line errors
(:class:`ConfigError`, and the usage errors of :mod:`tuner._cli`). Nothing here writes to the
database: a refused run leaves no trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

import torch
from optuna.storages import BaseStorage

from objectives import Workload, load_workload
from storage import open_storage
from tuner import machine
from tuner._naming import study_name
from tuner.run._samplers import SAMPLERS
from tuner.search import SearchSpace, SpaceError
from tuner.trial import GuardLimits, default_limits, rank_devices, shard_error

__all__ = [
    "ConfigError",
    "PreparedStudy",
    "StudyConfig",
    "prepare",
    "resolve_nproc_per_node",
    "trial_deadline",
]

_log = logging.getLogger("tuner")


class ConfigError(ValueError):
    """An argument that cannot be honoured; one line, exit code 2."""


@dataclasses.dataclass
class StudyConfig:
    hardware: str = "auto"
    objective: str = "image"
    objective_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    storage: str = "sqlite:///tuner.db"
    study_name: str | None = None
    n_trials: int | None = 20
    total_trials: int | None = None
    timeout: float | None = None
    device: str = "auto"
    seed: int | None = None
    trial_seconds: float = 3.0
    warmup_seconds: float = 1.0
    trial_timeout: float | None = None
    fix: list[str] = dataclasses.field(default_factory=list)
    effective_batch: int | None = None
    sampler: str = "model"
    memory_limit: str | None = None
    shm_limit: str | None = None
    gpu_memory_limit: str | None = None
    probe_batch: bool = True
    remeasure_top: int = 3
    remeasure_rounds: int = 2
    multiprocessing_context: str | None = None
    heartbeat_interval: int = 10
    grace_period: int | None = None
    profiles_file: str | None = None
    artifact_dir: str | None = None
    progress: bool = True
    nproc_per_node: int | str = 1
    """Training processes per node, as ``torchrun --nproc-per-node``: a count, or ``auto``
    (the CUDA GPUs, else 1)."""


@dataclasses.dataclass(frozen=True)
class PreparedStudy:
    """A validated run: nothing has been written yet."""

    config: StudyConfig
    profile: machine.Profile
    fingerprint: machine.Fingerprint
    workload: Workload
    space: SearchSpace
    device: str
    limits: GuardLimits
    storage: BaseStorage
    study_name: str
    nproc_per_node: int = 1
    """Ranks per node a trial measures (:func:`resolve_nproc_per_node`)."""
    gpu_indices: tuple[int, ...] = ()
    """The NVML index (:func:`~tuner.machine.nvml_index_of`) of each rank's device
    (:func:`~tuner.trial.rank_devices`): the GPUs the guard reads, the first the one the
    telemetry reads; empty off CUDA or where NVML sees no GPU."""


def trial_deadline(config: StudyConfig) -> float:
    """How long a trial child may take before it is killed as hung."""
    if config.trial_timeout is not None:
        return config.trial_timeout
    return 60.0 + 3 * (config.warmup_seconds + config.trial_seconds)


def _resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {requested}: CUDA is not available on this machine")
        return requested
    if requested == "cpu":
        return requested
    raise ConfigError(f"--device must be auto, cpu or cuda[:N], got {requested!r}")


def _check_numbers(config: StudyConfig) -> None:
    for name in ("n_trials", "total_trials", "effective_batch", "trial_timeout", "timeout"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if config.trial_seconds <= 0 or config.warmup_seconds < 0:
        raise ConfigError("--trial-seconds must be positive and --warmup-seconds not negative")
    if config.sampler not in SAMPLERS:
        raise ConfigError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {config.sampler!r}")
    for name in ("heartbeat_interval", "grace_period"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
    for name in ("remeasure_top", "remeasure_rounds"):
        if getattr(config, name) < 0:
            raise ConfigError(
                f"--{name.replace('_', '-')} must not be negative, got {getattr(config, name)}"
            )


def resolve_nproc_per_node(requested: int | str, device: str) -> int:
    """The rank count ``--nproc-per-node`` names: ``auto`` is the CUDA GPU count on CUDA, else
    1; a count must be positive, and on CUDA at most the GPUs (one device per rank)."""
    if requested == "auto":
        return torch.cuda.device_count() if device.startswith("cuda") else 1
    try:
        ranks = int(requested)
    except ValueError:
        ranks = 0
    if ranks < 1:
        raise ConfigError(f"--nproc-per-node must be a positive count or auto, got {requested!r}")
    if device.startswith("cuda") and ranks > torch.cuda.device_count():
        raise ConfigError(
            f"--nproc-per-node {ranks}: this machine has {torch.cuda.device_count()} CUDA GPUs "
            "(one per rank)"
        )
    return ranks


def _check_profile_ranks(profile: machine.Profile, requested: int | str) -> None:
    """A GPU node trains one rank per GPU: a named profile with fewer GPUs than the ranks asked
    for has no such training to tune (a profile without GPUs trains its ranks on the CPU)."""
    try:
        ranks = int(requested)
    except ValueError:  # auto, or what resolve_nproc_per_node refuses in its own words
        return
    if 0 < profile.gpu_count < ranks:
        raise ConfigError(
            f"--nproc-per-node {ranks}: profile {profile.name} has {profile.gpu_count} GPU(s) "
            "(one per rank)"
        )


def _check_shardable(workload: Workload, ranks: int) -> None:
    """More than one rank draws from shards of the dataset: refused where there are none."""
    error = shard_error(workload) if ranks > 1 else None
    if error is not None:
        raise ConfigError(f"--nproc-per-node {ranks}: {error}")


def _check_dataset(workload: Workload) -> None:
    """An empty dataset has nothing to load: refused here rather than failing every trial."""
    if workload.dataset_length == 0:  # an iterable dataset without a length: its trials tell
        raise ConfigError(f"the dataset of workload {workload.name!r} is empty (length 0)")


def _resolve_profile(config: StudyConfig, fingerprint: machine.Fingerprint) -> machine.Profile:
    """The profile ``--hardware`` names; a named one must match this machine."""
    catalog = machine.load_catalog(config.profiles_file)
    profile = machine.resolve_profile(config.hardware, catalog, fingerprint)
    _check_profile_ranks(profile, config.nproc_per_node)
    differences = machine.profile_mismatches(profile, fingerprint)
    if differences and config.hardware != machine.AUTO_PROFILE:
        raise ConfigError(
            f"this machine does not match profile {profile.name}: {'; '.join(differences)}"
            " (use --hardware auto to tune this machine as it is)"
        )
    return profile


def _build_space(
    config: StudyConfig,
    workload: Workload,
    fingerprint: machine.Fingerprint,
    profile: machine.Profile,
    device: str,
    ranks: int = 1,
) -> SearchSpace:
    """One rank's space: ``ranks`` training processes share the node's cores, so each rank's
    workers and intra-op threads range over its share of them."""
    max_workers = max(0, min(2 * fingerprint.logical_cpus, 2 * profile.vcpus) // ranks)
    space = SearchSpace(
        workload=workload,
        max_workers=max_workers,
        max_threads=max(1, fingerprint.usable_cpus // ranks),
        cuda=device.startswith("cuda"),
        effective_batch=config.effective_batch,
        multiprocessing_context=config.multiprocessing_context,
    )
    if config.effective_batch is not None:
        low, high = workload.batch_size_range
        if not [
            b for b in space.batch_choices() if low <= b <= high and config.effective_batch % b == 0
        ]:
            raise SpaceError(
                f"--effective-batch {config.effective_batch}: "
                f"no power of two in {low}..{high} divides it"
            )
    return dataclasses.replace(space, fixed=space.parse_fixed(config.fix))


def _gpu_devices(device: str, ranks: int = 1) -> tuple[tuple[int, ...], int | None]:
    """The NVML index of each of ``ranks`` ranks' devices on ``device``, each mapped through
    ``CUDA_VISIBLE_DEVICES`` as that rank's CUDA sees it, and the smallest one's memory (the
    GPU limit is a share of it); ``((), None)`` off CUDA or without NVML."""
    if not device.startswith("cuda"):
        return (), None
    with contextlib.closing(machine.open_gpu_reader(_log)) as reader:
        devices = reader.devices()
    if not devices:
        return (), None
    flag = f"--device {device}" if ranks == 1 else f"--nproc-per-node {ranks}"
    try:
        indices = tuple(machine.nvml_index_of(d, devices) for d in rank_devices(device, ranks))
    except machine.GpuMappingError as error:
        raise ConfigError(f"{flag}: {error}") from None
    totals = {d.index: d.memory_total_bytes for d in devices}
    known = [totals[index] for index in indices if index in totals]
    return indices, min(known) if known else None


def _limits(config: StudyConfig, gpu_total: int | None) -> GuardLimits:
    try:
        return default_limits(
            config.memory_limit, config.shm_limit, config.gpu_memory_limit, gpu_total
        )
    except ValueError as error:
        raise ConfigError(f"memory limit: {error}") from None


def prepare(config: StudyConfig) -> PreparedStudy:
    """Check every argument against this machine and the storage; raise one-line errors."""
    _check_numbers(config)
    fingerprint = machine.detect_fingerprint()
    profile = _resolve_profile(config, fingerprint)
    workload = load_workload(config.objective, config.objective_options)
    _check_dataset(workload)
    device = _resolve_device(config.device)
    ranks = resolve_nproc_per_node(config.nproc_per_node, device)
    _check_shardable(workload, ranks)
    space = _build_space(config, workload, fingerprint, profile, device, ranks)
    gpu_indices, gpu_total = _gpu_devices(device, ranks)
    limits = _limits(config, gpu_total)
    storage = open_storage(
        config.storage,
        heartbeat_interval=config.heartbeat_interval,
        grace_period=config.grace_period,
    )
    name = config.study_name or study_name(config.objective, profile.name, ranks)
    return PreparedStudy(
        config,
        profile,
        fingerprint,
        workload,
        space,
        device,
        limits,
        storage,
        name,
        ranks,
        gpu_indices,
    )
