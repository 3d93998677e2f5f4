"""The pipeline: what each stage of this workload's loader costs here, and what follows from it.

The profile (``_profile``: per-sample fetch wall and CPU time in a worker, collate, IPC,
transfer, the step per batch size, worker memory, usable cores) is measured once per study in a
trial child (:mod:`tuner.trial._pipeline`) and stored as a study attr; the model (``_model``:
producers and a consumer over shared cores) predicts any setting's samples/sec, the best
setting, the worker range and the bound, the most this machine can deliver; the strategy
(``_refine``, ``_knobs``) picks the next setting to measure, the loader's own knobs included
where the profile says they can change the result. Sits beside the search: it imports only
``tuner.search``.
"""

from __future__ import annotations

from tuner.pipeline._knobs import (
    LOADER_KNOBS,
    KnobVerdict,
    kept_defaults,
    knob_verdicts,
    untried_knob_steps,
)
from tuner.pipeline._model import (
    HARD_MAX_WORKERS,
    PipelineModel,
    Prediction,
    candidate_setting,
    cores_demanded,
    memory_max_workers,
    model_attrs,
    model_seeds,
    predict,
    predicted_best,
    worker_range,
    workers_needed,
)
from tuner.pipeline._profile import (
    KNOB_COST_FIELDS,
    PROFILE_ATTR,
    STEP_TIME_RATIO,
    PipelineProfile,
    knob_key,
    store_profile,
    stored_profile,
)
from tuner.pipeline._refine import (
    Proposal,
    nearest_ratio,
    next_setting,
    setting_key,
    worker_steps,
)

__all__ = [
    "HARD_MAX_WORKERS",
    "KNOB_COST_FIELDS",
    "LOADER_KNOBS",
    "PROFILE_ATTR",
    "STEP_TIME_RATIO",
    "KnobVerdict",
    "PipelineModel",
    "PipelineProfile",
    "Prediction",
    "Proposal",
    "candidate_setting",
    "cores_demanded",
    "kept_defaults",
    "knob_key",
    "knob_verdicts",
    "memory_max_workers",
    "model_attrs",
    "model_seeds",
    "nearest_ratio",
    "next_setting",
    "predict",
    "predicted_best",
    "setting_key",
    "store_profile",
    "stored_profile",
    "untried_knob_steps",
    "worker_range",
    "worker_steps",
    "workers_needed",
]
