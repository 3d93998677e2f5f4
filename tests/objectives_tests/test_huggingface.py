"""A workload from a real Hugging Face Trainer: what it takes from it, its step, a real study.

The Trainer is real (transformers, datasets and accelerate as installed), its model a tiny BERT
built from a config and its dataset token ids made in code (``hf_script``): nothing is mocked
and nothing is downloaded.
"""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import Trainer

from objectives import WorkloadError, load_workload, move_to_device
from tests.conftest import run_python, study_cli
from tests.objectives_tests import hf_script
from tuner._attrs import trial_settings
from tuner.integrations.huggingface import workload_from_trainer
from tuner.search._settings import LoaderSettings

SCRIPT = Path(hf_script.__file__)
CPU = torch.device("cpu")


def _batch(workload, size: int = 8):  # type: ignore[no-untyped-def]
    kwargs = LoaderSettings(batch=size, num_workers=0).build_dataloader_kwargs(workload, seed=0)
    return move_to_device(next(iter(DataLoader(workload.dataset, **kwargs))), CPU)


def test_the_dataset_collator_batch_and_worker_settings_are_the_trainers() -> None:
    trainer = hf_script.make_trainer()
    workload = load_workload(f"{SCRIPT}:workload")
    loader = trainer.get_train_dataloader()
    # The dataset the Trainer loads from: the string column its model does not take is gone.
    assert workload.dataset.column_names == loader.dataset.column_names
    assert "text" not in workload.dataset.column_names
    assert workload.collate_fn is loader.collate_fn is trainer.data_collator
    assert workload.default_batch_size == 12 and workload.batch_size_range == (8, 512)
    assert workload.sampler is None  # the Trainer's random sampler: the tuner shuffles alike
    assert workload.drop_last is False
    assert dict(workload.current) == {
        "num_workers": 2,
        "prefetch_factor": 3,
        "pin_memory": False,
        "persistent_workers": True,
    }
    batch = _batch(workload)
    assert sorted(batch) == ["attention_mask", "input_ids", "labels"]
    assert batch["input_ids"].shape == (8, hf_script.LENGTH)


def test_a_torch_dataset_keeps_the_collator_that_drops_what_the_model_does_not_take() -> None:
    trainer = hf_script.make_trainer(train_dataset=hf_script.TokenDicts())
    workload = workload_from_trainer(trainer)
    assert workload.dataset is trainer.train_dataset
    assert type(workload.collate_fn).__name__ == "RemoveColumnsCollator"  # as the Trainer wraps
    assert sorted(_batch(workload)) == ["input_ids", "labels"]


def test_no_workers_pinning_and_drop_last_come_from_the_training_arguments() -> None:
    args = hf_script.make_args(
        dataloader_num_workers=0,
        dataloader_prefetch_factor=None,
        dataloader_persistent_workers=False,
        dataloader_pin_memory=True,
        dataloader_drop_last=True,
        per_device_train_batch_size=1024,
        use_cpu=False,  # use_cpu=True turns pinning off, in the arguments the Trainer reads
    )
    workload = workload_from_trainer(hf_script.make_trainer(args))
    assert dict(workload.current) == {
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": True,
        "persistent_workers": False,
    }
    assert workload.drop_last is True
    assert workload.default_batch_size == 1024 and workload.batch_size_range == (8, 1024)


def test_the_step_is_one_real_optimizer_step_of_the_trainers_optimizer() -> None:
    workload = load_workload(f"{SCRIPT}:workload")
    step = workload.train_step(CPU)
    assert type(step.optimizer).__name__ == "AdamW"  # TrainingArguments' default optim
    assert step.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)  # its learning_rate
    before = [p.detach().clone() for p in step.model.parameters()]
    step(_batch(workload))
    assert all(p.grad is not None for p in step.model.parameters() if p.requires_grad)
    assert all(torch.equal(a, p) for a, p in zip(before, step.model.parameters(), strict=True))
    step.optimizer_step()
    changed = [not torch.equal(a, p) for a, p in zip(before, step.model.parameters(), strict=True)]
    assert all(changed)
    assert all(p.grad is None for p in step.model.parameters())


def test_an_optimizer_given_to_the_trainer_is_the_one_stepped() -> None:
    model = hf_script.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    trainer = Trainer(
        model=model,
        args=hf_script.make_args(),
        train_dataset=hf_script.make_dataset(),
        optimizers=(optimizer, None),
    )
    workload = workload_from_trainer(trainer)
    step = workload.train_step(CPU)
    assert step.optimizer is optimizer
    weight = model.classifier.weight.detach().clone()
    step(_batch(workload))
    step.optimizer_step()
    assert not torch.equal(weight, model.classifier.weight)


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("no_dataset", "the Trainer has no train_dataset"),
        ("streaming", "train_dataset is an iterable dataset (IterableDataset)"),
        ("batch_rebalance", "builds its own batches (BatchRebalanceSampler)"),
        ("not_a_trainer", "expected a transformers.Trainer, got TrainingArguments"),
    ],
)
def test_what_cannot_be_tuned_is_one_clear_line(attr: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=re.escape(message)) as caught:
        load_workload(f"{SCRIPT}:{attr}")
    assert str(caught.value).startswith(f"{SCRIPT}:{attr}: ")  # the spec, then why
    assert "\n" not in str(caught.value)


def test_importing_the_tuner_does_not_import_transformers() -> None:
    code = (
        "import sys, objectives, tuner, tuner.best, tuner.integrations.huggingface\n"
        "print(sorted(m for m in ('transformers', 'datasets', 'accelerate') if m in sys.modules))"
    )
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_study_of_a_trainer_runs_its_arguments_as_the_baseline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    result = study_cli(url, f"{SCRIPT}:workload", "--n-trials", "3", "--remeasure-top", "0")
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name=None, storage=url)
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 3, [
        t.user_attrs.get("error") for t in study.trials
    ]
    baseline = next(t for t in study.trials if t.user_attrs.get("baseline") == "pytorch-default")
    today = trial_settings(baseline)
    assert (today.num_workers, today.prefetch_factor, today.persistent_workers) == (2, 3, True)
    assert today.batch == 12  # the Trainer's own batch, though not a power of two
    assert all(t.value and t.value > 0 for t in study.trials)
