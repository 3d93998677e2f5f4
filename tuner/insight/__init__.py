"""What users read: the best setting, why a trial was slow, and how the study went.

Which trial is the best and the best setting as a storage holds it (``_best``), the terminal
summary (``_summary``), the diagnosis of each trial (``_diagnosis``), the dashboard note
(``_note``), the HTML report (``_report``), the ``DataLoader(...)`` snippet (``_snippet``) and a
plain table (``_table``). Pure readers of stored studies: nothing here runs a trial.
:func:`build_report` is imported on first use, since it imports plotly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tuner.insight._best import (
    BestSetting,
    NoResultError,
    best_params,
    best_setting,
    best_trial,
    optuna_best,
    resolve_profile_name,
    study_best,
    trial_throughput,
    tune_command,
)
from tuner.insight._diagnosis import Diagnosis, diagnose, diagnose_trial
from tuner.insight._note import save_study_note
from tuner.insight._snippet import extra_settings
from tuner.insight._summary import efficiency, print_summary
from tuner.insight._table import format_table

if TYPE_CHECKING:
    from tuner.insight._report import build_report

__all__ = [
    "BestSetting",
    "Diagnosis",
    "NoResultError",
    "best_params",
    "best_setting",
    "best_trial",
    "build_report",
    "diagnose",
    "diagnose_trial",
    "efficiency",
    "extra_settings",
    "format_table",
    "optuna_best",
    "print_summary",
    "resolve_profile_name",
    "save_study_note",
    "study_best",
    "trial_throughput",
    "tune_command",
]


def __getattr__(name: str) -> Any:
    if name == "build_report":
        return importlib.import_module("tuner.insight._report").build_report
    raise AttributeError(f"module 'tuner.insight' has no attribute {name!r}")
