"""Finding the edge first: the largest batch that fits under the guard's limits.

Doubles the batch (one child, a couple of steps at each size, no workers) until the guard or an
out-of-memory error stops it, as Lightning's batch-size finder does, then bisects once between
the last size that fitted and the first that did not. The result bounds the batch-size range so
that trials are spent below the wall, not on it.
"""

from __future__ import annotations

import logging
from typing import Any

from tuner._naming import is_memory_reason
from tuner.search._settings import LoaderSettings
from tuner.trial._supervisor import Supervisor

__all__ = ["probe_max_batch"]

_log = logging.getLogger("tuner.probe")


def probe_max_batch(
    supervisor: Supervisor,
    job: dict[str, Any],
    settings: LoaderSettings,
    candidates: list[int],
    deadline_s: float,
) -> tuple[int | None, str | None]:
    """Return (largest fitting batch, the reason the next size failed or None if all fit)."""
    fitted: list[int] = []

    def on_message(message: dict[str, Any]) -> None:
        if message.get("kind") == "fits":
            fitted.append(int(message["batch"]))

    def run(batches: list[int]) -> str | None:
        outcome = supervisor.run(
            {**job, "mode": "probe", "settings": settings.to_attrs(), "batches": batches},
            deadline_s=deadline_s,
            on_message=on_message,
        )
        if outcome.state == "complete":
            return None
        if outcome.state == "pruned" and is_memory_reason(outcome.reason):
            return outcome.reason
        raise RuntimeError(outcome.error or outcome.reason or "the batch-size probe failed")

    reason = run(candidates)
    if reason is None:
        return (fitted[-1] if fitted else None), None
    if not fitted:
        return None, reason
    last_fit = fitted[-1]
    first_fail = candidates[candidates.index(last_fit) + 1]
    middle = (last_fit + first_fail) // 2
    if last_fit < middle < first_fail:
        run([middle])
    _log.info("batch-size probe: %d fits, %d does not (%s)", fitted[-1], first_fail, reason)
    return fitted[-1], reason
