"""The machine: what this host has and how full it is.

Readers only, no policy: the hardware fingerprint and the profile catalog (``_hardware``), host
memory, swap, /dev/shm, cgroup and PSI readings (``_memory``), and GPU memory through NVML
behind :class:`GpuReader` (``_gpu``). Each reading is a small function that returns a number or
``None`` where this kernel or container does not offer it.
"""

from __future__ import annotations

from tuner.machine._gpu import GpuReader, NoGpuReader, NvmlGpuReader, open_gpu_reader
from tuner.machine._hardware import (
    AUTO_PROFILE,
    Fingerprint,
    Profile,
    ProfileError,
    auto_profile_name,
    detect_fingerprint,
    load_catalog,
    profile_mismatches,
    resolve_profile,
)

__all__ = [
    "AUTO_PROFILE",
    "Fingerprint",
    "GpuReader",
    "NoGpuReader",
    "NvmlGpuReader",
    "Profile",
    "ProfileError",
    "auto_profile_name",
    "detect_fingerprint",
    "load_catalog",
    "open_gpu_reader",
    "profile_mismatches",
    "resolve_profile",
]
