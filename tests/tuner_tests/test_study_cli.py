"""``python -m tuner.study`` and ``python -m tuner.best`` as a user runs them: real subprocesses,
real DataLoader workers, a real SQLite file."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import best_cli, study_cli
from tuner.machine import auto_profile_name, detect_fingerprint

FAST = "tests.tuner_tests.workloads:fast"
SHORT_EPOCHS = "tests.tuner_tests.workloads:short_epochs"
QUICK = ["--remeasure-rounds", "1"]
GP = ["--sampler", "gp"]
"""For tests that count trials: every one asked for runs (the default ``model`` strategy ends a
study once its best has held against its neighbours, which on the fast workload comes first)."""
PROFILE = auto_profile_name(detect_fingerprint())


def _study(db: Path, objective: str = FAST) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    label = (
        objective
        if ".py:" not in objective
        else f"{Path(objective.split(':')[0]).name}:{objective.split(':')[1]}"
    )
    return optuna.load_study(study_name=f"{label}@{PROFILE}", storage=f"sqlite:///{db}")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real study of the fast workload, shared by the read-only tests below."""
    db = tmp_path_factory.mktemp("study") / "tuner.db"
    result = study_cli(f"sqlite:///{db}", FAST, "--n-trials", "6", "--seed", "0", *GP, *QUICK)
    assert result.returncode == 0, result.stderr
    _shows_the_set_up_then_leads_with_the_answer(result)
    return db


def _shows_the_set_up_then_leads_with_the_answer(result: subprocess.CompletedProcess[str]) -> None:
    """A line per set-up phase on stderr, in order; on stdout the best, its speedups and the
    code first, the table after, and the tuner's diagnostics only under --verbose."""
    phases = ["created study", "ceiling: the step alone", "pipeline profile:", "model: bound"]
    at = [result.stderr.find(phase) for phase in phases]
    assert -1 not in at and at == sorted(at), result.stderr
    out = result.stdout
    order = ["best: trial", "x over pytorch-default", "DataLoader(", "num_workers  batch_size"]
    at = [out.find(part) for part in order]
    assert -1 not in at and at == sorted(at), out
    assert "of the ceiling" not in out and "pipeline: fetch" not in out


@pytest.mark.slow
def test_study_records_what_it_measured(tuned: Path) -> None:
    study = _study(tuned)
    assert study.metric_names == ["samples_per_sec"]
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert study.user_attrs["profile"]["name"] == PROFILE
    assert {"workload", "tuner_version", "max_batch_size"} <= set(study.user_attrs)
    assert len(study.trials) == 6
    for trial in study.trials:
        attrs = trial.user_attrs
        if trial.state == optuna.trial.TrialState.PRUNED:  # clearly slower than the best
            assert attrs["pruned_reason"] == "pruner" and attrs["partial_samples_per_sec"] > 0
            continue
        assert trial.state == optuna.trial.TrialState.COMPLETE, attrs
        assert attrs["samples_per_sec"] == pytest.approx(trial.value)
        assert attrs["batches"] > 0 and attrs["device"] == "cpu"
        assert 0.0 <= attrs["data_wait_fraction"] <= 1.0 and attrs["time_to_first_batch_s"] > 0
        assert attrs["settings"]["pin_memory"] is False  # off CUDA: fixed, and recorded
        assert "peak_host_memory_bytes" in attrs and attrs["machine"]["logical_cpus"] >= 1
        assert attrs["bottleneck"] in ("input-bound", "cpu-bound", "io-bound", "compute-bound")
        assert attrs["advice"] and 0 < attrs["efficiency"] <= 1.5
        assert attrs["predicted_samples_per_sec"] > 0 and attrs["bound_efficiency"] > 0
    assert {"pipeline_profile", "bound_samples_per_sec", "num_workers_max"} <= set(study.user_attrs)


@pytest.mark.slow
def test_baselines_come_first_and_once_also_on_resume(tuned: Path) -> None:
    result = study_cli(
        f"sqlite:///{tuned}", FAST, "--n-trials", "2", "--remeasure-top", "0", *GP, *QUICK
    )
    assert result.returncode == 0, result.stderr
    assert "resuming study" in result.stderr
    trials = _study(tuned).trials
    baselines = [t for t in trials if "baseline" in t.user_attrs]
    assert [t.user_attrs["baseline"] for t in baselines] == ["pytorch-default", "rule-of-thumb"]
    assert [t.number for t in baselines] == [0, 1]
    assert baselines[0].user_attrs["settings"]["num_workers"] == 0
    assert baselines[1].user_attrs["settings"]["persistent_workers"] is True
    assert len(trials) == 8


@pytest.mark.slow
def test_best_formats(tuned: Path) -> None:
    storage = f"sqlite:///{tuned}"
    as_json = best_cli(storage, FAST, "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    setting = json.loads(as_json.stdout)
    assert setting["samples_per_sec"] > 0 and setting["study"] == f"{FAST}@{PROFILE}"
    assert setting["torch_num_threads"] >= 1 and setting["knobs"] == {}
    loader = DataLoader(TensorDataset(torch.arange(64.0)), **setting["dataloader"])
    assert sum(len(batch[0]) for batch in loader) == 64
    as_python = best_cli(storage, FAST, "--format", "python")
    assert "loader = DataLoader(" in as_python.stdout
    assert f"torch.set_num_threads({setting['torch_num_threads']})" in as_python.stdout
    compile(as_python.stdout, "snippet", "exec")
    table = best_cli(storage, FAST)
    assert "num_workers" in table.stdout and "finished trials" in table.stdout
    assert f"trial {setting['trial']}," in table.stdout and "torch_num_threads" in table.stdout


@pytest.mark.slow
def test_best_params_api_matches_the_cli(tuned: Path) -> None:
    import tuner

    kwargs = tuner.best_params("auto", objective=FAST, storage=f"sqlite:///{tuned}")
    cli = best_cli(f"sqlite:///{tuned}", FAST, "--format", "json")
    assert kwargs == json.loads(cli.stdout)["dataloader"]
    setting = tuner.best_setting("auto", objective=FAST, storage=f"sqlite:///{tuned}")
    assert setting.to_json() == json.loads(cli.stdout)


def _optuna(*args: str) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("optuna")
    return subprocess.run([str(command), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_optunas_own_cli_reads_the_study(tuned: Path) -> None:
    studies = _optuna("studies", "--storage", f"sqlite:///{tuned}", "-f", "json")
    assert studies.returncode == 0, studies.stderr
    assert f"{FAST}@{PROFILE}" in [s["name"] for s in json.loads(studies.stdout)]
    best = _optuna(
        "best-trial",
        "--storage",
        f"sqlite:///{tuned}",
        "--study-name",
        f"{FAST}@{PROFILE}",
        "-f",
        "json",
    )
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["state"] == "COMPLETE"


USER_FILE = """
from __future__ import annotations

import torch
from torch.utils.data import Dataset

from objectives import Workload


class Squares(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((8,), float(index * index))


def step(batch: torch.Tensor, device: torch.device) -> None:
    batch.mean().item()


def workload() -> Workload:
    return Workload(
        name="squares", dataset=Squares(), step=step, default_batch_size=16,
        batch_size_range=(8, 32),
    )
"""


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_user_workload_from_a_file_with_worker_processes(tmp_path: Path, context: str) -> None:
    path = tmp_path / "my_workload.py"
    path.write_text(textwrap.dedent(USER_FILE))
    db = tmp_path / "t.db"
    result = study_cli(
        f"sqlite:///{db}",
        f"{path}:workload",
        "--n-trials",
        "3",
        "--fix",
        "num_workers=2",
        "--multiprocessing-context",
        context,
        "--remeasure-top",
        "0",
        *QUICK,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    study = _study(db, f"{path}:workload")
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete, [t.user_attrs for t in study.trials]
    # The fixed value binds every trial, the baselines included.
    assert "baseline" in study.trials[0].user_attrs
    for trial in study.trials:
        assert trial.user_attrs["settings"]["num_workers"] == 2, trial.user_attrs
        assert trial.user_attrs["settings"]["multiprocessing_context"] == context


@pytest.mark.slow
def test_a_raising_dataset_fails_its_trials_and_the_study_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    objective = "tests.tuner_tests.workloads:raising"
    result = study_cli(f"sqlite:///{db}", objective, "--n-trials", "3", "--no-probe-batch", *QUICK)
    assert "Traceback" not in result.stderr
    assert "the search runs as gp" in result.stderr  # nothing to profile: no pipeline model
    study = _study(db, objective)
    assert len(study.trials) == 3
    for trial in study.trials:
        assert trial.state == optuna.trial.TrialState.FAIL
        assert "corrupt file" in trial.user_attrs["error"]


@pytest.mark.slow
def test_effective_batch_sets_accumulation(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    result = study_cli(
        f"sqlite:///{db}",
        FAST,
        "--n-trials",
        "4",
        "--effective-batch",
        "64",
        "--remeasure-top",
        "0",
        *QUICK,
    )
    assert result.returncode == 0, result.stderr
    for trial in _study(db).trials:
        settings = trial.user_attrs["settings"]
        assert settings["batch"] * settings["accumulation_steps"] == 64


@pytest.mark.slow
def test_a_setting_measured_before_is_answered_from_the_study(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    fixed = ["--fix", "num_workers=0", "--fix", "batch_size=32", "--fix", "torch_num_threads=1"]
    result = study_cli(
        f"sqlite:///{db}", FAST, "--n-trials", "5", *fixed, "--remeasure-top", "0", *GP, *QUICK
    )
    assert result.returncode == 0, result.stderr
    # With these three fixed (on CPU) both baselines are the same setting: it is queued once,
    # and every trial sampled after it is that setting again, answered from the study.
    baseline, *repeats = _study(db).trials
    assert baseline.user_attrs["baseline"] == "pytorch-default"
    assert "repeat_of" not in baseline.user_attrs
    assert len(repeats) == 4
    for repeat in repeats:
        assert repeat.user_attrs["repeat_of"] == baseline.number
        assert repeat.state == baseline.state and repeat.value == baseline.value
        assert repeat.user_attrs["settings"] == baseline.user_attrs["settings"]
        # Nothing ran: a repeat takes less than the measurement window it would have needed.
        assert repeat.duration < baseline.duration


@pytest.mark.slow
def test_the_default_strategy_profiles_seeds_and_bounds_a_storage_study(tmp_path: Path) -> None:
    """Samples that wait on storage: the worker range reaches far past the cores, the model's
    best is queued right after the baselines, every trial carries its prediction and its share
    of the bound, and the summary shows them."""
    db = tmp_path / "tuner.db"
    flags = [
        "--samples",
        "512",
        "--latency-ms",
        "4",
        "--seed",
        "0",
        "--verbose",
    ]  # default strategy
    result = study_cli(f"sqlite:///{db}", "storage", "--n-trials", "7", *flags, *QUICK)
    assert result.returncode == 0, result.stderr
    assert "of the bound" in result.stdout and "pipeline: fetch" in result.stdout
    assert "model: bound" in result.stderr
    study = _study(db, "storage")
    attrs = study.user_attrs
    profile = attrs["pipeline_profile"]
    assert profile["fetch_wall_s"] >= 0.004 and profile["fetch_cpu_s"] < profile["fetch_wall_s"]
    assert attrs["num_workers_max"] >= 4 * detect_fingerprint().usable_cpus
    assert attrs["bound_samples_per_sec"] > 0
    trials = study.get_trials(deepcopy=False)
    assert [t.user_attrs.get("baseline") for t in trials[:2]] == [
        "pytorch-default",
        "rule-of-thumb",
    ]
    assert trials[2].user_attrs["model_seed"] == "predicted-best"
    assert trials[2].user_attrs["settings"]["num_workers"] > detect_fingerprint().usable_cpus
    # Then, where the predicted best's step is crowded, the best within the cores; then the
    # model's corrected picks and the best's neighbours, one at a time.
    seeds = [t.user_attrs.get("model_seed") for t in trials[3:]]
    proposed = seeds[1:] if seeds[:1] == ["within-cores"] else seeds
    assert proposed and all(
        why in ("corrected", "neighbour") or why.startswith("knob:") for why in proposed
    )
    for trial in trials[3:]:
        if trial.user_attrs.get("model_seed") != "within-cores":
            assert trial.user_attrs["corrected_samples_per_sec"] > 0
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    bound = attrs["bound_samples_per_sec"]
    for trial in complete:
        # The bound is the best ideal rate over a space wider than the study's (ties within
        # 1% go to the cheaper setting): no trial's prediction is above it.
        assert 0 < trial.user_attrs["predicted_samples_per_sec"] <= 1.01 * bound
    # Against one bound, the efficiencies rank the trials as their throughputs do.
    by_value = sorted(complete, key=lambda t: t.value)
    efficiencies = [t.user_attrs["bound_efficiency"] for t in by_value]
    assert efficiencies == sorted(efficiencies) and efficiencies[0] > 0


@pytest.mark.slow
def test_the_printed_figure_is_the_hold_out_median(tmp_path: Path) -> None:
    """After the pick, fresh rounds of it and of the baselines side by side: the summary prints
    their median with its spread, the speedups come from them, and the phases' time is one line."""
    db = tmp_path / "tuner.db"
    objective = "tests.tuner_tests.workloads:off_cpu"
    flags = ["--n-trials", "4", "--seed", "0", "--remeasure-rounds", "2", *GP]
    result = study_cli(f"sqlite:///{db}", objective, *flags)
    assert result.returncode == 0, result.stderr
    study = _study(db, objective)
    held = {int(n): rounds for n, rounds in study.user_attrs["holdout_samples_per_sec"].items()}
    best = int(study.user_attrs["best_trial_number"])
    rounds = held[best]
    assert len(rounds) == 2
    median = statistics.median(rounds)
    figure = (
        f"best: trial {best}, {median:,.0f} samples/s (median of 2 hold-out rounds, "
        f"{min(rounds):,.0f}-{max(rounds):,.0f})"
    )
    assert figure in result.stdout, result.stdout
    trials = study.get_trials(deepcopy=False)
    default = next(t for t in trials if t.user_attrs.get("baseline") == "pytorch-default")
    if default.number != best:
        ratio = median / statistics.median(held[default.number])
        assert f"{ratio:.2f}x over pytorch-default" in result.stdout
    assert "time: set-up " in result.stdout and ", re-measuring " in result.stdout
    # Each phase's trial children: a trial answered from the study starts none; the final
    # re-measurement at least the hold-out's rounds (and the selection's, where it had one).
    children = study.user_attrs["phase_children"]
    assert children["set-up"] >= 2  # the ceiling and the pipeline profile
    assert children["trials"] >= sum("repeat_of" not in t.user_attrs for t in trials)
    assert children["re-measuring"] >= sum(len(values) for values in held.values())
    assert f"({children['re-measuring']} runs)" in result.stdout
    as_json = json.loads(best_cli(f"sqlite:///{db}", objective, "--format", "json").stdout)
    assert as_json["samples_per_sec"] == median and as_json["holdout_rounds"] == rounds


@pytest.mark.slow
def test_the_default_strategy_measures_persistence_where_epochs_are_short(tmp_path: Path) -> None:
    """Epochs of a fraction of a second against the workers' start: the model's best is measured
    without persistent workers too, beside its twin; the summary names the loader knobs the
    pick left at their defaults, and why."""
    db = tmp_path / "tuner.db"
    flags = ["--n-trials", "16", "--seed", "0", "--fix", "torch_num_threads=1", *QUICK]
    result = study_cli(f"sqlite:///{db}", SHORT_EPOCHS, *flags)
    assert result.returncode == 0, result.stderr
    study = _study(db, SHORT_EPOCHS)
    assert study.user_attrs["pipeline_profile"]["fetch_burst_s"] >= 0
    seeds = [t.user_attrs.get("model_seed") for t in study.trials]
    knob = [t for t in study.trials if t.user_attrs.get("model_seed") == "knob:persistent_workers"]
    assert len(knob) >= 1, seeds
    assert knob[0].state == optuna.trial.TrialState.COMPLETE
    settings = knob[0].user_attrs["settings"]
    assert settings["persistent_workers"] is False and settings["num_workers"] > 0
    twin = {**settings, "persistent_workers": True}
    assert any(t.user_attrs.get("settings") == twin for t in study.trials[: knob[0].number])
    kept = study.user_attrs["loader_defaults_kept"]
    assert kept.get("pin_memory") == "CPU"
    # Beside the pick, persistence was measured; where the pick moved on after the knob's trial
    # (the re-measured best is another setting), the reason says the trial stood elsewhere.
    persistent = kept.get("persistent_workers")
    assert persistent is None or persistent.endswith("not beside the pick"), persistent
    assert "left at defaults: " in result.stdout and "pin_memory (CPU)" in result.stdout
