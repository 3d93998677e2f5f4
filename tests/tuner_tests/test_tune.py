"""``tuner.tune``: the CLI's run from Python, quiet on stdout, returning the best setting; and the
keyword-only reading API, where ``objective=`` is required."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import tuner


@pytest.mark.slow  # a whole study, in this process
def test_tune_returns_the_best_setting_and_prints_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"

    best = tuner.tune(
        objective="storage",
        n_trials=4,
        storage=url,
        objective_options={"samples": 256},
        trial_seconds=0.4,
        warmup_seconds=0.1,
        remeasure_rounds=1,
    )

    out, _ = capfd.readouterr()
    assert out == ""
    assert isinstance(best, tuner.BestSetting)
    assert best.samples_per_sec > 0 and best.objective == "storage"
    assert best.finished_trials >= 2  # the default strategy may stop once its best has held
    assert tuner.best_setting(objective="storage", storage=url) == best


def test_tune_refuses_bad_input_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--n-trials must be positive"):
        tuner.tune(objective="storage", n_trials=0, storage=f"sqlite:///{tmp_path / 't.db'}")
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("call", [tuner.best_setting, tuner.best_params, tuner.loader])
def test_objective_is_required_and_options_keyword_only(call: object) -> None:
    parameters = inspect.signature(call).parameters  # type: ignore[arg-type]
    assert parameters["objective"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["objective"].default is inspect.Parameter.empty
    first, *rest = [p for p in parameters.values() if p.kind is not p.VAR_KEYWORD]
    assert first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in rest)
    assert {"storage", "study_name", "profiles_file"} <= set(parameters)


def test_loader_without_objective_is_a_type_error() -> None:
    import torch
    from torch.utils.data import TensorDataset

    with pytest.raises(TypeError, match="objective"):
        tuner.loader(TensorDataset(torch.arange(8.0)))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        tuner.best_setting("auto", "image")  # type: ignore[misc]


def test_the_package_exports_what_users_use() -> None:
    for name in ("tune", "BestSetting", "NoResultError", "best_setting", "best_params", "loader"):
        assert name in tuner.__all__ and getattr(tuner, name) is not None
