"""Warm start: a new profile's study first tries what won on the most similar profiles.

Settings are taken from the same workload's studies on other profiles, scaled to this profile's
CPU count (workers) and bounded by this study's batch choices, and queued right after the
baselines with the user attr ``warm_start_from`` naming the study they came from.
"""

from __future__ import annotations

import dataclasses
import logging

import optuna

from tuner._naming import objective_label
from tuner.fleet._profile_studies import stored_studies
from tuner.machine import Profile, scale_workers, similarity
from tuner.search import LoaderSettings, SearchSpace, enqueue_settings

__all__ = ["enqueue_warm_start"]

_log = logging.getLogger("tuner")

WARM_START_PROFILES = 2


def _adapted(
    settings: LoaderSettings, source: Profile, target: Profile, space: SearchSpace
) -> LoaderSettings:
    workers = min(
        space.max_workers, scale_workers(settings.num_workers, source.vcpus, target.vcpus)
    )
    threads = max(1, min(space.max_threads, settings.torch_num_threads))
    knobs = {k: v for k, v in settings.knobs.items() if k in space.workload.knobs}
    knobs = {**space.workload.default_knobs, **knobs}
    adapted = space.settings(
        workers,
        space.clamp_batch(settings.batch),
        (settings.prefetch_factor or 2) if workers else None,
        settings.persistent_workers if workers else False,
        settings.pin_memory and space.cuda,
        threads,
        knobs,
    )
    return space.with_fixed(adapted)  # --fix binds a warm start as it binds every trial


def enqueue_warm_start(
    study: optuna.Study, objective: str, profile: Profile, space: SearchSpace
) -> list[str]:
    """Queue the best settings of the most similar profiles; the caller holds the study lock.

    Only for a study with no trials beyond its baselines. Returns the source study names.
    """
    if any(t.user_attrs.get("warm_start_from") for t in study.get_trials(deepcopy=False)):
        return []
    label = objective_label(objective)
    candidates = [
        stored
        for stored in stored_studies(study._storage)
        if stored.name != study.study_name
        and objective_label(stored.objective) == label
        and stored.profile is not None
        and stored.best_settings is not None
    ]
    candidates.sort(key=lambda s: similarity(profile, s.profile), reverse=True)  # type: ignore[arg-type]
    sources = []
    seen: list[LoaderSettings] = []
    for stored in candidates[:WARM_START_PROFILES]:
        assert stored.profile is not None and stored.best_settings is not None
        settings = _adapted(
            LoaderSettings.from_attrs(stored.best_settings), stored.profile, profile, space
        )
        settings = dataclasses.replace(settings)
        if settings in seen:
            continue
        seen.append(settings)
        enqueue_settings(study, space, settings, warm_start_from=stored.name)
        sources.append(stored.name)
    if sources:
        _log.info("warm start from %s", ", ".join(sources))
    return sources
