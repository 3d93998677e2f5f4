"""The tuned setting in a real Lightning ``Trainer`` run, and the README's example run as it is.

One real study of the README's example (``lightning_example/train_lightning.py:workload``),
with the batch size fixed so the tuned setting is known to differ from the DataModule's own
(24; the tuner's batch sizes are powers of two) and ``--effective-batch`` so it accumulates;
then real ``Trainer.fit`` runs, on the CPU, that look at their own DataLoader from inside the
run and see the stored best's batch size, workers, prefetch, pinning and threads.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler

from objectives import WorkloadError
from tests.conftest import ROOT, run_python, study_cli
from tuner.insight._best import BestSetting, best_setting
from tuner.integrations.lightning import TunedDataLoaders, tuned_dataloader
from tuner.search._settings import LoaderSettings

EXAMPLE_DIR = Path(__file__).parent / "lightning_example"
EXAMPLE = EXAMPLE_DIR / "train_lightning.py"
OBJECTIVE = "train_lightning.py:workload"
QUIET = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),  # Lightning's advice on few workers
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning's own use of torch's pytree
]


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    """The README's example module, imported as the study's trials import it (its folder
    first on ``sys.path``, for ``my_lightning``)."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    yield importlib.import_module("train_lightning")
    monkeypatch.undo()


@pytest.fixture(scope="module")
def tuned_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A storage holding a finished study of the example: batch 16 x 4 micro-batches."""
    url = f"sqlite:///{tmp_path_factory.mktemp('lightning') / 'tuner.db'}"
    flags = ("--n-trials", "3", "--remeasure-top", "0", "--effective-batch", "64")
    result = study_cli(url, f"{EXAMPLE}:workload", *flags, "--fix", "batch_size=16")
    assert result.returncode == 0, result.stderr
    return url


class Probe(L.Callback):
    """What the run trains with, read from inside it at each batch."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        loader = trainer.train_dataloader
        batch = args[1]
        self.seen.append(
            {
                "batch_size": loader.batch_size,
                "num_workers": loader.num_workers,
                "prefetch_factor": loader.prefetch_factor if loader.num_workers else None,
                "persistent_workers": loader.persistent_workers,
                "pin_memory": loader.pin_memory,
                "rows": len(batch[0]),
                "threads": torch.get_num_threads(),
                "accumulate": trainer.accumulate_grad_batches,
            }
        )


def _expected(best: BestSetting) -> dict[str, Any]:
    """What the probe must see: the stored best, batch 16 in 4 micro-batches as fixed."""
    kwargs = best.dataloader_kwargs
    return {
        "batch_size": 16,
        "num_workers": kwargs["num_workers"],
        "prefetch_factor": kwargs.get("prefetch_factor"),
        "persistent_workers": kwargs.get("persistent_workers", False),
        "pin_memory": kwargs["pin_memory"],
        "rows": 16,
        "threads": best.torch_num_threads,
        "accumulate": 4,
    }


def _readme_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## From PyTorch Lightning", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "no python block in the README's Lightning section"
    return match.group(1)


def test_the_readme_quotes_the_example_word_for_word() -> None:
    assert _readme_block() == EXAMPLE.read_text()


def _quiet_init(worker_id: int) -> None:
    """The user's worker init: kept as it is."""


def test_tuned_dataloader_keeps_what_the_study_did_not_tune() -> None:
    generator = torch.Generator().manual_seed(3)
    own = DataLoader(
        list(range(40)),
        batch_size=5,
        sampler=SequentialSampler(range(40)),
        drop_last=True,
        collate_fn=torch.tensor,
        worker_init_fn=_quiet_init,
        generator=generator,
        timeout=7,
    )
    settings = LoaderSettings(batch=8, num_workers=1, prefetch_factor=3, persistent_workers=True)
    tuned = tuned_dataloader(own, settings)
    assert (tuned.batch_size, tuned.num_workers, tuned.prefetch_factor) == (8, 1, 3)
    assert tuned.persistent_workers and not tuned.pin_memory
    assert tuned.dataset is own.dataset and tuned.sampler is own.sampler
    assert tuned.collate_fn is torch.tensor and tuned.drop_last
    assert (
        tuned.worker_init_fn is _quiet_init and tuned.generator is generator and tuned.timeout == 7
    )
    assert [batch.tolist() for batch in tuned][:1] == [list(range(8))]


def test_a_token_budget_is_not_a_batch_size_one_line() -> None:
    best = BestSetting(
        study_name="s",
        trial_number=0,
        settings=LoaderSettings(batch=4096, num_workers=0),
        batch_param="max_tokens",
        samples_per_sec=1.0,
        remeasured=False,
        window_samples_per_sec=1.0,
        finished_trials=1,
    )
    with pytest.raises(WorkloadError, match="max_tokens=4096 is a batch sampler's") as caught:
        tuned_dataloader(DataLoader(list(range(8)), batch_size=2), best)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_without_a_study_the_run_trains_with_its_own_loader_and_a_warning(
    example: ModuleType, tmp_path: Path
) -> None:
    probe = Probe()
    tuned = TunedDataLoaders(objective=OBJECTIVE, storage=f"sqlite:///{tmp_path / 'none.db'}")
    trainer = L.Trainer(max_steps=2, callbacks=[tuned, probe], **QUIET)
    with pytest.warns(UserWarning, match="TunedDataLoaders: no study"):
        trainer.fit(example.Model(), datamodule=example.Data())
    assert tuned.best is None
    assert {(seen["batch_size"], seen["num_workers"]) for seen in probe.seen} == {(24, 0)}


@pytest.mark.slow
def test_a_fit_with_the_callback_trains_with_the_tuned_loader_threads_and_accumulation(
    example: ModuleType, tuned_url: str
) -> None:
    best = best_setting("auto", objective=OBJECTIVE, storage=tuned_url)
    probe, data = Probe(), example.Data()
    tuned = TunedDataLoaders(objective=OBJECTIVE, storage=tuned_url)
    trainer = L.Trainer(max_steps=3, callbacks=[tuned, probe], **QUIET)
    trainer.fit(example.Model(), datamodule=data)
    assert trainer.global_step == 3 and len(probe.seen) == 12  # 3 steps x 4 micro-batches
    assert all(seen == _expected(best) for seen in probe.seen), probe.seen[0]
    assert "train_dataloader" not in vars(data)  # the DataModule is its own again
    assert trainer.accumulate_grad_batches == 1
    assert data.val_dataloader().batch_size == 24  # only training was tuned


@pytest.mark.slow
def test_a_loader_given_to_fit_is_tuned_too(example: ModuleType, tuned_url: str) -> None:
    probe, data = Probe(), example.Data()
    data.setup("fit")
    trainer = L.Trainer(
        max_steps=1,
        callbacks=[
            TunedDataLoaders(objective=OBJECTIVE, storage=tuned_url, set_threads=False),
            probe,
        ],
        **QUIET,
    )
    trainer.fit(example.Model(), train_dataloaders=data.train_dataloader())
    workers = best_setting("auto", objective=OBJECTIVE, storage=tuned_url).dataloader_kwargs[
        "num_workers"
    ]
    assert {(seen["batch_size"], seen["num_workers"]) for seen in probe.seen} == {(16, workers)}


@pytest.mark.slow
def test_the_readme_example_trains_as_written(
    example: ModuleType, tuned_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TUNER_STORAGE", tuned_url)
    monkeypatch.chdir(tmp_path)
    trainer = example.train(max_steps=3, **QUIET)
    assert trainer.global_step == 3 and trainer.accumulate_grad_batches == 1
    (tuned,) = [c for c in trainer.callbacks if isinstance(c, TunedDataLoaders)]
    assert tuned.best is not None and tuned.best.batch == 16


def test_without_lightning_the_import_says_what_to_install() -> None:
    """Lightning missing (its modules blocked, as an interpreter without it finds them)."""
    code = (
        "import sys\n"
        "sys.modules['lightning'] = sys.modules['lightning.pytorch'] = None\n"
        "import tuner, objectives\n"
        "try:\n"
        "    import tuner.integrations.lightning\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pip install 'dataloader-tuner[lightning]'" in result.stdout
