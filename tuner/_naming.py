"""Names shared by every verb: study names and the recorded facts' keys."""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BASELINE_PYTORCH_DEFAULT",
    "BASELINE_RULE_OF_THUMB",
    "BOUND_ATTR",
    "CEILING_ATTR",
    "LOADER_DEFAULTS_KEPT_ATTR",
    "MEMORY_REASONS",
    "METRIC_NAME",
    "NPROC_ATTR",
    "REMEASURED_ATTR",
    "SETTINGS_ATTR",
    "SKIPPED_FOR_MEMORY_REASONS",
    "STEP_CPU_ATTR",
    "STEP_PEAK_ATTR",
    "STEP_RATES_ATTR",
    "is_memory_prune",
    "is_memory_reason",
    "is_skipped_for_memory",
    "objective_label",
    "study_name",
]

BASELINE_PYTORCH_DEFAULT = "pytorch-default"
BASELINE_RULE_OF_THUMB = "rule-of-thumb"
METRIC_NAME = "samples_per_sec"
REMEASURED_ATTR = "remeasured_samples_per_sec"
"""Study user attr: trial number (as text) -> median samples/sec re-measured side by side."""
NPROC_ATTR = "nproc_per_node"
"""Study user attr: the ranks per node its trials ran (``torchrun --nproc-per-node``)."""
SETTINGS_ATTR = "settings"
"""Trial user attr: the complete setting it measured; read and written through tuner._attrs."""
CEILING_ATTR = "ceiling_samples_per_sec"
"""Study user attr: the step alone on prepared data, the most any DataLoader setting can reach."""
BOUND_ATTR = "bound_samples_per_sec"
"""Study user attr: the pipeline model's bound, the most this machine can deliver."""
LOADER_DEFAULTS_KEPT_ATTR = "loader_defaults_kept"
"""Study user attr, under ``--sampler model``: each loader knob (``persistent_workers``,
``prefetch_factor``, ``pin_memory``) the pick runs at the model's default without a trial of
the other value, -> why (it cannot change the rate here, or the study ended first)."""
STEP_RATES_ATTR = "step_samples_per_sec"
"""Ceiling child result: threads -> batch -> the step's samples/sec (the profile keeps it)."""
STEP_CPU_ATTR = "step_cpu_s_per_sample"
"""Ceiling child result: threads -> batch -> the step's CPU seconds per sample."""
STEP_PEAK_ATTR = "step_peak_host_memory_bytes"
"""Ceiling child result: batch -> the main process's peak memory with the step, no workers."""

MEMORY_REASONS = ("memory_guard:", "cuda_oom", "host_oom", "shm_full", "trial_killed: SIGKILL")
"""Pruned reasons that mean "this setting does not fit": the wall later trials stay below."""

SKIPPED_FOR_MEMORY_REASONS = ("memory_wall", "memory_model")
"""Pruned reasons of settings not run because they would not fit: beyond a wall, or the memory
model's peak over the limit. Unconfirmed, so no wall is built from them."""


def objective_label(objective: str) -> str:
    """The objective as it appears in study names: a file path shortened to its file name."""
    module, sep, attr = objective.rpartition(":")
    if sep and module.endswith(".py"):
        return f"{Path(module).name}:{attr}"
    return objective


def study_name(objective: str, profile: str, ranks: int = 1) -> str:
    """``<objective>@<hardware profile>``: one study per workload and profile, and per rank
    count: ``<objective>@<profile>-x<N>ranks`` where ``N`` training processes share the node
    (``image@g4dn.12xlarge-x4ranks``), as each rank's best setting depends on how many share it.
    """
    name = f"{objective_label(objective)}@{profile}"
    return name if ranks == 1 else f"{name}-x{ranks}ranks"


def is_memory_reason(reason: str | None) -> bool:
    return reason is not None and reason.startswith(MEMORY_REASONS)


def is_skipped_for_memory(reason: str | None) -> bool:
    return reason in SKIPPED_FOR_MEMORY_REASONS


def is_memory_prune(reason: str | None) -> bool:
    """Pruned for memory at all: a breach or an out-of-memory death, or not run as one."""
    return is_memory_reason(reason) or is_skipped_for_memory(reason)
