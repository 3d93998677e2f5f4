"""The loader's own knobs on profiles written by hand: where each can change the result, the
trial the model strategy spends on it, and what the pick keeps at its default and why."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.tuner_tests.pipeline.test_model import _profile, _settings, _space
from tuner.pipeline import (
    PipelineProfile,
    candidate_setting,
    kept_defaults,
    knob_verdicts,
    next_setting,
    predicted_best,
    setting_key,
    stored_profile,
    untried_knob_steps,
    worker_steps,
)
from tuner.pipeline._knobs import MATERIAL_SHARE, KnobVerdict
from tuner.pipeline._refine import IMPROVE_FRACTION
from tuner.search import LoaderSettings, SearchSpace, baseline_settings

DATA = Path(__file__).parent / "data"


def _verdict(
    profile: PipelineProfile, space: SearchSpace, settings: LoaderSettings, rate: float, name: str
) -> KnobVerdict:
    return next(v for v in knob_verdicts(profile, space, settings, rate) if v.name == name)


def test_a_knob_must_move_the_rate_by_what_a_trial_can_tell() -> None:
    assert pytest.approx(IMPROVE_FRACTION - 1) == MATERIAL_SHARE


def test_persistence_matters_where_an_epoch_is_short_against_the_workers_start() -> None:
    """16 workers start in 160 ms (10 ms each) at the start of every epoch without it: 4%
    of a 4 s epoch, a trial's worth; 2.6% of a 6 s one, within a window's noise."""
    space = _space(max_workers=64)
    settings = _settings(space, 16)
    short = _verdict(
        _profile(dataset_samples=8_000), space, settings, 2_000.0, "persistent_workers"
    )
    assert short.matters and short.alternative is False
    assert short.why == "epochs take 4 s, 16 workers start in 160 ms"
    long = _verdict(
        _profile(dataset_samples=12_000), space, settings, 2_000.0, "persistent_workers"
    )
    assert not long.matters and long.why == "epochs take 6 s, 16 workers start in 160 ms"
    idle = _verdict(_profile(), space, _settings(space, 0), 2_000.0, "persistent_workers")
    assert not idle.matters and idle.why == "no workers"


def test_a_setting_without_persistence_is_judged_on_its_steady_epoch() -> None:
    """Its measured rate paid the starts: the epoch they are weighed against is without them."""
    space = _space(max_workers=64)
    settings = _settings(space, 16, persistent=False)
    rate = 8_000 / (4 + 0.16)  # a 4 s epoch and the 160 ms of starts
    verdict = _verdict(_profile(dataset_samples=8_000), space, settings, rate, "persistent_workers")
    assert verdict.alternative is True and verdict.why.startswith("epochs take 4 s")


def test_pinning_is_only_for_cuda_and_matters_where_the_copy_is_a_material_share() -> None:
    space = _space(max_workers=64)
    settings = _settings(space, 16)
    cpu = _verdict(_profile(transfer_s=0.001), space, settings, 2_000.0, "pin_memory")
    assert not cpu.matters and cpu.why == "CPU"
    cuda = dataclasses.replace(space, cuda=True)
    pinned = dataclasses.replace(settings, pin_memory=True)
    heavy = _verdict(_profile(transfer_s=0.0001), cuda, pinned, 2_000.0, "pin_memory")
    assert heavy.alternative is False  # 0.1 ms of each 0.5 ms sample
    assert heavy.why == "the copy to the GPU takes 20% of each sample's time"
    light = _verdict(_profile(transfer_s=0.000001), cuda, pinned, 2_000.0, "pin_memory")
    assert not light.matters


def test_a_deeper_prefetch_is_tried_where_a_burst_outlasts_the_queues_slack() -> None:
    """4 workers, batches of 32 at 500 samples/s: a batch is asked for 2 x 4 x 64 ms before its
    turn and takes 257 ms to fetch, so prefetch 2 rides out a batch 255 ms slower than the mean;
    a burst of 400 ms needs prefetch 3 (511 ms), one of 10 s more than the range holds."""
    space = _space(max_workers=64)
    settings = _settings(space, 4)

    def verdict(burst: float | None) -> KnobVerdict:
        profile = _profile(fetch_burst_s=burst)
        return _verdict(profile, space, settings, 500.0, "prefetch_factor")

    assert verdict(None).why == "the profile holds no fetch spread"
    even = verdict(0.2)
    assert not even.matters
    assert even.why == "the slowest batch fetch runs 200 ms over the mean, the queue's slack 255 ms"
    assert verdict(0.4).alternative == 3
    assert verdict(10.0).alternative == 8  # the space's deepest
    assert not _verdict(
        _profile(fetch_burst_s=10.0), space, _settings(space, 0), 500.0, "prefetch_factor"
    ).matters


def test_a_fixed_knob_keeps_its_value_everywhere() -> None:
    """``--fix persistent_workers=false`` on a short epoch: no trial of persistence, the model's
    proposals and both baselines run it, and the pick's summary does not name it."""
    space = _space(max_workers=64, fixed={"persistent_workers": False, "prefetch_factor": 4})
    profile = _profile(dataset_samples=8_000, fetch_burst_s=10.0)
    settings = candidate_setting(space, 16, 32, 1, {})
    assert not settings.persistent_workers and settings.prefetch_factor == 4
    verdicts = knob_verdicts(profile, space, settings, 2_000.0)
    assert [v.why for v in verdicts[:2]] == ["fixed with --fix", "fixed with --fix"]
    assert all(not v.matters for v in verdicts)
    assert untried_knob_steps(profile, space, [(settings, 2_000.0)]) == []
    assert kept_defaults(profile, space, settings, 2_000.0, [settings]) == {"pin_memory": "CPU"}
    for baseline in baseline_settings(space, physical_cores=4).values():
        if baseline.num_workers:
            assert not baseline.persistent_workers and baseline.prefetch_factor == 4


def _short_epochs() -> tuple[PipelineProfile, SearchSpace, LoaderSettings, float]:
    """A profile whose epochs are short against its workers' start, its predicted best measured
    at a rate whose epoch is 1 s."""
    profile, space = _profile(dataset_samples=2_000), _space(max_workers=64)
    best = predicted_best(profile, space)
    return profile, space, best, 2_000.0


def test_the_knob_trial_follows_the_worker_steps_and_is_taken_once() -> None:
    profile, space, best, rate = _short_epochs()
    measured = [(best, rate)] + [(step, 0.9 * rate) for step in worker_steps(space, best)]
    proposal = next_setting(profile, space, measured)
    assert proposal is not None and proposal.why == "knob:persistent_workers"
    assert proposal.settings == dataclasses.replace(best, persistent_workers=False)
    assert setting_key(proposal.settings) == setting_key(best)
    # Queued elsewhere in a fleet, or measured slower: not proposed again.
    again = next_setting(profile, space, measured, pending=[proposal.settings])
    assert again is None or not again.why.startswith("knob:")
    measured.append((proposal.settings, 0.8 * rate))
    rest = next_setting(profile, space, measured)
    assert rest is None or not rest.why.startswith("knob:")


def test_the_pick_says_which_knobs_kept_their_defaults_and_why() -> None:
    profile, space, best, rate = _short_epochs()
    untried = kept_defaults(profile, space, best, rate, [best])
    assert list(untried) == ["persistent_workers", "prefetch_factor", "pin_memory"]
    assert untried["persistent_workers"].endswith("; the study ended before its trial")
    assert untried["prefetch_factor"] == "the profile holds no fetch spread"
    assert untried["pin_memory"] == "CPU"
    off = dataclasses.replace(best, persistent_workers=False)
    tried = kept_defaults(profile, space, best, rate, [best, off])
    assert "persistent_workers" not in tried  # measured, and the default held
    assert "persistent_workers" not in kept_defaults(profile, space, off, rate, [best, off])
    # Tried beside another setting only (the pick moved on after the knob's trial).
    other = dataclasses.replace(best, batch=best.batch * 2, persistent_workers=False)
    moved = kept_defaults(profile, space, best, rate, [best, other])
    assert moved["persistent_workers"].endswith("tried beside an earlier best, not beside the pick")
    idle = _settings(space, 0)
    assert kept_defaults(profile, space, idle, rate, [idle]) == {"pin_memory": "CPU"}


def test_profiles_stored_without_the_fetch_spread_still_load() -> None:
    """The stored ``bench.search`` profiles predate the fetch spread: they load, and prefetch
    keeps its default for want of it."""
    attrs = json.loads((DATA / "stored_profiles.json").read_text())["image"]["profile"]
    assert "fetch_burst_s" not in attrs
    profile = stored_profile({"pipeline_profile": attrs})
    assert profile is not None and profile.fetch_burst_s is None
    spread = dataclasses.replace(profile, fetch_burst_s=0.1).to_attrs()
    again = stored_profile({"pipeline_profile": json.loads(json.dumps(spread))})
    assert again is not None and again.fetch_burst_s == 0.1
