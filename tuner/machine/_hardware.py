"""Hardware fingerprints and named hardware profiles.

A study is named ``<objective>@<profile>`` and shared by every machine of that
profile, so the profile decides whose trials may be compared. This module
describes the machine we run on (:class:`Fingerprint`), the catalog of named
profiles (:func:`load_catalog`), and checks the two against each other
(:func:`profile_mismatches`) so a machine never writes into another profile's
study. Everything here only reads; the one state kept is the per-process
fingerprint cache, which is safe to share between threads once filled.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "AUTO_PROFILE",
    "GIB",
    "PROFILES_ENV",
    "Fingerprint",
    "Profile",
    "ProfileError",
    "auto_profile_name",
    "cgroup_cpu_limit",
    "cpu_model_name",
    "detect_fingerprint",
    "gpu_model_slug",
    "load_catalog",
    "own_cgroup_cpu_limit",
    "physical_core_count",
    "profile_mismatches",
    "resolve_profile",
    "scale_workers",
    "similarity",
    "usable_cpu_count",
]

GIB = 2**30

AUTO_PROFILE = "auto"
PROFILES_ENV = "TUNER_PROFILES"

_CPUINFO = Path("/proc/cpuinfo")
_PROC_SELF_CGROUP = Path("/proc/self/cgroup")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_CGROUP_V1_CPU_DIRS = ("cpu,cpuacct", "cpu")

# Optuna study names travel through URLs, file names and SQL; keep them plain.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
_GPU_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})

_REQUIRED_FIELDS = frozenset({"vcpus", "memory_gib"})
_OPTIONAL_FIELDS = frozenset({"gpu_count", "gpu_model", "gpu_memory_gib", "description"})


class ProfileError(ValueError):
    """A hardware profile or catalog is unusable; the message is one line for the CLI."""


# --------------------------------------------------------------------------- readers


def cgroup_cpu_limit(
    cpu_max: Path | None = None,
    cfs_quota: Path | None = None,
    cfs_period: Path | None = None,
) -> float | None:
    """CPUs one cgroup's quota allows (e.g. 2.5), or None when unlimited or unreadable.

    cgroup v2's ``cpu.max`` wins when it exists; otherwise cgroup v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``. A missing path is a missing file.
    """
    if cpu_max is not None and cpu_max.exists():
        return _read_cpu_max(cpu_max)
    if cfs_quota is not None and cfs_period is not None:
        return _read_cfs_quota(cfs_quota, cfs_period)
    return None


def _read_cpu_max(path: Path) -> float | None:
    """Parse cgroup v2 ``cpu.max``: ``"<quota|max> <period>"``."""
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _quota_ratio(fields[0], fields[1])


def _read_cfs_quota(quota_path: Path, period_path: Path) -> float | None:
    """Parse cgroup v1 CFS files; a quota of -1 means unlimited."""
    try:
        quota = quota_path.read_text().strip()
        period = period_path.read_text().strip()
    except OSError:
        return None
    return _quota_ratio(quota, period)


def _quota_ratio(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def own_cgroup_cpu_limit(
    proc_self_cgroup: Path = _PROC_SELF_CGROUP, cgroup_root: Path = _CGROUP_ROOT
) -> float | None:
    """The binding CPU quota of this process's cgroup, or None when nothing limits it.

    Every ancestor up to the mount root is read because a parent's quota binds its
    children: the smallest one wins (as ``_memory.cgroup_memory`` does for memory).
    """
    try:
        membership = proc_self_cgroup.read_text()
    except OSError:
        return None
    directories = _cpu_cgroup_dirs(membership, cgroup_root)
    limits = (cgroup_cpu_limit(*_cpu_limit_files(directory)) for directory in directories)
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def _cpu_limit_files(directory: Path) -> tuple[Path, Path, Path]:
    return directory / "cpu.max", directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us"


def _cpu_cgroup_dirs(membership: str, root: Path) -> list[Path]:
    """This process's CPU cgroup directory and its ancestors, innermost first."""
    for hierarchy_id, controllers, path in _membership_lines(membership):
        if hierarchy_id != "0" and "cpu" in controllers.split(","):
            for name in _CGROUP_V1_CPU_DIRS:
                if (root / name / "cpu.cfs_quota_us").is_file():
                    return _ancestors(root / name, path)
    for hierarchy_id, controllers, path in _membership_lines(membership):
        if hierarchy_id == "0" and controllers == "":
            for mount in (root, root / "unified"):
                if "cpu" in _read_text(mount / "cgroup.controllers").split():
                    return _ancestors(mount, path)
    return []


def _membership_lines(membership: str) -> list[tuple[str, str, str]]:
    """(hierarchy id, controllers, path) for each line of /proc/<pid>/cgroup."""
    lines = (line.strip().split(":", 2) for line in membership.splitlines())
    return [(parts[0], parts[1], parts[2]) for parts in lines if len(parts) == 3]


def _ancestors(mount: Path, cgroup_path: str) -> list[Path]:
    """The cgroup's directory and its parents up to ``mount``, innermost first.

    Where the path is not visible from here (a container sees its own cgroup as the
    mount root, or a path outside its namespace), the mount root alone is used.
    """
    relative = cgroup_path.strip("/")
    leaf = mount / relative
    if not relative or ".." in relative.split("/") or not leaf.is_dir():
        return [mount]
    return [leaf, *[parent for parent in leaf.parents if parent.is_relative_to(mount)]]


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def cpu_model_name(cpuinfo: Path = _CPUINFO) -> str:
    """The CPU's marketing name, for humans comparing machines."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cpu_count() -> int:
    """CPUs this process may run on: affinity mask, capped by the cgroup quota."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    limit = own_cgroup_cpu_limit()
    if limit is None:
        return affinity
    # Round a fractional quota up, as the JVM and Go runtimes do: 1.5 CPUs still run 2 threads.
    return max(1, min(affinity, math.ceil(limit)))


def physical_core_count() -> int:
    """Physical cores, or logical CPUs where psutil cannot tell."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def _read_gpus() -> tuple[tuple[tuple[str, int], ...], str | None]:
    """(name, memory_total_bytes) per GPU in index order, and the driver version."""
    from tuner.machine._gpu import open_gpu_reader

    reader = open_gpu_reader()
    try:
        if not reader.available:
            return (), None
        devices = sorted(reader.devices(), key=lambda device: device.index)
        gpus = tuple((device.name, device.memory_total_bytes) for device in devices)
        return gpus, reader.driver_version
    finally:
        reader.close()


# --------------------------------------------------------------------------- fingerprint


@dataclass(frozen=True)
class Fingerprint:
    """What this machine is, as far as DataLoader tuning cares; stored with every trial."""

    hostname: str
    cpu_model: str
    logical_cpus: int
    usable_cpus: int
    physical_cores: int
    memory_bytes: int
    cgroup_memory_limit_bytes: int | None
    gpus: tuple[tuple[str, int], ...]
    gpu_driver: str | None
    torch_version: str
    cuda_version: str | None
    cuda_available: bool

    @property
    def usable_memory_bytes(self) -> int:
        """RAM this process may use: total RAM, capped by the cgroup limit."""
        if self.cgroup_memory_limit_bytes is None:
            return self.memory_bytes
        return min(self.memory_bytes, self.cgroup_memory_limit_bytes)

    def to_attrs(self) -> dict[str, Any]:
        """JSON-safe form for Optuna user attributes."""
        return {
            "hostname": self.hostname,
            "cpu_model": self.cpu_model,
            "logical_cpus": self.logical_cpus,
            "usable_cpus": self.usable_cpus,
            "physical_cores": self.physical_cores,
            "memory_bytes": self.memory_bytes,
            "cgroup_memory_limit_bytes": self.cgroup_memory_limit_bytes,
            "gpus": [{"name": name, "memory_total_bytes": size} for name, size in self.gpus],
            "gpu_driver": self.gpu_driver,
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "cuda_available": self.cuda_available,
        }

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> Fingerprint:
        """Inverse of :meth:`to_attrs`; raises ValueError on a malformed mapping."""
        try:
            gpus = tuple(
                (str(gpu["name"]), int(gpu["memory_total_bytes"])) for gpu in attrs["gpus"]
            )
            limit = attrs["cgroup_memory_limit_bytes"]
            return cls(
                hostname=str(attrs["hostname"]),
                cpu_model=str(attrs["cpu_model"]),
                logical_cpus=int(attrs["logical_cpus"]),
                usable_cpus=int(attrs["usable_cpus"]),
                physical_cores=int(attrs["physical_cores"]),
                memory_bytes=int(attrs["memory_bytes"]),
                cgroup_memory_limit_bytes=None if limit is None else int(limit),
                gpus=gpus,
                gpu_driver=attrs["gpu_driver"],
                torch_version=str(attrs["torch_version"]),
                cuda_version=attrs["cuda_version"],
                cuda_available=bool(attrs["cuda_available"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed fingerprint attributes: {exc!r}") from exc


@functools.cache
def detect_fingerprint() -> Fingerprint:
    """Fingerprint of this machine; cached because hardware does not change mid-process."""
    import torch

    from tuner.machine._memory import cgroup_memory, total_memory_bytes

    cgroup = cgroup_memory()
    gpus, gpu_driver = _read_gpus()
    return Fingerprint(
        hostname=socket.gethostname(),
        cpu_model=cpu_model_name(),
        logical_cpus=os.cpu_count() or 1,
        usable_cpus=usable_cpu_count(),
        physical_cores=physical_core_count(),
        memory_bytes=total_memory_bytes(),
        cgroup_memory_limit_bytes=None if cgroup is None else cgroup.limit_bytes,
        gpus=gpus,
        gpu_driver=gpu_driver,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
    )


# --------------------------------------------------------------------------- naming


def gpu_model_slug(device_name: str) -> str:
    """Short lowercase model of a GPU name: 'Tesla V100-SXM2-16GB' -> 'v100'.

    Vendor words are dropped, then words are joined up to the first one with a
    digit, so 'NVIDIA GeForce RTX 4090' -> 'rtx4090' and 'NVIDIA H100 80GB HBM3' -> 'h100'.
    """
    words = [re.sub(r"[^a-z0-9]", "", word) for word in re.split(r"[\s_-]+", device_name.lower())]
    words = [word for word in words if word and word not in _GPU_VENDOR_WORDS]
    model: list[str] = []
    for word in words:
        model.append(word)
        if any(char.isdigit() for char in word):
            break
    return "".join(model) or "gpu"


def _gpu_counts(fp: Fingerprint) -> Counter[str]:
    return Counter(gpu_model_slug(name) for name, _ in fp.gpus)


def auto_profile_name(fp: Fingerprint) -> str:
    """Deterministic profile name for 'auto', e.g. 'local-16cpu-125g-1xh200'."""
    memory_gib = fp.usable_memory_bytes // GIB
    counts = _gpu_counts(fp)
    # Sorted by model so mixed-GPU machines get one name whatever the device order.
    gpu_part = "-".join(f"{counts[model]}x{model}" for model in sorted(counts)) or "nogpu"
    return f"local-{fp.usable_cpus}cpu-{memory_gib}g-{gpu_part}"


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class Profile:
    """A named kind of machine; every machine of one profile shares its studies."""

    name: str
    vcpus: int
    memory_bytes: int
    gpu_count: int = 0
    gpu_model: str | None = None
    gpu_memory_bytes: int | None = None
    description: str = ""

    @classmethod
    def from_fingerprint(cls, fp: Fingerprint) -> Profile:
        """The 'auto' profile: a function of :func:`auto_profile_name`'s parts only,
        so every machine with the same auto name gets the same profile."""
        counts = _gpu_counts(fp)
        gpu_model = counts.most_common(1)[0][0] if counts else None
        gpu_memory = min(size for _, size in fp.gpus) if fp.gpus else None
        return cls(
            name=auto_profile_name(fp),
            vcpus=fp.usable_cpus,
            memory_bytes=(fp.usable_memory_bytes // GIB) * GIB,
            gpu_count=len(fp.gpus),
            gpu_model=gpu_model,
            gpu_memory_bytes=gpu_memory,
            description=f"auto-detected: {fp.cpu_model}",
        )

    def gpu_summary(self) -> str:
        return f"{self.gpu_count}x {self.gpu_model}" if self.gpu_count else "no GPU"


def load_catalog(user_file: str | Path | None = None) -> dict[str, Profile]:
    """Built-in profiles, overlaid by a user catalog (argument, else ``$TUNER_PROFILES``).

    A user entry with a built-in's name replaces it. Raises :class:`ProfileError`
    with a one-line message on any problem in either file.
    """
    builtin = resources.files("tuner.machine").joinpath("profiles.json").read_text()
    catalog = _parse_catalog(builtin, "built-in profiles.json")
    user_path = user_file if user_file is not None else os.environ.get(PROFILES_ENV) or None
    if user_path is not None:
        catalog.update(_parse_catalog(_read_catalog_file(Path(user_path)), str(user_path)))
    return catalog


def _read_catalog_file(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise ProfileError(f"profile catalog {path} not found") from None
    except OSError as exc:
        raise ProfileError(f"profile catalog {path} cannot be read: {exc.strerror}") from None


def _parse_catalog(text: str, source: str) -> dict[str, Profile]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected an object mapping profile names to entries")
    return {name: _parse_entry(name, entry, source) for name, entry in data.items()}


def _parse_entry(name: str, entry: object, source: str) -> Profile:
    where = f"{source}: profile {name!r}"
    if not _SAFE_NAME.match(name) or name == AUTO_PROFILE:
        raise ProfileError(f"{where}: name must be letters, digits, '-', '.' and not 'auto'")
    if not isinstance(entry, dict):
        raise ProfileError(f"{where}: expected an object")
    unknown = sorted(set(entry) - _REQUIRED_FIELDS - _OPTIONAL_FIELDS)
    if unknown:
        raise ProfileError(f"{where}: unknown field {unknown[0]!r}")
    missing = sorted(_REQUIRED_FIELDS - set(entry))
    if missing:
        raise ProfileError(f"{where}: missing field {missing[0]!r}")
    gpu_count = _int_field(entry, "gpu_count", where, minimum=0, default=0)
    gpu_model = _gpu_model_field(entry, where)
    if (gpu_count > 0) != (gpu_model is not None):
        raise ProfileError(f"{where}: gpu_count and gpu_model must be given together")
    gpu_memory_gib = _optional_number_field(entry, "gpu_memory_gib", where)
    return Profile(
        name=name,
        vcpus=_int_field(entry, "vcpus", where, minimum=1),
        memory_bytes=round(_number_field(entry, "memory_gib", where) * GIB),
        gpu_count=gpu_count,
        gpu_model=gpu_model,
        gpu_memory_bytes=None if gpu_memory_gib is None else round(gpu_memory_gib * GIB),
        description=_str_field(entry, "description", where),
    )


def _int_field(
    entry: Mapping[str, Any], field: str, where: str, *, minimum: int, default: int | None = None
) -> int:
    value = entry.get(field, default)
    # bool is an int in Python; `"vcpus": true` is a typo, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProfileError(f"{where}: {field} must be an integer, got {value!r}")
    if value < minimum:
        raise ProfileError(f"{where}: {field} must be at least {minimum}, got {value}")
    return value


def _number_field(entry: Mapping[str, Any], field: str, where: str) -> float:
    value = entry.get(field)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProfileError(f"{where}: {field} must be a number, got {value!r}")
    if value <= 0:
        raise ProfileError(f"{where}: {field} must be positive, got {value}")
    return float(value)


def _optional_number_field(entry: Mapping[str, Any], field: str, where: str) -> float | None:
    if entry.get(field) is None:
        return None
    return _number_field(entry, field, where)


def _gpu_model_field(entry: Mapping[str, Any], where: str) -> str | None:
    value = entry.get("gpu_model")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(f"{where}: gpu_model must be a non-empty string, got {value!r}")
    # Accept 'T4' or 'NVIDIA T4' too; matching is by slug.
    return gpu_model_slug(value)


def _str_field(entry: Mapping[str, Any], field: str, where: str) -> str:
    value = entry.get(field, "")
    if not isinstance(value, str):
        raise ProfileError(f"{where}: {field} must be a string, got {value!r}")
    return value


def resolve_profile(name: str, catalog: Mapping[str, Profile], fp: Fingerprint) -> Profile:
    """The profile for ``--hardware NAME``; 'auto' describes this machine."""
    if name == AUTO_PROFILE:
        return Profile.from_fingerprint(fp)
    try:
        return catalog[name]
    except KeyError:
        known = ", ".join(sorted(catalog))
        raise ProfileError(
            f"unknown hardware profile {name!r}; known profiles: {known}; "
            f"or use 'auto' to detect this machine"
        ) from None


def profile_mismatches(
    profile: Profile, fp: Fingerprint, memory_tolerance: float = 0.15
) -> list[str]:
    """How this machine differs from ``profile``; empty means it may join the profile's study.

    RAM is compared with a relative tolerance because a cloud machine reports a
    little less than its advertised size (kernel and firmware reservations).
    """
    return [
        text
        for text in (
            _cpu_mismatch(profile, fp),
            _memory_mismatch(profile, fp, memory_tolerance),
            _gpu_mismatch(profile, fp),
        )
        if text is not None
    ]


def _cpu_mismatch(profile: Profile, fp: Fingerprint) -> str | None:
    if fp.usable_cpus == profile.vcpus:
        return None
    return f"vCPUs: profile {profile.name} has {profile.vcpus}, this machine has {fp.usable_cpus}"


def _memory_mismatch(profile: Profile, fp: Fingerprint, tolerance: float) -> str | None:
    usable = fp.usable_memory_bytes
    if abs(usable - profile.memory_bytes) <= tolerance * profile.memory_bytes:
        return None
    return (
        f"memory: profile {profile.name} has {profile.memory_bytes / GIB:.1f} GiB, "
        f"this machine has {usable / GIB:.1f} GiB (tolerance ±{tolerance:.0%})"
    )


def _gpu_mismatch(profile: Profile, fp: Fingerprint) -> str | None:
    machine = _gpu_counts(fp)
    expected = Counter({profile.gpu_model: profile.gpu_count}) if profile.gpu_count else Counter()
    if machine == expected:
        return None
    has = ", ".join(f"{machine[model]}x {model}" for model in sorted(machine)) or "no GPU"
    return f"GPUs: profile {profile.name} has {profile.gpu_summary()}, this machine has {has}"


# --------------------------------------------------------------------------- transfer


def _ratio(a: float, b: float) -> float:
    """min/max in [0, 1]; two zeros are identical."""
    if a == b:
        return 1.0
    return min(a, b) / max(a, b)


def similarity(a: Profile, b: Profile) -> float:
    """How alike two profiles are, in [0, 1], for choosing warm-start studies.

    The GPU model weighs most (it decides whether pinned memory and batch sizes
    carry over), then vCPUs (they bound num_workers), then RAM.
    """
    same_gpu = a.gpu_model == b.gpu_model
    gpu_score = _ratio(a.gpu_count, b.gpu_count) if same_gpu else 0.0
    return (
        0.5 * gpu_score
        + 0.3 * _ratio(a.vcpus, b.vcpus)
        + 0.2 * _ratio(a.memory_bytes, b.memory_bytes)
    )


def scale_workers(num_workers: int, from_vcpus: int, to_vcpus: int) -> int:
    """num_workers tuned on ``from_vcpus`` CPUs, scaled to ``to_vcpus`` CPUs.

    Capped at twice the CPUs: beyond that workers only add memory and contention.
    """
    if from_vcpus < 1 or to_vcpus < 1:
        raise ValueError(f"vCPU counts must be positive, got {from_vcpus} and {to_vcpus}")
    # Round half up, not to even, so 1.5 workers -> 2 regardless of parity.
    scaled = math.floor(num_workers * to_vcpus / from_vcpus + 0.5)
    return max(0, min(scaled, 2 * to_vcpus))
