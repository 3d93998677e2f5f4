"""One trial's processes: a supervised child that measures a setting, and the guard around it.

The supervisor (``_supervisor``) forks each trial child from a forkserver and owns its process
group; the child (``_child``) builds the DataLoader and runs the measurement loop (``_measure``)
or the ceiling (``_ceiling``), in N rank processes where a job asks (``_ranks``); the memory
guard (``_guard``) and the telemetry sampler (``_telemetry``) read the machine from the study
process while it runs; ``_outcome`` classifies how it ended; ``_artifacts`` stores its CSVs. The
child imports nothing above this package.
"""

from __future__ import annotations

from tuner.trial._guard import Breach, GuardLimits, GuardReading, MemoryGuard, default_limits
from tuner.trial._outcome import TrialOutcome
from tuner.trial._ranks import RANK_ATTRS, shard_error
from tuner.trial._supervisor import Supervisor, kill_tree

__all__ = [
    "RANK_ATTRS",
    "Breach",
    "GuardLimits",
    "GuardReading",
    "MemoryGuard",
    "Supervisor",
    "TrialOutcome",
    "default_limits",
    "kill_tree",
    "shard_error",
]
