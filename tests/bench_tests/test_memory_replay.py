"""bench.memory_replay on a study written as bench.guard_precision writes its folder."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from bench.memory_replay import main, replay_folder
from tuner.search._settings import LoaderSettings

MiB = 2**20
LIMIT = 1000 * MiB


def hand_peak_bytes(settings: LoaderSettings) -> int:
    """A workload whose process tree holds 200 MiB, 20 MiB per worker and 0.5 MiB per sample of
    each batch in the step or prefetched (no pinning, persistent workers): written out by hand,
    not with the tuner's model, so the replay's fit is checked against a known truth."""
    batches = 1 + settings.num_workers * (settings.prefetch_factor or 0)
    return round((200 + 20 * settings.num_workers + 0.5 * settings.batch * batches) * MiB)


def setting(workers: int, batch: int, prefetch: int = 2) -> LoaderSettings:
    return LoaderSettings(
        batch=batch,
        num_workers=workers,
        prefetch_factor=prefetch if workers else None,
        persistent_workers=workers > 0,
    )


def write_folder(folder: Path, trials: list[tuple[LoaderSettings, TrialState]]) -> None:
    storage = f"sqlite:///{folder / f'image-{LIMIT}.db'}"
    study = optuna.create_study(study_name=f"precision-image-{LIMIT}", storage=storage)
    peaks = []
    for settings, state in trials:
        peak = hand_peak_bytes(settings)
        peaks.append({"settings": settings.to_attrs(), "peak_bytes": peak})
        attrs = {"settings": settings.to_attrs()}
        if state == TrialState.COMPLETE:
            attrs["peak_host_memory_bytes"] = peak
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=100.0 if state == TrialState.COMPLETE else None,
                params={"num_workers": settings.num_workers},
                distributions={"num_workers": IntDistribution(0, 8)},
                user_attrs=attrs,
            )
        )
    results = {"machine": {}, "image": {"limits": [LIMIT], "peaks": peaks}}
    (folder / "results.json").write_text(json.dumps(results))


def test_a_setting_over_the_limit_after_enough_measured_ones_is_caught(tmp_path: Path) -> None:
    measured = [setting(0, 16), setting(1, 32), setting(2, 16, 4), setting(1, 64, 4)]
    measured.append(setting(0, 64))
    over = setting(4, 512)  # before any queue: 200 + 80 + 512 * 5 * 0.5 MiB = 1560 MiB
    early = setting(4, 1024)  # over too, but before the model has five settings to fit
    write_folder(
        tmp_path,
        [(early, TrialState.PRUNED)]
        + [(s, TrialState.COMPLETE) for s in measured]
        + [(over, TrialState.PRUNED)],
    )

    counts, errors = replay_folder(tmp_path)

    assert counts == {"caught": 1, "left_to_guard": 1}
    assert errors and max(errors) < 1e-6  # the fit recovers the hand-written workload
    assert main([str(tmp_path)]) == 0
