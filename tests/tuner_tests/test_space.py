from __future__ import annotations

import dataclasses

import optuna
import pytest

from objectives import load_workload
from tuner.search._baselines import baseline_settings, rule_of_thumb_workers
from tuner.search._settings import LoaderSettings
from tuner.search._space import SearchSpace, SpaceError, powers_of_two


def _space(**overrides: object) -> SearchSpace:
    values: dict[str, object] = {
        "workload": load_workload("tests.tuner_tests.workloads:fast"),
        "max_workers": 4,
        "max_threads": 2,
        "cuda": False,
    }
    values.update(overrides)
    return SearchSpace(**values)  # type: ignore[arg-type]


def _sample(space: SearchSpace, n: int = 40) -> list[optuna.trial.FrozenTrial]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(lambda t: (space.suggest(t), 1.0)[1], n_trials=n)
    return study.trials


def test_powers_of_two() -> None:
    assert powers_of_two(8, 64) == [8, 16, 32, 64]
    assert powers_of_two(5, 7) == []


def test_prefetch_and_persistence_exist_only_with_workers() -> None:
    for trial in _sample(_space()):
        if trial.params["num_workers"] == 0:
            assert (
                "prefetch_factor" not in trial.params and "persistent_workers" not in trial.params
            )
        else:
            assert 1 <= trial.params["prefetch_factor"] <= 8
            assert trial.params["persistent_workers"] in (False, True)


def test_pin_memory_sampled_only_on_cuda() -> None:
    assert all("pin_memory" not in t.params for t in _sample(_space()))
    assert any("pin_memory" in t.params for t in _sample(_space(cuda=True)))


def test_bounds() -> None:
    trials = _sample(_space())
    assert {t.params["batch_size"] for t in trials} <= {8, 16, 32, 64}
    assert max(t.params["num_workers"] for t in trials) <= 4
    assert {t.params["torch_num_threads"] for t in trials} <= {1, 2}


def test_effective_batch_keeps_the_recipe() -> None:
    space = _space(effective_batch=48)
    assert space.batch_choices() == [8, 16]
    settings = space.settings(0, 16, None, False, False, 1, {})
    assert settings.accumulation_steps == 3


def test_max_batch_bounds_the_choices() -> None:
    assert _space(max_batch=20).batch_choices() == [8, 16]


def test_fixed_parameters_are_not_sampled() -> None:
    space = _space()
    space = SearchSpace(
        **{**space.__dict__, "fixed": space.parse_fixed(["num_workers=2", "prefetch_factor=3"])}
    )
    for trial in _sample(space, 10):
        assert "num_workers" not in trial.params
    study = optuna.create_study()
    settings = space.suggest(study.ask())
    assert settings.num_workers == 2 and settings.prefetch_factor == 3


@pytest.mark.parametrize(
    ("flag", "fragment"),
    [
        ("nonsense=1", "unknown parameter 'nonsense'"),
        ("num_workers", "name=value"),
        ("num_workers=many", "expected an integer"),
        ("num_workers=999", "outside"),  # the range itself comes from the pipeline model
        ("prefetch_factor=0", "outside"),
        ("pin_memory=true", "needs a CUDA device"),
        ("persistent_workers=maybe", "true or false"),
        ("batch_size=4096", "outside"),
    ],
)
def test_bad_fix_values(flag: str, fragment: str) -> None:
    with pytest.raises(SpaceError, match=fragment):
        _space().parse_fixed([flag])


def test_knobs_are_part_of_the_space() -> None:
    space = SearchSpace(
        workload=load_workload("image", {"images": 16, "resolution": 32}),
        max_workers=2,
        max_threads=1,
        cuda=False,
    )
    trials = _sample(space, 20)
    assert {t.params["collate"] for t in trials} == {"float", "uint8"}
    with pytest.raises(SpaceError, match="not one of"):
        space.parse_fixed(["collate=int4"])


def test_baselines() -> None:
    space = _space()
    baselines = baseline_settings(space, physical_cores=4)
    default = baselines["pytorch-default"]
    assert (default.num_workers, default.pin_memory, default.batch) == (0, False, 32)
    rule = baselines["rule-of-thumb"]
    assert rule.num_workers == rule_of_thumb_workers(4) == 3
    assert (rule.prefetch_factor, rule.persistent_workers, rule.pin_memory) == (2, True, False)
    assert baseline_settings(_space(cuda=True), 4)["rule-of-thumb"].pin_memory is True


def test_baselines_run_the_knobs_the_user_fixed_and_the_defaults_of_the_rest() -> None:
    image = load_workload("image", {"images": 16, "resolution": 32})
    space = _space(workload=image, max_workers=2)
    assert {b.knobs["collate"] for b in baseline_settings(space, 2).values()} == {"float"}
    space = dataclasses.replace(space, fixed=space.parse_fixed(["collate=uint8", "batch_size=8"]))
    baselines = baseline_settings(space, 2)
    assert {b.knobs["collate"] for b in baselines.values()} == {"uint8"}
    assert {b.batch for b in baselines.values()} == {8}
    assert space.main_process_settings(8).knobs == {"collate": "uint8"}


def test_a_fixed_value_binds_both_baselines() -> None:
    space = _space()
    space = dataclasses.replace(space, fixed=space.parse_fixed(["num_workers=2", "batch_size=8"]))
    baselines = baseline_settings(space, physical_cores=4)
    assert list(baselines) == ["pytorch-default", "rule-of-thumb"]
    assert {(b.num_workers, b.batch) for b in baselines.values()} == {(2, 8)}
    # PyTorch's defaults for a loader with workers; the rule of thumb keeps its own.
    default, rule = baselines["pytorch-default"], baselines["rule-of-thumb"]
    assert (default.prefetch_factor, default.persistent_workers) == (2, False)
    assert (rule.prefetch_factor, rule.persistent_workers) == (2, True)


def test_baselines_the_fixed_values_make_the_same_are_one() -> None:
    space = _space()
    fixed = ["num_workers=0", "torch_num_threads=1"]
    space = dataclasses.replace(space, fixed=space.parse_fixed(fixed))
    baselines = baseline_settings(space, physical_cores=4)
    assert list(baselines) == ["pytorch-default"]
    only = baselines["pytorch-default"]
    assert (only.num_workers, only.torch_num_threads, only.prefetch_factor) == (0, 1, None)


def test_settings_round_trip_and_dominance() -> None:
    small = LoaderSettings(batch=16, num_workers=1, prefetch_factor=2, persistent_workers=True)
    large = LoaderSettings(batch=64, num_workers=2, prefetch_factor=4)
    assert LoaderSettings.from_attrs(small.to_attrs()) == small
    assert large.dominates(small) and not small.dominates(large)
    assert small.dataloader_kwargs() == {
        "batch_size": 16,
        "num_workers": 1,
        "pin_memory": False,
        "prefetch_factor": 2,
        "persistent_workers": True,
    }
    with pytest.raises(ValueError):
        LoaderSettings(batch=8, num_workers=0, prefetch_factor=2)
