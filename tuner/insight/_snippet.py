"""Turning a stored setting into what users paste: DataLoader kwargs and a ready snippet."""

from __future__ import annotations

from typing import Any

from tuner.search._settings import LoaderSettings

__all__ = ["dataloader_snippet", "extra_settings"]


def extra_settings(settings: LoaderSettings, batch_param: str) -> dict[str, Any]:
    """What the best setting says beyond DataLoader kwargs: threads, knobs, token budget."""
    extra: dict[str, Any] = {"torch_num_threads": settings.torch_num_threads}
    if batch_param != "batch_size":
        extra[batch_param] = settings.batch
    if settings.accumulation_steps > 1:
        extra["accumulation_steps"] = settings.accumulation_steps
    extra.update(settings.knobs)
    return extra


def dataloader_snippet(settings: LoaderSettings, batch_param: str = "batch_size") -> str:
    """A ready ``DataLoader(...)`` call with the setting's values."""
    kwargs = settings.dataloader_kwargs(batch_param)
    lines = ["import torch", "from torch.utils.data import DataLoader", ""]
    lines.append(f"torch.set_num_threads({settings.torch_num_threads})")
    arguments = ["    dataset,"]
    if batch_param != "batch_size":
        arguments.append(f"    batch_sampler=your_batch_sampler({batch_param}={settings.batch}),")
    else:
        arguments.append("    shuffle=True,")
    arguments += [f"    {key}={value!r}," for key, value in kwargs.items()]
    lines += ["loader = DataLoader(", *arguments, ")"]
    if settings.accumulation_steps > 1:
        lines.append(f"# step the optimizer every {settings.accumulation_steps} batches")
    for knob, value in settings.knobs.items():
        lines.append(f"# workload knob: {knob}={value!r}")
    return "\n".join(lines)
