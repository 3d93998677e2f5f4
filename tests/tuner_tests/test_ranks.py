"""Ranks per node: a study's trials run N real rank processes (gloo on this CPU machine), as
``torchrun --nproc-per-node N`` starts training, and the study is that rank count's."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from objectives import Workload
from tests.conftest import QUICK_TRIALS, ROOT, best_cli, free_port, run_cli, study_cli
from tests.tuner_tests import workloads
from tests.tuner_tests.test_killed_study import StudyDb, _descendants, stop_study
from tuner import machine
from tuner._naming import study_name
from tuner.run import ConfigError, resolve_nproc_per_node
from tuner.trial import RANK_ATTRS, shard_error
from tuner.trial._ranks import node_attrs

W = "tests.tuner_tests.workloads"
ONE_WINDOW = ("--no-probe-batch", "--remeasure-top", "0", "--sampler", "random", "--seed", "0")


def test_the_rank_count_is_part_of_the_study_name() -> None:
    assert study_name("image", "g4dn.12xlarge") == "image@g4dn.12xlarge"
    assert study_name("image", "g4dn.12xlarge", 4) == "image@g4dn.12xlarge-x4ranks"


def test_nproc_per_node_auto_is_one_off_cuda_and_a_count_must_be_positive() -> None:
    assert resolve_nproc_per_node("auto", "cpu") == 1
    assert resolve_nproc_per_node("3", "cpu") == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(ConfigError, match="--nproc-per-node must be a positive count"):
            resolve_nproc_per_node(bad, "cpu")


def test_a_workload_with_its_own_sampler_cannot_be_sharded() -> None:
    assert shard_error(workloads.fast()) is None
    error = shard_error(workloads.own_sampler())
    assert error is not None and "own sampler" in error
    text = workloads.fast()
    with_batch_sampler = Workload(
        name="bucketed", dataset=text.dataset, batch_sampler=lambda d, b, s: [], batch_param="x"
    )
    assert "batch sampler" in str(shard_error(with_batch_sampler))


def test_node_figure_is_the_sum_of_the_ranks() -> None:
    ranks = [
        {"samples_per_sec": 100.0, "samples": 300, "batches": 10, "data_wait_fraction": 0.2,
         "own_peak_host_memory_bytes": 5, "window_s": 3.0, "window_started_at": 10.0},
        {"samples_per_sec": 120.0, "samples": 360, "batches": 12, "data_wait_fraction": 0.4,
         "own_peak_host_memory_bytes": 7, "window_s": 3.1, "window_started_at": 10.1},
    ]  # fmt: skip
    attrs = node_attrs(ranks)
    assert attrs["samples_per_sec"] == 220.0
    assert attrs["samples"] == 660 and attrs["batches"] == 22
    assert attrs["own_peak_host_memory_bytes"] == 12
    assert attrs["data_wait_fraction"] == pytest.approx(0.3)
    assert attrs[RANK_ATTRS[0]] == [100.0, 120.0]
    assert attrs[RANK_ATTRS[1]] == [0.2, 0.4]
    assert attrs["nproc_per_node"] == 2


def _study(db: Path) -> optuna.Study:
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}")
    return optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}")


@pytest.mark.slow
def test_a_two_rank_study_runs_two_real_ranks(tmp_path: Path) -> None:
    db = tmp_path / "tuner.db"
    result = study_cli(
        f"sqlite:///{db}", "storage", "--samples", "256", "--nproc-per-node", "2",
        "--n-trials", "2", *ONE_WINDOW,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    study = _study(db)
    assert study.study_name.endswith("-x2ranks")
    assert study.user_attrs["nproc_per_node"] == 2
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete
    for trial in complete:
        rates = trial.user_attrs["rank_samples_per_sec"]
        assert len(rates) == 2 and all(rate > 0 for rate in rates)
        assert len(trial.user_attrs["rank_data_wait_fraction"]) == 2
        assert trial.value == pytest.approx(sum(rates))
        assert trial.user_attrs["nproc_per_node"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("objective", "state", "said"),
    [
        ("rank_one_raising", "FAIL", "rank 1: RuntimeError: rank 1's loss is NaN"),
        ("rank_one_dying", "PRUNED", "rank 1 was trial_killed: SIGKILL"),
    ],
)
def test_a_failing_rank_ends_the_trial_with_its_reason(
    tmp_path: Path, objective: str, state: str, said: str
) -> None:
    db = tmp_path / "tuner.db"
    result = study_cli(
        f"sqlite:///{db}", f"{W}:{objective}", "--nproc-per-node", "2", "--n-trials", "1",
        *ONE_WINDOW,
    )  # fmt: skip
    assert "Traceback" not in result.stderr
    trials = [t for t in _study(db).trials if t.state.name != "WAITING"]  # a queued baseline
    assert trials
    for trial in trials:
        assert trial.state.name == state, (trial.number, trial.user_attrs.get("error"))
        assert said in trial.user_attrs["error"]


def _ranks_running(study: psutil.Process) -> list[psutil.Process]:
    """The rank processes: children of a trial child (which leads its own process group)."""
    for process in _descendants(study):
        try:
            if os.getpgid(process.pid) == process.pid and len(process.children()) >= 2:
                return process.children()
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return []


@pytest.mark.slow
def test_a_killed_two_rank_study_leaves_no_process(tmp_path: Path) -> None:
    db = tmp_path / "tuner.db"
    command = [
        sys.executable, "-m", "tuner.study", "--objective", f"{W}:slow",
        "--storage", f"sqlite:///{db}", "--nproc-per-node", "2", "--n-trials", "3",
        *ONE_WINDOW, *QUICK_TRIALS,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    study = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        root, deadline = psutil.Process(study.pid), time.monotonic() + 300
        while not any(_descendants(rank) for rank in _ranks_running(root)):  # ranks with workers
            assert study.poll() is None and time.monotonic() < deadline, StudyDb(db).trial_states()
            time.sleep(0.02)
    except BaseException:
        study.kill()
        study.wait()
        raise
    stopped = stop_study(study, signal.SIGKILL)
    # the study, the forkserver, the trial child, 2 ranks, their workers
    assert len(stopped.tree) >= 6, stopped.roles
    assert not stopped.survivors, [stopped.roles[p.pid] for p in stopped.survivors]


def test_more_ranks_than_cuda_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    assert resolve_nproc_per_node("auto", "cuda") == 2
    assert resolve_nproc_per_node("2", "cuda") == 2
    with pytest.raises(ConfigError, match="this machine has 2 CUDA GPUs"):
        resolve_nproc_per_node("3", "cuda")


# --- the space, the baselines, the model and the bound per rank ---------------------------------


def test_the_model_predicts_the_node_as_ranks_each_on_their_share() -> None:
    from tests.tuner_tests.pipeline.test_model import _cpu_bound, _settings, _space
    from tuner.pipeline import predict

    space = _space()
    node, one_rank = _cpu_bound(), _cpu_bound()
    node = dataclasses.replace(node, usable_cores=4.0, ranks=2)
    alone = dataclasses.replace(
        one_rank, usable_cores=2.0, dataset_samples=one_rank.dataset_samples // 2
    )
    for workers in (0, 1, 2, 4):
        settings = _settings(space, workers)
        assert predict(node, settings).samples_per_sec == pytest.approx(
            2 * predict(alone, settings).samples_per_sec
        )


def test_the_baselines_share_the_cores_among_the_ranks() -> None:
    from tests.tuner_tests.pipeline.test_model import _space
    from tuner.search import baseline_settings, rule_of_thumb_workers

    assert rule_of_thumb_workers(48) == 36
    assert rule_of_thumb_workers(48, 4) == 9
    assert rule_of_thumb_workers(2, 4) == 1
    space = _space(max_workers=64)
    one, four = baseline_settings(space, 48), baseline_settings(space, 48, 4)
    assert one["rule-of-thumb"].num_workers == 36 and four["rule-of-thumb"].num_workers == 9
    # torchrun sets OMP_NUM_THREADS=1 for each of several ranks
    assert four["pytorch-default"].torch_num_threads == 1
    assert one["pytorch-default"].torch_num_threads == space.max_threads


def test_each_ranks_space_has_its_share_of_the_cores(tmp_path: Path) -> None:
    from tuner import machine
    from tuner.run import StudyConfig, prepare

    fingerprint = machine.detect_fingerprint()
    config = dict(objective=f"{W}:fast", storage=f"sqlite:///{tmp_path / 't.db'}", device="cpu")
    one = prepare(StudyConfig(**config))
    two = prepare(StudyConfig(**config, nproc_per_node=2))
    assert two.nproc_per_node == 2 and two.study_name == one.study_name + "-x2ranks"
    assert two.space.max_workers == one.space.max_workers // 2
    assert two.space.max_threads == max(1, fingerprint.usable_cpus // 2)


# --- applying it in a rank ----------------------------------------------------------------------


def test_a_one_rank_optimum_is_clamped_to_the_ranks_share() -> None:
    from tuner._loader import MachineState, clamp_to_rank_share
    from tuner.machine import Profile
    from tuner.search import LoaderSettings

    gib = 2**30
    optimum = LoaderSettings(
        batch=64, num_workers=6, prefetch_factor=4, persistent_workers=True, torch_num_threads=8
    )
    profile = Profile(name="box", vcpus=8, memory_bytes=32 * gib)
    machine_state = MachineState(8, 10.0, 30 * gib, 32 * gib)
    assert clamp_to_rank_share(optimum, profile, 1, machine_state) == optimum
    shared = clamp_to_rank_share(optimum, profile, 4, machine_state)
    assert shared.num_workers <= 2 and shared.torch_num_threads == 2
    assert shared.prefetch_factor == 1  # a quarter of the memory each


def test_an_io_bound_one_rank_optimum_keeps_its_workers_across_the_ranks() -> None:
    """Many workers waiting on storage are the 1-rank study's finding on a 2-CPU box: 2 ranks
    share them out (32 each, the node's 64 as measured) rather than cut them to a CPU each."""
    from tuner._loader import MachineState, clamp_to_rank_share
    from tuner.machine import Profile
    from tuner.search import LoaderSettings

    gib = 2**30
    optimum = LoaderSettings(
        batch=32, num_workers=64, prefetch_factor=2, persistent_workers=True, torch_num_threads=2
    )
    profile = Profile(name="box", vcpus=2, memory_bytes=16 * gib)
    shared = clamp_to_rank_share(optimum, profile, 2, MachineState(2, 0.5, 15 * gib, 16 * gib))
    assert (shared.num_workers, shared.torch_num_threads) == (32, 1)


RANK_SCRIPT = """
import json, os, warnings
import tuner
from tests.tuner_tests.workloads import Vectors

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = tuner.loader(Vectors(), objective={objective!r}, storage={storage!r})
print(json.dumps({{
    "rank": int(os.environ["RANK"]), "num_workers": loader.num_workers,
    "batch_size": loader.batch_size, "warnings": [str(w.message) for w in caught],
}}))
"""


def _in_torchrun(tmp_path: Path, storage: str) -> list[dict[str, object]]:
    """``tuner.loader`` in each of 2 torchrun ranks: what each built, and its warnings."""
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT.format(objective=f"{W}:fast", storage=storage))
    result = run_cli(
        "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), str(script),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert sorted(line["rank"] for line in lines) == [0, 1]
    return lines


def _best_json(storage: str, *flags: str) -> dict[str, object]:
    result = best_cli(storage, f"{W}:fast", "--format", "json", *flags)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["dataloader"]


@pytest.mark.slow
def test_inside_torchrun_each_rank_applies_its_rank_counts_study(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tuner.db'}"
    one = study_cli(storage, f"{W}:fast", "--n-trials", "2", *ONE_WINDOW)
    assert one.returncode == 0, one.stderr[-2000:]
    usable = machine.usable_cpu_count()
    clamped = _in_torchrun(tmp_path, storage)  # only the 1-rank study exists yet
    for rank in clamped:
        assert rank["num_workers"] <= max(1, usable // 2)
        (warning,) = [w for w in rank["warnings"] if "ranks per node" in w]
        assert f"--objective {W}:fast --nproc-per-node 2" in warning
    two = study_cli(storage, f"{W}:fast", "--nproc-per-node", "2", "--n-trials", "2", *ONE_WINDOW)
    assert two.returncode == 0, two.stderr[-2000:]
    tuned = _best_json(storage, "--nproc-per-node", "2")
    for rank in _in_torchrun(tmp_path, storage):
        assert not [w for w in rank["warnings"] if "ranks per node" in w]
        applied = (rank["num_workers"], rank["batch_size"])
        assert applied == (tuned["num_workers"], tuned["batch_size"]), (rank, tuned)


def test_tune_takes_nproc_per_node_and_refuses_zero_before_writing(tmp_path: Path) -> None:
    import tuner

    with pytest.raises(ValueError, match="--nproc-per-node must be a positive count"):
        tuner.tune(
            objective=f"{W}:fast", storage=f"sqlite:///{tmp_path / 't.db'}", nproc_per_node=0
        )
    assert not (tmp_path / "t.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_ranks_started_either_way_report_the_node(start_method: str) -> None:
    """Spawned ranks are what a trial child whose workload initialised CUDA starts."""
    import multiprocessing

    from tuner.search import LoaderSettings
    from tuner.trial._child import _measure_in
    from tuner.trial._protocol import Job, Mode, Result
    from tuner.trial._ranks import run_ranks

    settings = LoaderSettings(batch=16, num_workers=1, prefetch_factor=2)
    job = Job(Mode.MEASURE, f"{W}:fast", {}, settings, "cpu", 0.3, 0.1, nproc_per_node=2)
    receiver, sender = multiprocessing.Pipe(duplex=False)
    run_ranks(sender, _measure_in, workloads.fast(), job, start_method=start_method)
    messages = []
    while receiver.poll(0):
        messages.append(receiver.recv())
    (result,) = [m for m in messages if isinstance(m, Result)]
    assert len(result.attrs["rank_samples_per_sec"]) == 2
    assert result.attrs["samples_per_sec"] == pytest.approx(
        sum(result.attrs["rank_samples_per_sec"])
    )
