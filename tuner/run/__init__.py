"""A tuning run, as the README lists its steps: prepare, create or resume, probe, ceiling,
baselines, trials, re-measurement, summary.

:func:`prepare` (``_config``) checks a :class:`StudyConfig` before anything is written;
:func:`run_study` (``_study``) orchestrates; :func:`trial_tools` and :func:`make_runner`
(``_tools``) are the one factory for the guard, supervisor, jobs and :class:`TrialRunner`
(``_runner``: one Optuna trial as a supervised child, after asking the memory wall
(``_walls``) whether the setting need run at all); the probe (``_probe``) and the ceiling
(``_ceiling``) are measured once per study (``_once``); ``_pipeline`` holds the pipeline
model's steps; ``_samplers`` names the strategies; ``_remeasure`` re-measures the top
candidates side by side.
"""

from __future__ import annotations

from tuner.run._config import (
    ConfigError,
    PreparedStudy,
    StudyConfig,
    prepare,
    resolve_nproc_per_node,
)
from tuner.run._runner import SearchSpaceChanged, TrialRunner
from tuner.run._samplers import N_STARTUP_TRIALS, SAMPLERS, make_pruner, make_sampler
from tuner.run._study import StudyResult, no_result_message, run_study
from tuner.run._tools import TrialTools, make_job, make_runner, trial_tools

__all__ = [
    "N_STARTUP_TRIALS",
    "SAMPLERS",
    "ConfigError",
    "PreparedStudy",
    "SearchSpaceChanged",
    "StudyConfig",
    "StudyResult",
    "TrialRunner",
    "TrialTools",
    "make_job",
    "make_pruner",
    "make_runner",
    "make_sampler",
    "no_result_message",
    "prepare",
    "resolve_nproc_per_node",
    "run_study",
    "trial_tools",
]
