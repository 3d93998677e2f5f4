"""Workloads: what a tuning trial loads and trains on.

A workload is a dataset plus the training step that consumes it (:class:`Workload`). The
built-ins, ``image``, ``text`` and ``storage``, need only torch and Pillow; user workloads are
loaded from ``package.module:attr`` or ``path/to/file.py:attr`` by :func:`load_workload`. A
framework's workload (a Lightning DataModule and module, a Hugging Face Trainer) is built in
that framework's module of :mod:`tuner.integrations`, which also applies the tuned setting; it
uses :func:`trained_today` and :func:`widened_range` as :meth:`Workload.from_dataloader` does.
"""

from __future__ import annotations

from objectives._from_dataloader import trained_today, widened_range
from objectives._loading import BUILTIN_WORKLOADS, WorkloadError, load_workload
from objectives._workload import TrainStep, Workload, move_to_device
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
    "trained_today",
    "widened_range",
]
