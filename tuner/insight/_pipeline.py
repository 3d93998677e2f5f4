"""The pipeline as users read it: the profile in one line, the bound, where the model errs, and
the loader knobs the model's pick left at their defaults.

Shared by the terminal summary, the dashboard note and the HTML report, so all three say the
same. Reads only stored attrs: the study's ``pipeline_profile``, ``bound_samples_per_sec`` and
``loader_defaults_kept``, each trial's ``predicted_samples_per_sec``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner._attrs import loader_defaults_kept
from tuner._naming import BOUND_ATTR
from tuner.pipeline import PipelineProfile, stored_profile

__all__ = ["bound_of", "kept_defaults_line", "model_error", "profile_line", "stored_profile"]


def bound_of(user_attrs: Mapping[str, Any]) -> float | None:
    """The study's bound (samples/s), or None when it has no pipeline model."""
    value = user_attrs.get(BOUND_ATTR)
    return float(value) if value else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms"


def profile_line(profile: PipelineProfile) -> str:
    """The profile in one line: what a sample, a batch and a step cost here."""
    step_threads = max(profile.step_rates, key=lambda t: max(profile.step_rates[t].values()))
    row = profile.step_rates[step_threads]
    at = profile.profiled_batch if profile.profiled_batch in row else max(row, key=row.get)
    return (
        f"fetch {_ms(profile.fetch_wall_s)} per sample in a worker "
        f"({_ms(profile.fetch_cpu_s)} CPU, {profile.io_wait_share:.0%} waiting on I/O), "
        f"collate {_ms(profile.collate_s)}, IPC {_ms(profile.ipc_dump_s + profile.ipc_load_s)}, "
        f"transfer {_ms(profile.transfer_s)} per sample; "
        f"a worker holds {profile.worker_uss_bytes / 2**20:,.0f} MiB of its own (USS); "
        f"{profile.usable_cores:g} usable cores; the step alone "
        f"{row[at]:,.0f} samples/s at batch {at} ({step_threads} thread"
        f"{'s' if step_threads > 1 else ''})"
    )


def model_error(trials: Iterable[FrozenTrial]) -> tuple[float, int] | None:
    """Median absolute relative error of the model's predictions over the completed trials
    (repeats left out), and how many; None when no trial has a prediction."""
    errors = [
        abs(float(t.user_attrs["predicted_samples_per_sec"]) - float(t.value)) / float(t.value)
        for t in trials
        if t.state == TrialState.COMPLETE
        and t.value
        and "repeat_of" not in t.user_attrs
        and "predicted_samples_per_sec" in t.user_attrs
    ]
    return (statistics.median(errors), len(errors)) if errors else None


def kept_defaults_line(user_attrs: Mapping[str, Any]) -> str | None:
    """``left at defaults: persistent_workers (epochs take 40 s, ...), pin_memory (CPU)``: the
    loader knobs the model's pick runs at their defaults untried, and why; None where none."""
    kept = loader_defaults_kept(user_attrs)
    if not kept:
        return None
    return "left at defaults: " + ", ".join(f"{name} ({why})" for name, why in kept.items())
