"""An Optuna-driven tuning service for PyTorch DataLoaders.

Run a study with ``python -m tuner.study --hardware auto``; use its result with
:func:`best_params` (DataLoader keyword arguments) or :func:`loader` (a ready DataLoader).
"""

from __future__ import annotations

__version__ = "0.1.0"

from tuner._best import NoResultError, best_params
from tuner._loader import loader

__all__ = ["NoResultError", "__version__", "best_params", "loader"]
