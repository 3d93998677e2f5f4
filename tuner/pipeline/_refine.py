"""The model strategy's next setting: the model corrected by what was measured, then the best's
neighbours; none once the best measured has held against all of them.

The model gets the shape of a pipeline right (where more workers stop paying, which stage
binds) and its level wrong by a factor that moves across the space: co-tenants' load, the cost
of scheduling dozens of processes (on the loaded 2-core machine it predicted 1.3-2.4x what 32-64
workers delivered, within 4-9% up to 16). So every prediction is scaled by the ratio measured /
predicted of the nearest measured setting, and the search measures:

1. the candidate whose corrected prediction beats the best measured by :data:`IMPROVE_FRACTION`
   (the model still expects more somewhere: go and see; each measurement corrects the model
   around it);
2. else the best measured setting's untried neighbours: one step along the worker ladder each
   way (always measured: the model's error grows with the worker count, so it cannot rule
   these out), then the best with each loader knob the profile says can change its rate set
   the other way (``why`` ``knob:<name>``, :mod:`tuner.pipeline._knobs`), then, in order of
   corrected prediction, the batch value each side, the other thread count, each other value
   of each workload knob; of these last, those the corrected model puts below
   :data:`NEIGHBOUR_FRACTION` of the best are ruled out unmeasured;
3. else nothing: the best is a confirmed local optimum, and the study may stop.

Candidates are :func:`~tuner.pipeline._model.candidate_setting`'s. Pure functions
of the profile, the space and the measurements, so a fleet's workers agree on the next step.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence

from tuner.pipeline._knobs import untried_knob_steps
from tuner.pipeline._model import (
    SettingKey,
    _fixed_or,
    _thread_choices,
    candidate_setting,
    predict,
    setting_key,
    worker_ladder,
)
from tuner.pipeline._profile import PipelineProfile
from tuner.search import LoaderSettings, SearchSpace

__all__ = [
    "IMPROVE_FRACTION",
    "Proposal",
    "corrected_prediction",
    "nearest_ratio",
    "next_setting",
    "setting_key",
    "worker_ladder",
    "worker_steps",
]

IMPROVE_FRACTION = 1.03
"""A corrected prediction must beat the best measured by 3% to be worth a trial of its own:
less is within one window's noise on this machine (the repeatability floor was 0.6-5%)."""

NEIGHBOUR_FRACTION = 0.9
"""A neighbour whose corrected prediction is below this share of the best measured is left
unmeasured: the model rules it out (an oversubscribed step, workers the epoch cannot use)."""

CORRECTION_RANGE = (0.2, 5.0)
"""A measured/predicted ratio outside this says a trial went wrong, not that the model did."""


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A setting to measure next and why: ``corrected`` (the corrected model expects more),
    ``neighbour`` (a neighbour of the best measured, not yet tried) or ``knob:<name>`` (the
    best measured with that loader knob set the other way)."""

    settings: LoaderSettings
    why: str
    corrected_samples_per_sec: float


def _distance(a: LoaderSettings, b: LoaderSettings) -> float:
    """Steps apart: along log2 of the workers (+1) and of the batch, one for threads, knobs."""
    return (
        abs(math.log2(a.num_workers + 1) - math.log2(b.num_workers + 1))
        + abs(math.log2(max(1, a.batch)) - math.log2(max(1, b.batch)))
        + (a.torch_num_threads != b.torch_num_threads)
        + (dict(a.knobs) != dict(b.knobs))
    )


def _ratios(
    profile: PipelineProfile, measured: Sequence[tuple[LoaderSettings, float]]
) -> list[tuple[LoaderSettings, float]]:
    low, high = CORRECTION_RANGE
    result = []
    for settings, value in measured:
        predicted = predict(profile, settings).samples_per_sec
        if predicted > 0 and value > 0:
            result.append((settings, min(high, max(low, value / predicted))))
    return result


def corrected_prediction(
    profile: PipelineProfile,
    settings: LoaderSettings,
    ratios: Sequence[tuple[LoaderSettings, float]],
) -> float:
    """The model's samples/sec for ``settings`` times measured/predicted at the nearest
    measured setting(s) (the median of those equally near); the model alone without any."""
    return predict(profile, settings).samples_per_sec * nearest_ratio(settings, ratios)


def nearest_ratio(
    settings: LoaderSettings, ratios: Sequence[tuple[LoaderSettings, float]]
) -> float:
    """Measured/predicted at the measured setting(s) nearest ``settings`` (the median of those
    equally near); 1.0 without any: how a model's prediction is corrected by measurements."""
    if not ratios:
        return 1.0
    distances = [(_distance(settings, other), ratio) for other, ratio in ratios]
    nearest = min(distance for distance, _ in distances)
    return statistics.median(r for d, r in distances if d <= nearest + 1e-9)


def _grid(space: SearchSpace) -> list[LoaderSettings]:
    """Every ladder worker count, batch value and thread count (1 or all) with each knob set."""
    workers = _fixed_or(space, "num_workers", worker_ladder(space.max_workers))
    batches = _fixed_or(space, space.batch_param, space.batch_choices())
    return [
        candidate_setting(space, w, b, t, knobs)
        for knobs in space.knob_sets()
        for w in workers
        for b in batches
        for t in _thread_choices(space)
    ]


def worker_steps(space: SearchSpace, best: LoaderSettings) -> list[LoaderSettings]:
    """One step from ``best`` along the worker ladder, each way: what must be measured before
    ``best`` can count as the top (the model's level is least sure along the workers)."""
    if "num_workers" in space.fixed:
        return []
    w, b, t, knobs = best.num_workers, best.batch, best.torch_num_threads, dict(best.knobs)
    ladder = worker_ladder(space.max_workers)
    below = [value for value in ladder if value < w]
    above = [value for value in ladder if value > w]
    return [candidate_setting(space, v, b, t, knobs) for v in (below[-1:] + above[:1])]


def _other_neighbours(space: SearchSpace, best: LoaderSettings) -> list[LoaderSettings]:
    """One step from ``best`` in batch, threads and each knob (see the module docstring)."""
    w, b, t, knobs = best.num_workers, best.batch, best.torch_num_threads, dict(best.knobs)
    result = []
    if space.batch_param not in space.fixed:
        batches = space.batch_choices()
        lower = [value for value in batches if value < b]
        higher = [value for value in batches if value > b]
        result += [candidate_setting(space, w, v, t, knobs) for v in (lower[-1:] + higher[:1])]
    result += [candidate_setting(space, w, b, v, knobs) for v in _thread_choices(space) if v != t]
    for knob, choices in space.workload.knobs.items():
        if knob not in space.fixed:
            for choice in choices:
                if choice != knobs.get(knob):
                    result.append(candidate_setting(space, w, b, t, {**knobs, knob: choice}))
    return result


def next_setting(
    profile: PipelineProfile,
    space: SearchSpace,
    measured: Sequence[tuple[LoaderSettings, float]],
    pending: Iterable[LoaderSettings] = (),
) -> Proposal | None:
    """The next setting to measure (see the module docstring), or None: the best measured held
    against every neighbour. ``pending`` are queued or running elsewhere in a fleet: not
    proposed again."""
    if not measured:
        return None
    pending = list(pending)
    tried = {setting_key(s) for s, _ in measured} | {setting_key(s) for s in pending}
    best, best_value = max(measured, key=lambda pair: pair[1])
    ratios = _ratios(profile, measured)

    def scored(candidates: Iterable[LoaderSettings]) -> list[tuple[float, LoaderSettings]]:
        fresh: dict[SettingKey, LoaderSettings] = {}
        for candidate in candidates:
            fresh.setdefault(setting_key(candidate), candidate)
        rated = [
            (corrected_prediction(profile, c, ratios), c)
            for key, c in fresh.items()
            if key not in tried
        ]
        # Ties go to the cheaper setting: fewer workers, then the smaller batch.
        return sorted(rated, key=lambda pair: (-pair[0], pair[1].memory_footprint()))

    top = scored(_grid(space))
    if top and top[0][0] > IMPROVE_FRACTION * best_value:
        return Proposal(top[0][1], "corrected", top[0][0])
    steps = scored(worker_steps(space, best))
    if steps:
        return Proposal(steps[0][1], "neighbour", steps[0][0])
    knob_trials = untried_knob_steps(profile, space, measured, pending)
    if knob_trials:
        knob, settings = knob_trials[0]
        return Proposal(settings, f"knob:{knob}", corrected_prediction(profile, settings, ratios))
    near = [
        pair
        for pair in scored(_other_neighbours(space, best))
        if pair[0] >= NEIGHBOUR_FRACTION * best_value
    ]
    if near:
        return Proposal(near[0][1], "neighbour", near[0][0])
    return None
