"""The model under DDP in each rank: a workload that hands its model over (``Workload.model``)
trains it under ``DistributedDataParallel`` in 2 real gloo ranks, so the gradient all-reduce
keeps the ranks' parameters equal although each steps its own shard; a step-only workload
still runs, each rank training its own copy."""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from objectives import Workload, load_workload
from tests.tuner_tests import workloads
from tuner.search import LoaderSettings
from tuner.trial._child import _measure_in
from tuner.trial._measure import measure
from tuner.trial._protocol import Failure, Job, Mode, Result
from tuner.trial._ranks import run_ranks

W = "tests.tuner_tests.workloads"


def _measure_keeping_parameters(
    folder: Path,
    conn: Any,
    workload: Workload,
    job: Job,
    device: torch.device,
    before_window: Callable[[], Any],
    stepping: Callable[[], Any],
) -> None:
    """One rank's measurement, as the trial child's, that also saves what the rank trained:
    its parameters and whether it was a DDP module, before its result goes.

    The warm-up is counted, not timed, and rank r runs at least 2 + r micro-batches: the ranks'
    warm-ups differ by one, as two clocks' often do, on every run."""
    result = measure(
        workload, job.settings, device, window_s=job.window_s, warmup_s=0.0,
        min_warmup_batches=2 + int(os.environ["RANK"]), seed=job.seed,
        before_window=before_window, stepping=stepping,
    )  # fmt: skip
    # The handed-over model, else the one the step kept (a forked rank inherits the list).
    trained = workload.model if workload.model is not None else workloads.LinearStep.trained[-1]
    parameters = [p.detach().clone() for p in trained.parameters()]
    ddp = isinstance(stepping.__self__.module, DistributedDataParallel)  # the rank's RankModel
    torch.save({"ddp": ddp, "parameters": parameters}, folder / f"rank{os.environ['RANK']}.pt")
    conn.send(Result(result.to_attrs()))


def _two_ranks(tmp_path: Path, workload: Workload, accumulation_steps: int = 1) -> list[dict]:
    """Measure ``workload`` in 2 gloo ranks; what each rank trained."""
    settings = LoaderSettings(batch=16, num_workers=1, accumulation_steps=accumulation_steps)
    job = Job(Mode.MEASURE, f"{W}:linear", {}, settings, "cpu", 0.5, 0.2, nproc_per_node=2)
    receiver, sender = multiprocessing.Pipe(duplex=False)
    keep = functools.partial(_measure_keeping_parameters, tmp_path)
    run_ranks(sender, keep, workload, job)
    messages = []
    while receiver.poll(0):
        messages.append(receiver.recv())
    (outcome,) = [m for m in messages if isinstance(m, Result | Failure)]
    assert isinstance(outcome, Result), outcome
    assert len(outcome.attrs["rank_samples_per_sec"]) == 2
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]


def _equal(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(first, second, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_a_handed_over_model_trains_under_ddp_in_each_rank(
    tmp_path: Path, accumulation_steps: int
) -> None:
    workload = workloads.linear()
    before = [p.detach().clone() for p in workload.model.parameters()]  # type: ignore[union-attr]
    # With 2 steps, rank 1's window would start mid-run unless the warm-up ends on a step.
    zero, one = _two_ranks(tmp_path, workload, accumulation_steps)
    assert zero["ddp"] and one["ddp"]
    assert not _equal(zero["parameters"], before)  # trained
    assert _equal(zero["parameters"], one["parameters"])  # all-reduced: different shards, one model


@pytest.mark.slow
@pytest.mark.parametrize("script", ["lightning_script", "hf_script"])
def test_a_lightning_module_and_a_trainers_model_train_under_ddp(
    tmp_path: Path, script: str
) -> None:
    """The Lightning module's ``training_step`` is DDP's forward; the Trainer's model runs with
    the Trainer's DDP options (``find_unused_parameters`` for a PreTrainedModel)."""
    workload = load_workload(f"tests.objectives_tests.{script}:workload")
    before = [p.detach().clone() for p in workload.model.parameters()]  # type: ignore[union-attr]
    zero, one = _two_ranks(tmp_path, workload)
    assert zero["ddp"] and one["ddp"]
    assert not _equal(zero["parameters"], before)
    assert _equal(zero["parameters"], one["parameters"])


def test_the_frameworks_hand_their_models_over() -> None:
    from tuner.integrations.lightning import TrainingStepModule

    lightning = load_workload("tests.objectives_tests.lightning_script:workload")
    assert isinstance(lightning.model, TrainingStepModule)
    hf = load_workload("tests.objectives_tests.hf_script:workload")
    assert hf.model is not None and type(hf.model).__name__ == "BertForSequenceClassification"
    assert hf.ddp_kwargs == {"find_unused_parameters": True}  # the Trainer's, for its model


@pytest.mark.slow
def test_a_step_only_workload_trains_a_copy_in_each_rank(tmp_path: Path) -> None:
    zero, one = _two_ranks(tmp_path, workloads.linear_step_only())
    assert not zero["ddp"] and not one["ddp"]
    assert not _equal(zero["parameters"], one["parameters"])  # each rank its own shard's


def test_one_rank_trains_the_model_itself_on_its_device() -> None:
    workload = workloads.linear()
    step = workload.train_step(torch.device("cpu"))
    assert step.model is workload.model  # type: ignore[attr-defined]


def test_a_model_needs_a_step_that_takes_it() -> None:
    with pytest.raises(ValueError, match="hands over a model but no make_step"):
        Workload(name="m", dataset=workloads.Vectors(), model=torch.nn.Linear(64, 10))
    with pytest.raises(ValueError, match=r"not a torch\.nn\.Module"):
        Workload(name="m", dataset=workloads.Vectors(), make_step=workloads.LinearStep, model=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has ddp_kwargs but no model"):
        Workload(name="m", dataset=workloads.Vectors(), ddp_kwargs={"find_unused_parameters": True})


@pytest.mark.parametrize("name", ["image", "text", "storage"])
def test_the_built_in_workloads_hand_their_models_over(name: str) -> None:
    workload = load_workload(name, {"images": 8} if name == "image" else {})
    assert isinstance(workload.model, torch.nn.Module)
    step = workload.train_step(torch.device("cpu"))
    trained = getattr(step, "network", None) or getattr(step, "model", None)
    assert trained is workload.model
    if workload.knobs:  # another knob value trains the same model
        other = {knob: choices[-1] for knob, choices in workload.knobs.items()}
        assert workload.with_knobs(other).model is workload.model


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "said"),
    [("raise", "rank 1: RuntimeError: rank 1's loss is NaN"), ("die", "rank 1 was trial_killed")],
)
def test_a_failing_rank_under_ddp_ends_the_trial_with_its_own_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, said: str
) -> None:
    """The other rank's all-reduce fails too when its peer goes; the reason is the peer's."""
    monkeypatch.setenv("TUNER_TEST_RANK_ONE", mode)
    settings = LoaderSettings(batch=16, num_workers=1)
    job = Job(Mode.MEASURE, f"{W}:linear", {}, settings, "cpu", 0.5, 0.2, nproc_per_node=2)
    receiver, sender = multiprocessing.Pipe(duplex=False)
    run_ranks(sender, _measure_in, workloads.linear(), job)
    messages = []
    while receiver.poll(0):
        messages.append(receiver.recv())
    (outcome,) = [m for m in messages if isinstance(m, Result | Failure)]
    assert isinstance(outcome, Failure) and said in outcome.error
