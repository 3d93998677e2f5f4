"""A tuning run, as the README lists its steps: prepare, create or resume, probe, ceiling,
baselines, trials, re-measurement, summary.

:func:`run_study` (``_study``) orchestrates; :class:`TrialRunner` (``_runner``) turns one Optuna
trial into a supervised child and its result into user attrs, after asking the memory wall
(``_walls``) whether the setting need run at all; the probe (``_probe``), the ceiling's stop
rule (``_ceiling``) and the final re-measurement (``_remeasure``) are its steps.
"""

from __future__ import annotations

from tuner.run._runner import SearchSpaceChanged, TrialRunner
from tuner.run._study import (
    SAMPLERS,
    ConfigError,
    StudyConfig,
    StudyResult,
    make_pruner,
    make_sampler,
    prepare,
    run_study,
)

__all__ = [
    "SAMPLERS",
    "ConfigError",
    "SearchSpaceChanged",
    "StudyConfig",
    "StudyResult",
    "TrialRunner",
    "make_pruner",
    "make_sampler",
    "prepare",
    "run_study",
]
