"""Finding the edge first: the largest batch that fits under the guard's limits.

The ceiling usually finds it (:func:`tuner.run._ceiling.study_space_and_ceiling`): it steps
every batch value smallest first, the epoch's heaviest batch and the optimizer's state
included, so the largest size it climbed to is the edge (:func:`climbed_edge`). Where the guard
stopped the ceiling, the probe here finds it: it doubles the batch (one child, a couple of steps
at each size, no workers) until the guard or an out-of-memory error stops it, as Lightning's
batch-size finder does, then bisects once between the last size that fitted and the first that
did not. The result bounds the batch-size range so that trials are spent below the wall, not on
it.
"""

from __future__ import annotations

import logging
from typing import Any

import optuna

from tuner._naming import STEP_PEAK_ATTR, STEP_RATES_ATTR, is_memory_reason
from tuner.run._config import ConfigError, PreparedStudy, trial_deadline
from tuner.run._once import once_per_study
from tuner.run._tools import make_job
from tuner.trial import Fits, Job, Mode, Supervisor

__all__ = [
    "MAX_BATCH_ATTR",
    "climbed_edge",
    "probe_candidates",
    "probe_max_batch",
    "probes_batch",
    "study_max_batch",
]

MAX_BATCH_ATTR = "max_batch_size"
PEAK_OVER_LIMIT = "memory_guard: host (a peak between the guard's readings)"
"""The reason a size failed whose run the guard let through but whose peak reached the limit."""

_log = logging.getLogger("tuner.probe")
_progress = logging.getLogger("tuner.run")


class ProbeFailed(RuntimeError):
    """The probe's child failed for another reason than memory: the workload itself fails."""


def probe_max_batch(
    supervisor: Supervisor,
    job: Job,
    candidates: list[int],
    deadline_s: float,
) -> tuple[int | None, str | None]:
    """Return (largest fitting batch, the reason the next size failed or None if all fit).

    ``job`` gives the setting every batch value is tried with. A batch the guard let through
    whose peak (the kernel's high-water mark) reached the host limit does not fit: it crossed
    the limit between two of the guard's readings, and a trial would cross it again.
    """
    fitted: list[int] = []
    limit = supervisor.guard.limits.host_bytes

    def on_message(message: Fits) -> None:
        if message.peak_bytes is None or message.peak_bytes < limit:
            fitted.append(message.batch)

    def run(batches: list[int]) -> str | None:
        outcome = supervisor.run(
            job.replace(mode=Mode.PROBE, batches=tuple(batches)),
            deadline_s=deadline_s,
            on_message=on_message,
        )
        if outcome.state == "complete":
            return None
        if outcome.state == "pruned" and is_memory_reason(outcome.reason):
            return outcome.reason
        raise ProbeFailed(outcome.error or outcome.reason or "the batch-size probe failed")

    reason = run(candidates)
    if reason is None and fitted[-1:] != candidates[-1:]:
        reason = PEAK_OVER_LIMIT
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


def probes_batch(prepared: PreparedStudy) -> bool:
    """Whether this run looks for the edge (not under ``--no-probe-batch`` or a fixed batch)."""
    space = prepared.space
    return prepared.config.probe_batch and space.batch_param not in space.fixed


def probe_candidates(prepared: PreparedStudy) -> list[int]:
    """The batch values the edge is looked for among: the space's, none past the dataset."""
    space = prepared.space
    candidates = space.batch_choices()
    length = prepared.workload.dataset_length
    if space.batch_param == "batch_size" and length is not None:
        candidates = [b for b in candidates if b <= max(candidates[0], length)]
    return candidates


def climbed_edge(prepared: PreparedStudy, attrs: dict[str, Any]) -> int | None:
    """The largest of :func:`probe_candidates` the stored ceiling stepped, or None.

    Only a ceiling run over every candidate stores its rates before the edge is stored (one
    measured below a probed edge comes after it), and the sizes it did not reach either did not
    fit or, past its climb's stop, run slower per sample than a size it measured: the edge of
    a space tuned for samples/sec.
    """
    rates = attrs.get(STEP_RATES_ATTR)
    if not rates:
        return None
    stepped = {int(batch) for row in rates.values() for batch in row}
    # A size whose peak reached the limit crossed it between the guard's readings: not a fit.
    over = [
        int(batch)
        for batch, peak in attrs.get(STEP_PEAK_ATTR, {}).items()
        if peak is not None and peak >= prepared.limits.host_bytes
    ]
    if over:
        stepped = {batch for batch in stepped if batch < min(over)}
    fitting = [batch for batch in probe_candidates(prepared) if batch in stepped]
    return max(fitting) if fitting else None


def study_max_batch(
    prepared: PreparedStudy, study: optuna.Study, supervisor: Supervisor
) -> int | None:
    """The study's ``max_batch_size``: the ceiling's climb (:func:`climbed_edge`), else probed,
    once, by whichever worker gets there first.

    None when probing is off (``--no-probe-batch``, a fixed batch) and no worker stored one.
    """
    if MAX_BATCH_ATTR not in study.user_attrs and not probes_batch(prepared):
        return None

    def find() -> int | None:
        edge = climbed_edge(prepared, study.user_attrs)
        return edge if edge is not None else _probe_or_warn(prepared, supervisor)

    return once_per_study(study, prepared.config.storage, MAX_BATCH_ATTR, find)


def _probe_or_warn(prepared: PreparedStudy, supervisor: Supervisor) -> int | None:
    """The probe, or None with a warning when the workload fails in it: each trial will then
    fail with the workload's error recorded, which is where users look for it."""
    try:
        return _probe(prepared, supervisor)
    except ProbeFailed as error:
        _log.warning("batch-size probe skipped: the workload failed (%s)", error)
        return None


def _probe(prepared: PreparedStudy, supervisor: Supervisor) -> int:
    space = prepared.space
    candidates = probe_candidates(prepared)
    # Memory, not speed, is probed: one intra-op thread, which no machine makes pathological.
    job = make_job(prepared, space.main_process_settings(candidates[0], pin_memory=space.cuda))
    deadline_s = trial_deadline(prepared.config) * 2
    _progress.info(
        "probe: the largest batch that fits under the memory limits, up to %d", candidates[-1]
    )

    def probe(batches: list[int]) -> tuple[int | None, str | None]:
        if not batches:
            return None, None
        return probe_max_batch(supervisor, job, batches, deadline_s=deadline_s)

    # The largest first: on a roomy machine it fits, and one run settles the probe. Else double
    # from the batch the user trains with, as Lightning's finder does; only if even that does
    # not fit, look below it.
    largest, reason = probe(candidates[-1:])
    default = space.clamp_batch(prepared.workload.default_batch_size)
    for batches in (
        [b for b in candidates[:-1] if b >= default],
        [b for b in candidates if b < default],
    ):
        if largest is not None:
            break
        largest, next_reason = probe(batches)
        reason = next_reason or reason
    if largest is None:
        raise ConfigError(
            f"even batch {candidates[0]} does not fit under the memory limits ({reason}); "
            "raise --memory-limit/--gpu-memory-limit or use a smaller workload"
        )
    return largest
