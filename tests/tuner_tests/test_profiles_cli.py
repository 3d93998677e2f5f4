from __future__ import annotations

import json
import warnings
from pathlib import Path

import optuna
import pytest
import torch
from torch.utils.data import TensorDataset

import tuner
from tests.cli_runner import CliRunner
from tests.conftest import QUICK_TRIALS, forked_cli, run_cli
from tuner.machine import Fingerprint, auto_profile_name, detect_fingerprint
from tuner.machine._fingerprint import gpu_counts

FAST = "tests.tuner_tests.workloads:fast"


def test_detect_names_this_machine(cli_runner: CliRunner) -> None:
    result = forked_cli(cli_runner, "tuner.profiles", "detect", "--format", "json")
    assert result.returncode == 0, result.stderr
    detected = json.loads(result.stdout)
    fingerprint = detect_fingerprint()
    assert detected["auto"] == auto_profile_name(fingerprint)  # no catalog profile matches
    assert detected["fingerprint_name"] == auto_profile_name(fingerprint)
    assert detected["fingerprint"]["logical_cpus"] == fingerprint.logical_cpus
    assert "g4dn.xlarge" not in detected["matches"]  # this 2-core box is no g4dn.xlarge


def test_detect_and_list_name_the_catalog_profile_auto_resolves_to(
    tmp_path: Path, cli_runner: CliRunner
) -> None:
    catalog = _my_box(tmp_path)
    detected = forked_cli(
        cli_runner, "tuner.profiles", "detect", "--profiles", str(catalog), "--format", "json"
    )
    assert detected.returncode == 0, detected.stderr
    facts = json.loads(detected.stdout)
    assert (facts["auto"], facts["matches"]) == ("my-box", ["my-box"])
    table = forked_cli(cli_runner, "tuner.profiles", "detect", "--profiles", str(catalog))
    assert "--hardware auto (the default) names this machine my-box" in table.stdout
    storage = f"sqlite:///{tmp_path / 'none.db'}"
    listed = forked_cli(
        cli_runner, "tuner.profiles", "list", "--profiles", str(catalog), "--storage", storage
    )
    assert "--hardware auto (the default) on this machine: my-box" in listed.stdout


def _my_box(tmp_path: Path) -> Path:
    """A user catalog with one profile, ``my-box``, that this machine matches."""
    fingerprint = detect_fingerprint()
    this_machine = {
        "vcpus": fingerprint.usable_cpus,
        "memory_gib": fingerprint.usable_memory_bytes / 2**30,
        **_gpus(fingerprint),
    }
    catalog = tmp_path / "mine.json"
    catalog.write_text(json.dumps({"my-box": this_machine}))
    return catalog


@pytest.mark.slow
def test_a_study_run_for_a_profile_is_what_every_verb_finds_without_hardware(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = _my_box(tmp_path)
    monkeypatch.setenv("TUNER_PROFILES", str(catalog))
    url = f"sqlite:///{tmp_path / 't.db'}"
    common = ("--objective", FAST, "--storage", url)
    quick = ("--n-trials", "2", "--remeasure-top", "0", "--no-probe-batch", *QUICK_TRIALS)
    named = run_cli("tuner.study", "--hardware", "my-box", *common, *quick)
    assert named.returncode == 0, named.stderr
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == [f"{FAST}@my-box"]
    # No --hardware anywhere: auto is my-box here, so every verb works on that same study.
    again = run_cli("tuner.study", *common, *quick)
    assert again.returncode == 0, again.stderr
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == [f"{FAST}@my-box"]
    best = run_cli("tuner.best", *common, "--format", "json")
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["study"] == f"{FAST}@my-box"
    report = run_cli("tuner.report", *common, "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "r.html").exists()
    assert tuner.best_setting(objective=FAST, storage=url).finished_trials >= 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the rule of thumb
        loader = tuner.loader(
            TensorDataset(torch.arange(64.0)), objective=FAST, storage=url, set_threads=False
        )
    assert loader.batch_size == json.loads(best.stdout)["dataloader"]["batch_size"]


def _gpus(fingerprint: Fingerprint) -> dict[str, object]:
    counts = gpu_counts(fingerprint)
    if not counts:
        return {}
    model, count = counts.most_common(1)[0]
    return {"gpu_count": count, "gpu_model": model}


def test_list_and_show_without_a_database_create_nothing(
    tmp_path: Path, cli_runner: CliRunner
) -> None:
    storage = f"sqlite:///{tmp_path / 'none.db'}"
    listed = forked_cli(cli_runner, "tuner.profiles", "list", "--storage", storage)
    assert listed.returncode == 0, listed.stderr
    for name in (
        "g4dn.xlarge",
        "g4dn.2xlarge",
        "g5.xlarge",
        "p3.2xlarge",
        "p4d.24xlarge",
        "g6.xlarge",
    ):
        assert name in listed.stdout
    shown = forked_cli(
        cli_runner,
        "tuner.profiles",
        "show",
        "g4dn.xlarge",
        "--storage",
        storage,
        "--format",
        "json",
    )
    profile = json.loads(shown.stdout)["profile"]
    assert (profile["vcpus"], profile["gpu_count"], profile["gpu_model"]) == (4, 1, "t4")
    assert not (tmp_path / "none.db").exists()


def test_unknown_profile_and_bad_catalog_are_usage_errors(
    tmp_path: Path, cli_runner: CliRunner
) -> None:
    unknown = forked_cli(
        cli_runner, "tuner.profiles", "show", "nope", "--storage", f"sqlite:///{tmp_path / 'x.db'}"
    )
    assert unknown.returncode == 2 and "g4dn.xlarge" in unknown.stderr
    catalog = tmp_path / "bad.json"
    catalog.write_text("{not json")
    bad = forked_cli(cli_runner, "tuner.profiles", "list", "--profiles", str(catalog))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
