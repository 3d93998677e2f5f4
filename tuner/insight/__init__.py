"""What users read: the best setting, why a trial was slow, and how the study went.

The best setting as a storage holds it (``_best``), the terminal summary (``_summary``), the
diagnosis of each trial (``_diagnosis``), the dashboard note (``_note``), the HTML report
(``_report``), the ``DataLoader(...)`` snippet (``_snippet``) and a plain table (``_table``).
Pure readers of stored studies: nothing here runs a trial.
"""

from __future__ import annotations

from tuner.insight._best import (
    BestSetting,
    NoResultError,
    best_params,
    best_setting,
    optuna_best,
    study_best,
    tune_command,
)
from tuner.insight._diagnosis import Diagnosis, diagnose, diagnose_trial
from tuner.insight._summary import best_trial, efficiency, print_summary

__all__ = [
    "BestSetting",
    "Diagnosis",
    "NoResultError",
    "best_params",
    "best_setting",
    "best_trial",
    "diagnose",
    "diagnose_trial",
    "efficiency",
    "optuna_best",
    "print_summary",
    "remeasured",
    "study_best",
    "tune_command",
]
