"""The best setting through every way a user applies it: the same setting, all of it.

A real study of the image workload (its ``collate`` knob fixed away from the default) is
applied through ``tuner.loader``, through the ``--format python`` snippet pasted into a fresh
process, and through ``--format json`` as the README reads it. Each fresh process starts with
another intra-op thread count than the tuned one, builds its DataLoader, takes one batch and
reports what it got: the DataLoader arguments, the thread count, the dataset and collate the
knob selects, and the batch itself. Behaviour, not speed (bench/deliver.py measures that).
"""

from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from torch.utils.data import default_collate

import tuner
from storage import open_storage
from tests.conftest import best_cli, run_python, study_cli
from tests.tuner_tests.conftest import copy_of_sqlite_study
from tests.tuner_tests.workloads import Vectors
from tuner.dashboard import TunerBestStorage
from tuner.fleet import stored_studies
from tuner.insight import BestSetting, optuna_best
from tuner.insight._note import study_note
from tuner.insight._report import build_report

IMAGE_OPTIONS = ("--images", "64", "--resolution", "32")

OBSERVE = """
import json as _json
import torch as _torch

_batch = next(iter(loader))
print(_json.dumps({
    "dataloader": {key: getattr(loader, key) for key in KEYS},
    "torch_num_threads": _torch.get_num_threads(),
    "output": loader.dataset.output,
    "collate_fn": loader.collate_fn.__qualname__,
    "batch": [len(_batch[0]), str(_batch[0].dtype)],
}))
"""

LOADER = """
import tuner
from objectives import load_workload

workload = load_workload("image", {options!r})
loader = tuner.loader(workload=workload, hardware="auto", objective="image", storage={url!r})
"""

# The README's recipe for --format json, word for word.
JSON = """
import json
import statistics
import torch
from torch.utils.data import DataLoader
from objectives import load_workload

with open({path!r}) as f:
    setting = json.load(f)
torch.set_num_threads(setting["torch_num_threads"])
workload = load_workload(setting["objective"], setting["workload_options"]).with_knobs(
    setting["knobs"]
)
loader = DataLoader(
    workload.dataset, collate_fn=workload.collate_fn, shuffle=True, **setting["dataloader"]
)
"""


@pytest.fixture(scope="module")
def image_study(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A short real image study whose every trial, the baselines too, runs ``collate=uint8``."""
    url = f"sqlite:///{tmp_path_factory.mktemp('best') / 'tuner.db'}"
    flags = ("--n-trials", "4", "--fix", "collate=uint8", "--remeasure-rounds", "1")
    result = study_cli(url, "image", *IMAGE_OPTIONS, *flags)
    assert result.returncode == 0, result.stderr
    return url


def _in_fresh_process(code: str, setting: BestSetting) -> dict[str, Any]:
    """Run ``code`` (which defines ``loader``) in a new interpreter; what its loader does."""
    other = 1 if setting.torch_num_threads > 1 else 2
    keys = list(setting.dataloader_kwargs)
    prelude = f"import torch\ntorch.set_num_threads({other})\nKEYS = {keys!r}\n"
    result = run_python(prelude + textwrap.dedent(code) + OBSERVE)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _expected(setting: BestSetting) -> dict[str, Any]:
    """What the stored setting says the loader must be, from the workload the study ran."""
    workload = setting.workload()
    sample, _ = workload.dataset[0]
    return {
        "dataloader": setting.dataloader_kwargs,
        "torch_num_threads": setting.torch_num_threads,
        "output": setting.knobs["collate"],
        "collate_fn": (workload.collate_fn or default_collate).__qualname__,
        "batch": [min(setting.batch, len(workload.dataset)), str(sample.dtype)],
    }


@pytest.mark.slow
def test_every_path_delivers_the_whole_setting(image_study: str, tmp_path: Path) -> None:
    setting = tuner.best_setting("auto", objective="image", storage=image_study)
    expected = _expected(setting)
    assert expected["output"] == "uint8" and expected["collate_fn"] == "fast_collate"

    through_loader = _in_fresh_process(
        LOADER.format(options=dict(setting.workload_options), url=image_study), setting
    )
    assert through_loader == expected

    snippet = best_cli(image_study, "image", "--format", "python")
    assert snippet.returncode == 0, snippet.stderr
    assert _in_fresh_process(snippet.stdout, setting) == expected

    as_json = best_cli(image_study, "image", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    path = tmp_path / "best.json"
    path.write_text(as_json.stdout)
    assert _in_fresh_process(JSON.format(path=str(path)), setting) == expected


@pytest.mark.slow
def test_the_json_is_the_documented_shape(image_study: str) -> None:
    as_json = json.loads(best_cli(image_study, "image", "--format", "json").stdout)
    setting = tuner.best_setting("auto", objective="image", storage=image_study)
    assert list(as_json) == [
        "dataloader",
        "torch_num_threads",
        "knobs",
        "batch_param",
        "batch",
        "accumulation_steps",
        "objective",
        "workload_options",
        "study",
        "trial",
        "samples_per_sec",
        "remeasured",
        "window_samples_per_sec",
        "finished_trials",
        "holdout_rounds",
        "holdout_range",
    ]
    assert as_json["dataloader"] == tuner.best_params(
        "auto", objective="image", storage=image_study
    )
    assert as_json["trial"] == setting.trial_number
    assert as_json["samples_per_sec"] == setting.samples_per_sec
    rounds = as_json["holdout_rounds"]
    assert rounds and as_json["holdout_range"] == [min(rounds), max(rounds)]
    assert as_json["samples_per_sec"] == statistics.median(rounds)
    assert as_json["knobs"] == {"collate": "uint8"}


@pytest.mark.slow
def test_apply_sets_the_threads_and_says_so(
    image_study: str, caplog: pytest.LogCaptureFixture
) -> None:
    setting = tuner.best_setting("auto", objective="image", storage=image_study)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(setting.torch_num_threads + 1)
        with caplog.at_level("INFO", logger="tuner.best"):
            previous = setting.apply()
        assert previous == setting.torch_num_threads + 1
        assert torch.get_num_threads() == setting.torch_num_threads
        assert f"torch.set_num_threads({setting.torch_num_threads})" in caplog.text
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_the_table_and_the_summary_name_the_same_best(image_study: str) -> None:
    setting = tuner.best_setting("auto", objective="image", storage=image_study)
    table = best_cli(image_study, "image")
    assert table.returncode == 0, table.stderr
    assert setting.holdout_rounds  # the study took a hold-out: its median is the figure
    assert f"trial {setting.trial_number}, {setting.figure.text()}" in table.stdout
    assert "torch_num_threads" in table.stdout and "collate" in table.stdout
    assert f"torch.set_num_threads({setting.torch_num_threads})" in table.stdout


def test_one_best_everywhere(tmp_path: Path, remeasured_url: str) -> None:
    """Where Optuna's best is another trial, every reader still names the tuner's best."""
    url = copy_of_sqlite_study(remeasured_url, tmp_path)
    study = optuna.load_study(study_name="remeasured@local-test", storage=url)
    study.set_user_attr("profile", {"name": "local-test", "vcpus": 2, "memory_bytes": 2**30})
    chosen = tuner.best_setting(objective="image", storage=url, study_name=study.study_name)
    theirs = optuna_best(study)
    assert theirs is not None and theirs.number != chosen.trial_number
    figure = f"{chosen.samples_per_sec:,.1f} samples/s"

    (stored,) = stored_studies(open_storage(url, heartbeat_interval=None))
    assert (stored.best_trial_number, stored.best_samples_per_sec) == (
        chosen.trial_number,
        chosen.samples_per_sec,
    )
    assert f"## Best: trial {chosen.trial_number}\n\n**{figure}**" in study_note(study)
    assert f"best: trial {chosen.trial_number}, {figure}" in build_report(study)
    served = TunerBestStorage(url)
    best = served.get_best_trial(served.get_study_id_from_name(study.study_name))
    assert best.number == chosen.trial_number
    loaded = tuner.loader(
        Vectors(),
        objective="image",
        storage=url,
        study_name=study.study_name,
        set_threads=False,
    )
    assert {key: getattr(loaded, key) for key in chosen.dataloader_kwargs} == (
        chosen.dataloader_kwargs
    )
