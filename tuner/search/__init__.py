"""The search: which settings a trial may try, and which it tries first.

One setting (:class:`LoaderSettings`, ``_settings``), the space Optuna samples it from
(:class:`SearchSpace`, ``_space``), the two baselines every study measures first
(``_baselines``), and the early-stopping rule for throughput trials (``_pruner``). Nothing here
runs a trial or touches the machine.
"""

from __future__ import annotations

from tuner.search._baselines import baseline_settings, enqueue_baselines, rule_of_thumb_workers
from tuner.search._pruner import BelowBestPruner
from tuner.search._settings import LoaderSettings
from tuner.search._space import SearchSpace, SpaceError, optuna_params

__all__ = [
    "BelowBestPruner",
    "LoaderSettings",
    "SearchSpace",
    "SpaceError",
    "baseline_settings",
    "enqueue_baselines",
    "optuna_params",
    "rule_of_thumb_workers",
]
