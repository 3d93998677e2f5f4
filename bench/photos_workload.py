"""A user-style workload, written as a user writes one: JPEG files decoded and augmented with
PIL in ``__getitem__``, a small CNN trained by a plain step function that owns its optimizer.

    python -m tuner.study --hardware auto --objective bench.photos_workload:workload

It is the shape of the workload in issue 11 (decode + augmentation per sample, a small conv
step, 2 cores), and deliberately not the built-in image workload: files on disk rather than an
in-memory blob, colour jitter besides crop and flip, a 3x3 conv stack, no knobs. The JPEGs are
generated locally (no network) once, into ``$TUNER_CACHE_DIR`` (else
``~/.cache/dataloader-tuner``) ``/photos-<count>x<size>px/``; ``bench.deliver`` makes them
before its study, and any process that finds them missing makes them atomically.

``off_cpu`` is the same files with a step that sleeps instead of training (``--objective
bench.photos_workload:off_cpu``): the shape of a GPU machine, where the workers decode on the
CPU and the host waits while the device steps, so the main process's threads have nothing to do
and every worker beyond the cores takes CPU from the process that feeds the device.
"""

from __future__ import annotations

import dataclasses
import io
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance
from torch import nn
from torch.utils.data import Dataset

from objectives import Workload
from objectives.image import _generate_jpegs, cache_dir, random_resized_crop_box

__all__ = ["PhotoFolder", "make_photos", "off_cpu", "sleeping_step", "step", "workload"]

COUNT, SIZE, CROP = 512, 128, 96
STEP_BATCH_S, STEP_SAMPLE_S = 0.005, 0.0005
"""The sleeping step's wall time: 5 ms a batch (a launch and a synchronisation) and 0.5 ms a
sample, so the step alone runs at 1,500-1,900 samples/s at batch 32-128, above what two cores
decode: the loader is what a setting changes, as on a GPU machine fed by few cores."""
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def make_photos(count: int = COUNT, size: int = SIZE) -> Path:
    """The folder of ``count`` JPEGs of ``size`` px, written once (renamed into place whole)."""
    folder = cache_dir() / f"photos-{count}x{size}px"
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    blob, offsets, labels = _generate_jpegs(count, size, seed=11)
    for index in range(count):
        name = f"{labels[index]}-{index:05d}.jpg"
        (staging / name).write_bytes(blob[offsets[index] : offsets[index + 1]])
    try:
        os.rename(staging, folder)
    except OSError:  # another process got there first: theirs is as good
        shutil.rmtree(staging, ignore_errors=True)
    return folder


class PhotoFolder(Dataset):
    """``<label>-<n>.jpg`` files: read, decode, random-resized crop, flip, jitter, normalise."""

    def __init__(self, root: Path, crop: int = CROP) -> None:
        self.paths = sorted(str(path) for path in root.glob("*.jpg"))
        self.crop = crop

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.paths[index]
        with open(path, "rb") as file:
            image = Image.open(io.BytesIO(file.read())).convert("RGB")
        box = random_resized_crop_box(image.width, image.height)
        image = image.resize((self.crop, self.crop), Image.Resampling.BILINEAR, box=box)
        if random.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        image = ImageEnhance.Brightness(image).enhance(random.uniform(0.8, 1.2))
        image = ImageEnhance.Contrast(image).enhance(random.uniform(0.8, 1.2))
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        chw = pixels.view(self.crop, self.crop, 3).permute(2, 0, 1).float().div_(255)
        label = int(Path(path).name.split("-", 1)[0])
        return (chw - MEAN) / STD, label


def _model() -> nn.Module:
    def block(channels_in: int, channels_out: int) -> list[nn.Module]:
        return [
            nn.Conv2d(channels_in, channels_out, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(channels_out),
            nn.ReLU(inplace=True),
        ]

    return nn.Sequential(
        *block(3, 8),
        *block(8, 16),
        *block(16, 32),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


_trained: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {}


def step(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    """One SGD step of the small CNN; the model is made on first use in each process."""
    if str(device) not in _trained:
        model = _model().to(device).train()
        _trained[str(device)] = model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = _trained[str(device)]
    images, labels = batch
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def workload() -> Workload:
    return Workload(
        name="photos",
        dataset=PhotoFolder(make_photos()),
        step=step,
        default_batch_size=32,
        batch_size_range=(8, 256),
        description=f"photos: {COUNT} JPEG files {SIZE}px, PIL crop/flip/jitter, 3x3 CNN",
    )


def sleeping_step(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    """The step of a device the host waits on: :data:`STEP_BATCH_S` a batch and
    :data:`STEP_SAMPLE_S` a sample of wall time, no CPU."""
    time.sleep(STEP_BATCH_S + STEP_SAMPLE_S * len(batch[0]))


def off_cpu() -> Workload:
    """The photos with :func:`sleeping_step` in place of the CNN's."""
    return dataclasses.replace(
        workload(),
        name="off_cpu",
        step=sleeping_step,
        description=f"off_cpu: {COUNT} JPEG files {SIZE}px, PIL crop/flip/jitter, a sleeping step",
    )
