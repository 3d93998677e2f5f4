"""This machine's fingerprint: what it is, as far as DataLoader tuning cares.

A study is named ``<objective>@<profile>`` and shared by every machine of that profile; the
fingerprint (:class:`Fingerprint`, :func:`detect_fingerprint`) is what a machine says about itself
(CPUs it may use, memory, GPUs, torch), stored with every trial, and what ``--hardware auto``
names it by (:func:`auto_profile_name`). The CPU readers here are the one place that says how many
cores this process may use (:func:`usable_cores`, :func:`usable_cpu_count`). Everything here only
reads; the one state kept is the per-process fingerprint cache, safe to share between threads
once filled.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import re
import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.machine._cgroup import cgroup_cpu_limit, cgroup_memory

__all__ = [
    "GIB",
    "Fingerprint",
    "auto_profile_name",
    "cpu_model_name",
    "detect_fingerprint",
    "gpu_counts",
    "gpu_model_slug",
    "physical_core_count",
    "read_gpus",
    "usable_cores",
    "usable_cpu_count",
]

GIB = 2**30

_CPUINFO = Path("/proc/cpuinfo")
_GPU_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})


# --------------------------------------------------------------------------- readers


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


def usable_cores() -> list[int] | None:
    """The CPUs this process may run on (its affinity mask), or None where that is unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def usable_cpu_count() -> int:
    """How many CPUs this process may use: its affinity mask, capped by the cgroup quota."""
    cores = usable_cores()
    affinity = len(cores) if cores else os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is None:
        return affinity
    # Round a fractional quota up, as the JVM and Go runtimes do: 1.5 CPUs still run 2 threads.
    return max(1, min(affinity, math.ceil(limit)))


def physical_core_count() -> int:
    """Physical cores, or logical CPUs where psutil cannot tell."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def read_gpus() -> tuple[tuple[tuple[str, int], ...], str | None]:
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

    from tuner.machine._memory import total_memory_bytes

    cgroup = cgroup_memory()
    gpus, gpu_driver = read_gpus()
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


def gpu_counts(fp: Fingerprint) -> Counter[str]:
    return Counter(gpu_model_slug(name) for name, _ in fp.gpus)


def auto_profile_name(fp: Fingerprint) -> str:
    """Deterministic profile name for 'auto', e.g. 'local-16cpu-125g-1xh200'."""
    memory_gib = fp.usable_memory_bytes // GIB
    counts = gpu_counts(fp)
    # Sorted by model so mixed-GPU machines get one name whatever the device order.
    gpu_part = "-".join(f"{counts[model]}x{model}" for model in sorted(counts)) or "nogpu"
    return f"local-{fp.usable_cpus}cpu-{memory_gib}g-{gpu_part}"
