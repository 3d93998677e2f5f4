"""Turning a stored setting into what users paste: the parameter rows and a ready snippet.

The snippet carries the whole setting as code: ``torch.set_num_threads`` first, the workload's
knobs through its own ``configure`` (loaded from the study's objective, so the dataset and
collate function are the ones measured), a token budget through the workload's batch sampler,
then the ``DataLoader(...)`` call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.search import LoaderSettings

__all__ = ["dataloader_snippet", "extra_settings"]

KEEP_YOURS = "    # your collate_fn, drop_last, ... as they are (a sampler in place of shuffle)"
"""The snippet's reminder where it builds on the user's dataset: the rest stays theirs."""


def extra_settings(settings: LoaderSettings, batch_param: str) -> dict[str, Any]:
    """What the best setting says beyond DataLoader kwargs: threads, knobs, token budget."""
    extra: dict[str, Any] = {"torch_num_threads": settings.torch_num_threads}
    if batch_param != "batch_size":
        extra[batch_param] = settings.batch
    if settings.accumulation_steps > 1:
        extra["accumulation_steps"] = settings.accumulation_steps
    extra.update(settings.knobs)
    return extra


def _workload_lines(
    settings: LoaderSettings, objective: str, options: Mapping[str, Any]
) -> list[str]:
    arguments = f"{objective!r}, {dict(options)!r}" if options else repr(objective)
    return [
        "# The workload's knobs, applied by its configure(): its dataset and collate.",
        f"workload = load_workload({arguments}).with_knobs({dict(settings.knobs)!r})",
        "dataset = workload.dataset",
    ]


def dataloader_snippet(
    settings: LoaderSettings,
    batch_param: str = "batch_size",
    objective: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> str:
    """Ready code for the setting: threads, knobs (via the workload), ``DataLoader(...)``.

    Without knobs or a batch sampler the snippet uses your ``dataset``; with them, and the
    study's ``objective`` known, it loads the workload and takes its dataset and collate.
    """
    kwargs = settings.dataloader_kwargs(batch_param)
    needs_workload = bool(settings.knobs) or batch_param != "batch_size"
    with_workload = needs_workload and objective is not None
    lines = ["import torch", "from torch.utils.data import DataLoader"]
    if with_workload:
        lines.append("from objectives import load_workload")
    lines.append("")
    lines.append("# The main process's intra-op threads compete with the workers: set as tuned.")
    lines.append(f"torch.set_num_threads({settings.torch_num_threads})")
    if with_workload:
        assert objective is not None
        lines += _workload_lines(settings, objective, options or {})
    arguments = ["    dataset,"]
    if batch_param != "batch_size":
        sampler = (
            f"workload.batch_sampler(dataset, {settings.batch}, 0)"
            if with_workload
            else f"your_batch_sampler({batch_param}={settings.batch})"
        )
        arguments.append(f"    batch_sampler={sampler},")
    else:
        arguments.append("    shuffle=True,")
    if with_workload:
        arguments.append("    collate_fn=workload.collate_fn,")
    else:
        arguments.append(KEEP_YOURS)
    arguments += [f"    {key}={value!r}," for key, value in kwargs.items()]
    lines += ["loader = DataLoader(", *arguments, ")"]
    if settings.accumulation_steps > 1:
        lines.append(f"# step the optimizer every {settings.accumulation_steps} batches")
    if not with_workload:
        for knob, value in settings.knobs.items():
            lines.append(f"# workload knob: {knob}={value!r} (apply it in your dataset/collate)")
    return "\n".join(lines)
