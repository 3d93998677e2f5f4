"""The machine: what this host has and how full it is.

Readers only, no policy: cgroup CPU quotas and memory limits, v1 and v2 (``_cgroup``); the
hardware fingerprint and the CPU readers (``_fingerprint``); the profile catalog and how a
machine matches a profile (``_profiles``); host memory, swap, /dev/shm, PSI and process-tree
readings (``_memory``); GPU memory through NVML behind :class:`GpuReader` (``_gpu``). Each
reading is a small function that returns a number or ``None`` where this kernel or container
does not offer it.
"""

from __future__ import annotations

from tuner.machine._cgroup import CgroupMemory, cgroup_cpu_limit, cgroup_memory
from tuner.machine._cpu_load import CpuLoad, CpuShares
from tuner.machine._fingerprint import (
    Fingerprint,
    auto_profile_name,
    cpu_model_name,
    detect_fingerprint,
    physical_core_count,
    usable_cores,
    usable_cpu_count,
)
from tuner.machine._gpu import (
    GpuDevice,
    GpuMappingError,
    GpuReader,
    GpuReading,
    NoGpuReader,
    NvmlGpuReader,
    gpu_memory_used_bytes,
    nvml_index_of,
    open_gpu_reader,
    visible_nvml_indices,
)
from tuner.machine._memory import (
    HostMemoryFiles,
    available_memory_bytes,
    format_bytes,
    parse_size,
    shm_usage,
    swap_used_bytes,
    total_memory_bytes,
)
from tuner.machine._process import (
    ProcessTree,
    own_peak_memory_bytes,
    process_tree,
    process_tree_memory_bytes,
)
from tuner.machine._profiles import (
    AUTO_PROFILE,
    Profile,
    ProfileError,
    load_catalog,
    matching_profile,
    profile_mismatches,
    resolve_profile,
    scale_workers,
    similarity,
)

__all__ = [
    "AUTO_PROFILE",
    "CgroupMemory",
    "CpuLoad",
    "CpuShares",
    "Fingerprint",
    "GpuDevice",
    "GpuMappingError",
    "GpuReader",
    "GpuReading",
    "HostMemoryFiles",
    "NoGpuReader",
    "NvmlGpuReader",
    "ProcessTree",
    "Profile",
    "ProfileError",
    "auto_profile_name",
    "available_memory_bytes",
    "cgroup_cpu_limit",
    "cgroup_memory",
    "cpu_model_name",
    "detect_fingerprint",
    "format_bytes",
    "gpu_memory_used_bytes",
    "load_catalog",
    "matching_profile",
    "nvml_index_of",
    "open_gpu_reader",
    "own_peak_memory_bytes",
    "parse_size",
    "physical_core_count",
    "process_tree",
    "process_tree_memory_bytes",
    "profile_mismatches",
    "resolve_profile",
    "scale_workers",
    "shm_usage",
    "similarity",
    "swap_used_bytes",
    "total_memory_bytes",
    "usable_cores",
    "usable_cpu_count",
    "visible_nvml_indices",
]
