"""A workload from a real Lightning DataModule and module: its step trains, bad input is one
line, ``--objective`` takes the script, and a real study of it completes."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import optuna
import pytest
import torch
from torch.utils.data import DataLoader

from objectives import WorkloadError, load_workload
from tests.conftest import run_python, study_cli
from tests.objectives_tests import lightning_script as script
from tuner._attrs import trial_settings
from tuner.integrations.lightning import first_optimizer, workload_from_lightning

SCRIPT = Path(script.__file__)
CPU = torch.device("cpu")


def _one_batch(workload_dataset: object, size: int = 16) -> object:
    return next(iter(DataLoader(workload_dataset, batch_size=size)))  # type: ignore[arg-type]


def _train_once(module: script.Regressor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's weight before and after one measured step and optimizer step."""
    data = script.LineData()
    workload = workload_from_lightning(data, module)
    step = workload.train_step(CPU)
    before = module.layer.weight.detach().clone()
    step(_one_batch(workload.dataset))
    step.optimizer_step()
    return before, module.layer.weight.detach().clone()


def test_the_datamodule_is_set_up_and_its_loader_becomes_the_workload() -> None:
    data = script.LineData(batch_size=24)
    workload = workload_from_lightning(data, script.Regressor(), name="mine")
    assert data.prepared and data.stage == "fit"
    assert workload.name == "mine" and workload.default_batch_size == 24
    assert workload.dataset is data.dataset and workload.sampler is None  # shuffle=True
    assert workload.make_step is not None


def test_the_step_trains_the_model_without_a_trainer_and_without_log_warnings() -> None:
    module = script.Regressor()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # self.log without a Trainer would warn
        before, after = _train_once(module)
    assert not torch.equal(before, after)
    assert module.layer.weight.grad is None  # optimizer_step zeroes the gradients
    assert "log" not in vars(module)  # the module's own log is back for a later Trainer


@pytest.mark.parametrize("module_class", [script.DictLoss, script.WithScheduler])
def test_a_dict_loss_no_batch_idx_and_optimizers_with_schedulers_train(module_class: type) -> None:
    before, after = _train_once(module_class())
    assert not torch.equal(before, after)


def test_a_step_returning_none_is_skipped() -> None:
    module = script.Skips()
    before, after = _train_once(module)
    assert torch.equal(before, after) and module.layer.weight.grad is None


def test_a_step_that_needs_the_trainer_fails_with_lightnings_own_error() -> None:
    workload = workload_from_lightning(script.LineData(), script.NeedsTrainer())
    step = workload.train_step(CPU)
    with pytest.raises(RuntimeError, match="is not attached to a `Trainer`"):
        step(_one_batch(workload.dataset))


def test_the_first_optimizer_of_each_form_configure_optimizers_may_return() -> None:
    sgd = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    adam = torch.optim.Adam(torch.nn.Linear(1, 1).parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(sgd, step_size=1)
    forms = [
        sgd,
        [sgd, adam],
        (sgd,),
        {"optimizer": sgd, "lr_scheduler": scheduler},
        [{"optimizer": sgd}, {"optimizer": adam}],
        ([sgd, adam], [scheduler]),
    ]
    assert all(first_optimizer(form) is sgd for form in forms)
    assert first_optimizer(None) is None and first_optimizer([]) is None


@pytest.mark.parametrize(
    ("datamodule", "module", "message"),
    [
        (script.DictOfLoaders, script.Regressor, "returned a dict of loaders"),
        (script.ListOfLoaders, script.Regressor, "returned a list of loaders"),
        (script.Combined, script.Regressor, "returned a CombinedLoader of loaders"),
        (script.Streaming, script.Regressor, "has an IterableDataset (Stream)"),
        (script.NoTrainLoader, script.Regressor, "NoTrainLoader has no train_dataloader()"),
        (script.LineData, script.NoOptimizer, "configure_optimizers() returned no optimizer"),
        (script.LineData, script.Manual, "uses manual optimization"),
        (script.LineData, torch.nn.Linear, "expected a LightningModule, got Linear"),
    ],
)
def test_what_the_tuner_cannot_measure_is_one_clear_line(
    datamodule: type, module: type, message: str
) -> None:
    instance = module(1, 1) if module is torch.nn.Linear else module()
    with pytest.raises(WorkloadError, match=re.escape(message)) as caught:
        workload_from_lightning(datamodule(), instance)
    assert "\n" not in str(caught.value)


def test_objective_takes_a_function_returning_a_lightning_workload() -> None:
    workload = load_workload(f"{SCRIPT}:workload")
    assert workload.name == "lightning" and workload.default_batch_size == 32
    assert workload.make_step is not None
    with pytest.raises(
        WorkloadError,
        match=re.escape("combined_pair: Combined.train_dataloader() returned a CombinedLoader"),
    ) as caught:
        load_workload(f"{SCRIPT}:combined_pair")
    assert "\n" not in str(caught.value)


def test_a_bare_datamodule_and_module_pair_is_refused_with_the_way_to_build_it() -> None:
    with pytest.raises(
        WorkloadError, match=re.escape("workload_from_lightning(datamodule")
    ) as caught:
        load_workload(f"{SCRIPT}:pair")
    assert "\n" not in str(caught.value)


def test_importing_objectives_and_loading_a_plain_workload_does_not_import_lightning() -> None:
    code = (
        "import sys; import objectives, tuner.study; "
        "objectives.load_workload('tests.objectives_tests.dataloader_script:LOADER'); "
        "assert not [m for m in sys.modules if 'lightning' in m], 'lightning imported'"
    )
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_a_study_of_a_lightning_script_completes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    result = study_cli(url, f"{SCRIPT}:workload", "--n-trials", "3", "--remeasure-top", "0")
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name=None, storage=url)
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == 3, [(t.state, t.user_attrs.get("error")) for t in study.trials]
    baseline = next(t for t in finished if t.user_attrs.get("baseline") == "pytorch-default")
    assert trial_settings(baseline).batch == 32  # the DataModule's own batch size
    assert all(t.value and t.value > 0 for t in finished)
