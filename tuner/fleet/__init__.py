"""The fleet: many machines of one profile contributing to one study.

The running trial's heartbeat, so another worker can fail and retry it (``_heartbeat``); the
warm start of a new profile's study from similar stored profiles (``_warm_start``); and what a
storage holds per profile (``_profile_studies``). The database lock and retries live in
:mod:`storage`.
"""

from __future__ import annotations

from tuner.fleet._heartbeat import StaleTrials, heartbeat
from tuner.fleet._profile_studies import StoredStudy, stored_studies
from tuner.fleet._warm_start import enqueue_warm_start

__all__ = [
    "StaleTrials",
    "StoredStudy",
    "enqueue_warm_start",
    "heartbeat",
    "stored_studies",
]
