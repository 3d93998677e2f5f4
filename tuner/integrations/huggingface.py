"""A tuned setting as Hugging Face ``TrainingArguments``: the paste-able snippet and the helper.

``TrainingArguments`` carries the batch and every DataLoader knob (``dataloader_*``) but not
the main process's intra-op threads, which compete with the DataLoader workers for the same
cores; both the snippet and :func:`tuned_training_arguments` set them with
``torch.set_num_threads``. transformers is imported only inside the helper.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tuner._loader import fit_to_machine, live_profile
from tuner.insight import BestSetting, best_setting

__all__ = ["training_arguments_snippet", "tuned_training_arguments"]


def tuned_training_arguments(
    args: Any,
    hardware: str = "auto",
    *,
    objective: str,
    storage: str | None = None,
    study_name: str | None = None,
    set_threads: bool = True,
    profiles_file: str | None = None,
) -> Any:
    """``args`` (a ``TrainingArguments``) with the tuned batch, accumulation and DataLoader
    fields of ``<objective>@<hardware>``, fitted to the live machine as ``tuner.loader`` fits
    them (fewer usable CPUs: fewer workers), everything else as it was; a new object.

    With ``set_threads`` the tuned intra-op threads are set too (:meth:`BestSetting.apply`,
    logged), since TrainingArguments cannot carry them. Raises ``tuner.NoResultError`` when
    there is no study or no finished trial.
    """
    best = best_setting(
        hardware,
        objective=objective,
        storage=storage,
        study_name=study_name,
        profiles_file=profiles_file,
    )
    profile = live_profile(hardware, profiles_file)
    best = dataclasses.replace(best, settings=fit_to_machine(best.settings, profile))
    tuned = dataclasses.replace(args, **best.training_arguments())
    if set_threads:
        best.apply()
    return tuned


def training_arguments_snippet(best: BestSetting) -> str:
    """The ``--format hf`` code: threads, then ``TrainingArguments`` with the tuned fields."""
    lines = [
        f"# {best.summary()}",
        "import torch",
        "from transformers import TrainingArguments",
        "",
        "# TrainingArguments has no thread setting, yet the training step's intra-op threads",
        "# share the cores with the DataLoader workers: set them as tuned, before training.",
        f"torch.set_num_threads({best.torch_num_threads})",
        "args = TrainingArguments(",
        '    output_dir="trainer_output",  # yours, with the rest of your arguments',
        *(f"    {key}={value!r}," for key, value in best.training_arguments().items()),
        ")",
    ]
    if best.knobs:
        lines.append(f"# the workload's knobs, applied by its configure(): {best.knobs!r}")
    return "\n".join(lines)
