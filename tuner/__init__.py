"""An Optuna-driven tuning service for PyTorch DataLoaders.

Run a study with ``python -m tuner.study --hardware auto``; use its result with
:func:`best_setting` (the whole setting: DataLoader arguments, threads, knobs, figures),
:func:`best_params` (DataLoader keyword arguments only) or :func:`loader` (a ready DataLoader
with the whole setting applied).

The subpackages show the architecture, bottom up: ``machine`` (what the host has), ``search``
(the settings and their space), ``trial`` (one supervised trial and its guard), ``insight``
(what users read), ``fleet`` (many machines, one study), ``run`` (a tuning run). The public
names below are imported on first use, so a trial child that imports ``tuner.trial`` does not
load the presentation layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tuner._loader import loader
    from tuner.insight._best import BestSetting, NoResultError, best_params, best_setting

_PUBLIC = {
    "BestSetting": "tuner.insight._best",
    "NoResultError": "tuner.insight._best",
    "best_params": "tuner.insight._best",
    "best_setting": "tuner.insight._best",
    "loader": "tuner._loader",
}

__all__ = ["BestSetting", "NoResultError", "__version__", "best_params", "best_setting", "loader"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
