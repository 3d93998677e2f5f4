"""Workloads: what a tuning trial loads and trains on.

A workload is a dataset plus the training step that consumes it (:class:`Workload`). The
built-ins, ``image``, ``text`` and ``storage``, need only torch and Pillow; user workloads are
loaded from ``package.module:attr`` or ``path/to/file.py:attr`` by :func:`load_workload`.
``objectives.lightning`` builds one from a Lightning DataModule and module (it imports
Lightning, so it is not imported here); :func:`workload_from_trainer` makes one of a Hugging
Face Trainer without importing transformers.
"""

from __future__ import annotations

from objectives._loading import BUILTIN_WORKLOADS, WorkloadError, load_workload
from objectives._workload import TrainStep, Workload, move_to_device
from objectives.huggingface import workload_from_trainer
from objectives.image import image_workload
from objectives.storage import storage_workload
from objectives.text import text_workload

__all__ = [
    "BUILTIN_WORKLOADS",
    "TrainStep",
    "Workload",
    "WorkloadError",
    "image_workload",
    "load_workload",
    "move_to_device",
    "storage_workload",
    "text_workload",
    "workload_from_trainer",
]
