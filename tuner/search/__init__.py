"""The search: which settings a trial may try, and which it tries first.

One setting (:class:`LoaderSettings`, ``_settings``), the space Optuna samples it from
(:class:`SearchSpace`, ``_space``), the two baselines every study measures first
(``_baselines``), the early-stopping rule for throughput trials (``_pruner``), and the model of
a setting's host memory that the memory wall consults (``_memory_model``). Nothing here runs a
trial or touches the machine.
"""

from __future__ import annotations

from tuner.search._baselines import (
    baseline_settings,
    enqueue_baselines,
    enqueue_settings,
    rule_of_thumb_workers,
)
from tuner.search._memory_model import (
    OVER_LIMIT_FRACTION,
    MemoryFigures,
    fit_memory_figures,
    predicted_peak_bytes,
    prior_figures,
)
from tuner.search._pruner import BelowBestPruner
from tuner.search._settings import LoaderSettings
from tuner.search._space import (
    MAX_PREFETCH_FACTOR,
    MAX_WORKERS,
    SearchSpace,
    SpaceError,
    optuna_params,
)

__all__ = [
    "MAX_PREFETCH_FACTOR",
    "MAX_WORKERS",
    "OVER_LIMIT_FRACTION",
    "BelowBestPruner",
    "LoaderSettings",
    "MemoryFigures",
    "SearchSpace",
    "SpaceError",
    "baseline_settings",
    "enqueue_baselines",
    "enqueue_settings",
    "fit_memory_figures",
    "optuna_params",
    "predicted_peak_bytes",
    "prior_figures",
    "rule_of_thumb_workers",
]
