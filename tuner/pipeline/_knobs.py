"""The loader's own knobs: which of them can change a setting's rate here, and the trials that
settle each one.

The model strategy proposes ``prefetch_factor=2``, persistent workers and, on CUDA, pinned
memory (:func:`~tuner.pipeline._model.candidate_setting`); none of them moves the model's
steady rate, but each can move what a training loop gets, and the profile says where. For the
setting in question (``w`` workers, at its measured rate per rank):

* ``persistent_workers``: without it each epoch starts its workers again, ``w x
  worker_start_s`` of the main process's time before the first batch. It can change the result
  where that is a material share of an epoch: short epochs, many workers, a slow start.
* ``pin_memory`` (CUDA only): a pinned batch copies to the device faster and without holding
  the step, and costs a host copy in the pinning thread; either way it moves the rate by at
  most the copy's share of each sample's time, ``transfer_s x rate``.
* ``prefetch_factor``: the loader asks for batch ``i`` as batch ``i - w x p`` is handed over,
  so batch ``i`` has ``w x p x interval`` (``interval`` the loop's time per batch) to arrive,
  of which its fetch takes ``F`` on average: a batch slower than the mean by more than the
  slack ``w x p x interval - F`` stalls the loop, however many others wait ready. Where the
  profile's slowest batch (``fetch_burst_s``, an excess taken as additive: a stall, not a
  slower sample) exceeds the slack at the default ``p``, the smallest ``p`` whose slack covers
  it is worth a trial.

A knob that cannot move the rate by :data:`MATERIAL_SHARE` cannot change which of two settings
a trial measures faster, so it keeps its default. Pure functions of the profile, the space and
the measurements, as the rest of the strategy (:mod:`tuner.pipeline._refine`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from tuner.pipeline._model import _costs, _samples, predict
from tuner.pipeline._profile import PipelineProfile
from tuner.search import MAX_PREFETCH_FACTOR, LoaderSettings, SearchSpace

__all__ = [
    "LOADER_KNOBS",
    "MATERIAL_SHARE",
    "KnobVerdict",
    "kept_defaults",
    "knob_steps",
    "knob_verdicts",
    "untried_knob_steps",
]

LOADER_KNOBS = ("persistent_workers", "prefetch_factor", "pin_memory")
"""The DataLoader arguments the model proposes at a default and checks by a trial."""

MATERIAL_SHARE = 0.03
"""The share of the rate a knob must be able to move to be worth a trial: the margin
:data:`~tuner.pipeline._refine.IMPROVE_FRACTION` asks of a corrected prediction, the
repeatability floor of one window (0.6-5%); a smaller effect no trial tells from noise."""

DEFAULT_PREFETCH = 2
"""The model's ``prefetch_factor`` (PyTorch's default)."""


@dataclasses.dataclass(frozen=True)
class KnobVerdict:
    """Whether one loader knob can change a setting's rate here: ``alternative`` is the value
    worth a trial, None where the knob keeps its value; ``why`` says so in a few words."""

    name: str
    alternative: Any
    why: str

    @property
    def matters(self) -> bool:
        return self.alternative is not None


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value >= 1 else f"{value * 1000:.3g} ms"


def _rank_rate(profile: PipelineProfile, settings: LoaderSettings, samples_per_sec: float) -> float:
    """One rank's samples/s: the measured node rate over the ranks, else the model's."""
    rate = samples_per_sec if samples_per_sec > 0 else predict(profile, settings).samples_per_sec
    return max(1e-9, rate / max(1, profile.ranks))


def _persistence(profile: PipelineProfile, settings: LoaderSettings, rate: float) -> KnobVerdict:
    name, workers = "persistent_workers", settings.num_workers
    if workers == 0:
        return KnobVerdict(name, None, "no workers")
    start_s = workers * profile.worker_start_s
    epoch_s = profile.dataset_samples / max(1, profile.ranks) / rate
    if not settings.persistent_workers:
        epoch_s = max(1e-9, epoch_s - start_s)  # the measured rate paid the starts
    why = f"epochs take {_seconds(epoch_s)}, {workers} workers start in {_seconds(start_s)}"
    share = start_s / (epoch_s + start_s)
    return KnobVerdict(
        name, not settings.persistent_workers if share >= MATERIAL_SHARE else None, why
    )


def _pinning(
    profile: PipelineProfile, space: SearchSpace, settings: LoaderSettings, rate: float
) -> KnobVerdict:
    name = "pin_memory"
    if not space.cuda:
        return KnobVerdict(name, None, "CPU")
    share = profile.for_knobs(settings.knobs).transfer_s * rate
    why = f"the copy to the GPU takes {share:.0%} of each sample's time"
    return KnobVerdict(name, not settings.pin_memory if share >= MATERIAL_SHARE else None, why)


def _prefetch(profile: PipelineProfile, settings: LoaderSettings, rate: float) -> KnobVerdict:
    name, workers = "prefetch_factor", settings.num_workers
    if workers == 0:
        return KnobVerdict(name, None, "no workers")
    burst = profile.fetch_burst_s
    if burst is None:
        return KnobVerdict(name, None, "the profile holds no fetch spread")
    samples = _samples(profile, settings.batch)
    interval = samples / rate
    produce_s, _, _ = _costs(profile.for_knobs(settings.knobs))

    def slack(prefetch: int) -> float:
        return workers * prefetch * interval - samples * produce_s

    current = settings.prefetch_factor or DEFAULT_PREFETCH
    why = (
        f"the slowest batch fetch runs {_seconds(burst)} over the mean, "
        f"the queue's slack {_seconds(max(0.0, slack(current)))}"
    )
    if burst <= slack(current):
        return KnobVerdict(name, None, why)
    deeper = range(current + 1, MAX_PREFETCH_FACTOR + 1)
    alternative = next((p for p in deeper if slack(p) >= burst), MAX_PREFETCH_FACTOR)
    return KnobVerdict(name, alternative if alternative != current else None, why)


def knob_verdicts(
    profile: PipelineProfile, space: SearchSpace, settings: LoaderSettings, samples_per_sec: float
) -> list[KnobVerdict]:
    """Whether each of :data:`LOADER_KNOBS` can change ``settings``' rate (see the module
    docstring).

    Args:
        profile: the study's pipeline profile.
        space: the search space; a knob it fixes (``--fix``) keeps its value.
        settings: the setting in question, usually the best measured.
        samples_per_sec: its measured rate for the node (0 or less: the model's).

    Returns:
        One verdict per knob, in :data:`LOADER_KNOBS`' order.
    """
    rate = _rank_rate(profile, settings, samples_per_sec)
    verdicts = [
        _persistence(profile, settings, rate),
        _prefetch(profile, settings, rate),
        _pinning(profile, space, settings, rate),
    ]
    return [
        KnobVerdict(v.name, None, "fixed with --fix") if v.name in space.fixed else v
        for v in verdicts
    ]


def knob_steps(
    profile: PipelineProfile, space: SearchSpace, settings: LoaderSettings, samples_per_sec: float
) -> list[tuple[str, LoaderSettings]]:
    """``settings`` with each knob that can change its rate set to the alternative, by knob."""
    return [
        (v.name, dataclasses.replace(settings, **{v.name: v.alternative}))
        for v in knob_verdicts(profile, space, settings, samples_per_sec)
        if v.matters
    ]


def untried_knob_steps(
    profile: PipelineProfile,
    space: SearchSpace,
    measured: Sequence[tuple[LoaderSettings, float]],
    pending: Iterable[LoaderSettings] = (),
) -> list[tuple[str, LoaderSettings]]:
    """The best measured setting's :func:`knob_steps` not measured, queued or running yet."""
    if not measured:
        return []
    best, value = max(measured, key=lambda pair: pair[1])
    tried = [settings for settings, _ in measured] + list(pending)
    return [(n, s) for n, s in knob_steps(profile, space, best, value) if s not in tried]


def _default(space: SearchSpace, name: str) -> Any:
    return {
        "persistent_workers": True,
        "prefetch_factor": DEFAULT_PREFETCH,
        "pin_memory": space.cuda,
    }[name]


def kept_defaults(
    profile: PipelineProfile,
    space: SearchSpace,
    best: LoaderSettings,
    samples_per_sec: float,
    measured: Iterable[LoaderSettings],
) -> dict[str, str]:
    """The loader knobs ``best`` runs at the model's default with no trial of the alternative
    beside it, and why: the knob cannot change its rate here, or it can and its trial ran
    beside an earlier best only, or the study ended before it was measured. Fixed knobs, and
    those a setting without workers has not, are the user's or PyTorch's: they are not named.

    Args:
        profile: the study's pipeline profile.
        space: the study's search space.
        best: the study's pick.
        samples_per_sec: its measured rate for the node.
        measured: every setting the study measured.

    Returns:
        Knob name -> why it kept its default, in :data:`LOADER_KNOBS`' order.
    """
    tried = list(measured)
    steps = dict(knob_steps(profile, space, best, samples_per_sec))
    kept = {}
    for verdict in knob_verdicts(profile, space, best, samples_per_sec):
        name = verdict.name
        if name in space.fixed or getattr(best, name) != _default(space, name):
            continue
        if best.num_workers == 0 and name != "pin_memory":
            continue
        if not verdict.matters:
            kept[name] = verdict.why
        elif steps[name] not in tried:
            default = _default(space, name)
            elsewhere = any(getattr(setting, name) != default for setting in tried)
            kept[name] = f"{verdict.why}; " + (
                "tried beside an earlier best, not beside the pick"
                if elsewhere
                else "the study ended before its trial"
            )
    return kept
