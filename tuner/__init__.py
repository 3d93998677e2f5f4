"""An Optuna-driven tuning service for PyTorch DataLoaders.

Run a study with ``dataloader-tuner study --hardware auto`` or, from Python, :func:`tune` (the
same run); use its result with :func:`best_setting` (the whole setting: DataLoader arguments,
threads, knobs, figures), :func:`best_params` (DataLoader keyword arguments only) or
:func:`loader` (a ready DataLoader with the whole setting applied)::

    import tuner

    best = tuner.tune(objective="mypkg.data:workload", n_trials=20)
    loader = tuner.loader(dataset, objective="mypkg.data:workload", shuffle=True)

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
    from tuner._loader import AdaptiveLoader, loader
    from tuner._signals import Terminated
    from tuner._tune import tune
    from tuner.insight import BestSetting, NoResultError, best_params, best_setting

_PUBLIC = {
    "AdaptiveLoader": "tuner._loader",
    "BestSetting": "tuner.insight",
    "NoResultError": "tuner.insight",
    "Terminated": "tuner._signals",
    "best_params": "tuner.insight",
    "best_setting": "tuner.insight",
    "loader": "tuner._loader",
    "tune": "tuner._tune",
}

__all__ = [
    "AdaptiveLoader",
    "BestSetting",
    "NoResultError",
    "Terminated",
    "__version__",
    "best_params",
    "best_setting",
    "loader",
    "tune",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
