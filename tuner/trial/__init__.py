"""One trial's processes: a supervised child that measures a setting, and the guard around it.

The supervisor (``_supervisor``) forks each trial child from a forkserver and owns its process
group; the child (``_child``) builds the DataLoader and runs the measurement loop (``_measure``)
or the ceiling (``_ceiling``), in N rank processes where a job asks (``_ranks``, the model
under DDP in each: ``_ddp``), and they talk
in typed messages (``_protocol``); the memory guard (``_guard``) and the telemetry sampler
(``_telemetry``) read the machine from the study process while it runs; ``_outcome`` classifies
how it ended. Its CSVs go to the artifact store in :mod:`storage`. The child imports nothing
above this package.
"""

from __future__ import annotations

from tuner.trial._guard import Breach, GuardLimits, GuardReading, MemoryGuard, default_limits
from tuner.trial._outcome import TrialOutcome
from tuner.trial._protocol import Fits, Job, Mode
from tuner.trial._ranks import RANK_ATTRS, rank_devices, shard_error
from tuner.trial._supervisor import Supervisor, kill_tree
from tuner.trial._telemetry import (
    STEPS_CSV,
    TIMELINE_ATTR,
    TelemetrySampler,
    TelemetrySummary,
    collect_trial_telemetry,
    read_timeline_csv,
)

__all__ = [
    "RANK_ATTRS",
    "STEPS_CSV",
    "TIMELINE_ATTR",
    "Breach",
    "Fits",
    "GuardLimits",
    "GuardReading",
    "Job",
    "MemoryGuard",
    "Mode",
    "Supervisor",
    "TelemetrySampler",
    "TelemetrySummary",
    "TrialOutcome",
    "collect_trial_telemetry",
    "default_limits",
    "kill_tree",
    "rank_devices",
    "read_timeline_csv",
    "shard_error",
]
