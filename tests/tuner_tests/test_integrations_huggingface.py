"""A tuned setting back into a real Hugging Face Trainer: the README's example, run as written.

The module's study is the README's "From a Hugging Face Trainer" example: its script
(``hf_train.py``, quoted word for word) and its three commands, in a fresh folder, the study
given short trials. Then the ``--format hf`` code is pasted into a fresh interpreter, and
``tuned_training_arguments`` builds a real Trainer whose training DataLoader is checked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch

from objectives import WorkloadError
from tests.conftest import QUICK_TRIALS, ROOT
from tests.objectives_tests import hf_script
from tuner import best_setting
from tuner._attrs import trial_settings
from tuner.insight import BestSetting
from tuner.integrations.huggingface import training_arguments, tuned_training_arguments
from tuner.search._settings import LoaderSettings

EXAMPLE = Path(__file__).with_name("hf_train.py")
SECTION = "## From a Hugging Face Trainer"
STUDY_FLAGS = ("--n-trials", "3", "--remeasure-top", "0", *QUICK_TRIALS)
"""Added to the README's study command only: short trials, so the test takes seconds."""
FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "dataloader_num_workers",
    "dataloader_prefetch_factor",
    "dataloader_pin_memory",
    "dataloader_persistent_workers",
)


def _readme_block(language: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert match, f"no {language} block under {SECTION!r}"
    return match.group(1)


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TUNER_STORAGE", None)  # the README's commands use ./tuner.db
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@dataclasses.dataclass(frozen=True)
class Example:
    folder: Path
    results: list[subprocess.CompletedProcess[str]]

    @property
    def url(self) -> str:
        return f"sqlite:///{self.folder / 'tuner.db'}"

    @property
    def objective(self) -> str:
        return f"{self.folder / 'hf_train.py'}:workload"

    def best(self) -> BestSetting:
        return best_setting("auto", objective=self.objective, storage=self.url)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Example:
    """The README's script in a fresh folder and its commands run there, one after another."""
    folder = tmp_path_factory.mktemp("hf-readme")
    (folder / "hf_train.py").write_text(_readme_block("python"))
    results = []
    for line in _readme_block("sh").splitlines():
        argv = shlex.split(line)
        if argv[0] == "python":
            argv[0] = sys.executable
        if argv[1:3] == ["-m", "tuner.study"]:
            argv += STUDY_FLAGS
        results.append(_run(argv, folder))
    return Example(folder, results)


def test_the_readme_quotes_the_example_file_word_for_word() -> None:
    assert _readme_block("python") == EXAMPLE.read_text()


@pytest.mark.slow
def test_the_readme_example_tunes_prints_and_trains_as_written(example: Example) -> None:
    assert len(example.results) == 3
    for result in example.results:
        assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name=None, storage=example.url)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert "TrainingArguments(" in example.results[1].stdout
    assert "train_runtime" in example.results[2].stdout  # the Trainer trained, tuned


@pytest.mark.slow
def test_the_format_hf_code_pasted_into_a_fresh_process_builds_the_tuned_arguments(
    example: Example, tmp_path: Path
) -> None:
    best = example.best()
    code = example.results[1].stdout
    assert code.startswith(f"# {best.study_name}: trial {best.trial_number}, ")
    other = 1 if best.torch_num_threads > 1 else 2
    prelude = f"import torch\ntorch.set_num_threads({other})\n"
    observe = (
        "\nimport json\n"
        f"print(json.dumps({{**{{k: getattr(args, k) for k in {FIELDS!r}}}, "
        '"threads": torch.get_num_threads()}))\n'
    )
    result = _run([sys.executable, "-c", prelude + code + observe], tmp_path)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got == {**training_arguments(best), "threads": best.torch_num_threads}


@pytest.mark.slow
def test_tuned_training_arguments_give_a_trainer_that_loads_as_tuned(example: Example) -> None:
    best = example.best()
    args = hf_script.make_args(learning_rate=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if best.torch_num_threads > 1 else 2)
    try:
        tuned = tuned_training_arguments(args, objective=example.objective, storage=example.url)
        assert torch.get_num_threads() == best.torch_num_threads
    finally:
        torch.set_num_threads(threads)
    assert args.per_device_train_batch_size == 12  # the arguments passed in are left alone
    assert tuned.learning_rate == 3e-3 and tuned.output_dir == args.output_dir
    # Each field against the stored setting itself (not the arguments the code builds from it).
    setting = best.settings
    assert tuned.per_device_train_batch_size == setting.batch
    assert tuned.gradient_accumulation_steps == setting.accumulation_steps
    assert tuned.per_device_train_batch_size * tuned.gradient_accumulation_steps == 32
    assert tuned.dataloader_num_workers == setting.num_workers
    assert tuned.dataloader_pin_memory == setting.pin_memory
    assert tuned.dataloader_prefetch_factor == setting.prefetch_factor
    assert tuned.dataloader_persistent_workers == setting.persistent_workers
    assert {key: getattr(tuned, key) for key in FIELDS} == training_arguments(best)

    loader = hf_script.make_trainer(tuned).get_train_dataloader()
    kwargs = best.dataloader_kwargs
    assert loader.batch_sampler.batch_size == best.batch  # accelerate re-batches it
    assert loader.num_workers == kwargs["num_workers"]
    assert loader.pin_memory == kwargs["pin_memory"]
    assert loader.prefetch_factor == kwargs.get("prefetch_factor")
    assert loader.persistent_workers == kwargs.get("persistent_workers", False)
    assert next(iter(loader))["input_ids"].shape[0] == best.batch


@pytest.mark.slow
def test_training_arguments_keep_the_effective_batch_of_every_trial(example: Example) -> None:
    best = example.best()
    assert best.effective_batch == 32  # the README's --effective-batch
    study = optuna.load_study(study_name=best.study_name, storage=example.url)
    for trial in study.trials:
        fields = training_arguments(dataclasses.replace(best, settings=trial_settings(trial)))
        batch, steps = fields["per_device_train_batch_size"], fields["gradient_accumulation_steps"]
        assert batch * steps == 32, fields
        if fields["dataloader_num_workers"] == 0:
            assert fields["dataloader_prefetch_factor"] is None
            assert fields["dataloader_persistent_workers"] is False


def test_a_token_budget_is_not_a_per_device_batch_size() -> None:
    best = BestSetting(
        study_name="text@box",
        trial_number=3,
        settings=LoaderSettings(batch=4096, num_workers=2, prefetch_factor=2),
        batch_param="max_tokens",
        samples_per_sec=10.0,
        remeasured=False,
        window_samples_per_sec=10.0,
        finished_trials=4,
    )
    with pytest.raises(WorkloadError, match="tuned max_tokens") as caught:
        training_arguments(best)
    assert "\n" not in str(caught.value)
