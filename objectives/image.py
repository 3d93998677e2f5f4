"""The built-in image workload: JPEG decoding and augmentation in the workers, a CNN on the device.

It is a classification input pipeline as torchvision users write it (decode, random-resized crop,
flip, normalise), without torchvision: the cost per sample is Pillow's, so adding workers helps
as much as it would in a real training job. The JPEGs are generated (no network) once per
``(images, resolution, seed)`` and cached on disk, because every trial runs in a fresh process.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import math
import os
import random
import struct
import tempfile
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFilter
from torch import nn
from torch.utils.data import Dataset, default_collate

from objectives._workload import Workload

__all__ = [
    "COLLATES",
    "MODELS",
    "EncodedImageDataset",
    "ImageFolderDataset",
    "fast_collate",
    "image_workload",
]

COLLATES = ("float", "uint8")
"""``float``: normalised float32 samples from the workers; ``uint8``: normalised on the device."""
MODELS = ("small-cnn", "resnet50")
NUM_CLASSES = 10
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Normalising uint8 pixels directly: (x - 255 * mean) / (255 * std).
_PIXEL_MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1) * 255
_PIXEL_INV_STD = 1 / (torch.tensor(IMAGENET_STD).view(3, 1, 1) * 255)

_NEEDS_TORCHVISION = "arch resnet50 needs torchvision (pip install torchvision)"
_JPEG_QUALITY = 90
_CACHE_MAGIC = b"DLTJPEG1"  # bump when the generator changes, so stale caches are not reused
_CACHE_HEADER = struct.Struct("<8sQ")  # magic, image count


def image_workload(
    images: int = 1024,
    resolution: int = 128,
    crop: int = 112,
    image_dir: str | None = None,
    arch: str = "small-cnn",
    collate: str = "float",
    seed: int = 0,
) -> Workload:
    """Image classification: ``images`` generated JPEGs of ``resolution`` px, or ``image_dir``.

    With ``image_dir`` the files are read from disk in every ``__getitem__`` (disk IO is part of
    the trial) and ``images``/``resolution``/``seed`` are not used.
    """
    _check_choice("arch", arch, MODELS)
    _check_choice("collate", collate, COLLATES)
    if crop < 1:
        raise ValueError(f"crop must be at least 1, got {crop}")
    if arch == "resnet50" and importlib.util.find_spec("torchvision") is None:
        raise ValueError(_NEEDS_TORCHVISION)
    if image_dir is not None:
        dataset: _AugmentedImages = ImageFolderDataset(image_dir, crop, collate)
        source = f"{len(dataset)} files from {image_dir}"
    else:
        dataset = EncodedImageDataset.generated(images, resolution, seed, crop, collate)
        source = f"{images} JPEG {resolution}px"
    return _workload(dataset, arch, f"image: {source} → crop {crop}, {arch}")


def _check_choice(option: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {option} {value!r}; known: {', '.join(choices)}")


def _workload(
    dataset: _AugmentedImages, arch: str, description: str, network: nn.Module | None = None
) -> Workload:
    network = network if network is not None else _network(arch, dataset.num_classes)
    return Workload(
        name="image",
        dataset=dataset,
        collate_fn=fast_collate if dataset.output == "uint8" else None,
        make_step=ImageClassifierStep,
        model=network,
        default_batch_size=32,
        batch_size_range=(8, 512),
        knobs={"collate": COLLATES},
        configure=functools.partial(_configure, dataset, arch, description, network),
        description=f"{description}, collate {dataset.output}",
    )


def _configure(
    dataset: _AugmentedImages, arch: str, description: str, network: nn.Module, *, collate: str
) -> Workload:
    """The same images (no regeneration, no rescan) and network with another collate."""
    _check_choice("collate", collate, COLLATES)
    return _workload(dataset.with_output(collate), arch, description, network)


# Datasets -----------------------------------------------------------------------------------


class _AugmentedImages(Dataset):
    """Decode, random-resized crop, flip and convert one encoded image per ``__getitem__``.

    The randomness comes from the ``random`` module, which the DataLoader reseeds in every worker
    (``base_seed + worker_id``), so forked workers do not repeat each other's crops.
    """

    def __init__(self, labels: Sequence[int], num_classes: int, crop: int, output: str) -> None:
        self.labels = labels
        self.num_classes = num_classes
        self.crop = crop
        self.output = output

    def encoded(self, index: int) -> bytes:
        """The file contents of image ``index``."""
        raise NotImplementedError

    def with_output(self, output: str) -> _AugmentedImages:
        """A shallow copy that returns ``output`` samples (``float`` or ``uint8``)."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__, output=output)
        return copy

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(io.BytesIO(self.encoded(index))) as image:
            image.load()
            if image.mode != "RGB":
                image = image.convert("RGB")
            box = random_resized_crop_box(image.width, image.height)
            image = image.resize((self.crop, self.crop), Image.Resampling.BILINEAR, box=box)
        if random.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        chw = pixels.view(self.crop, self.crop, 3).permute(2, 0, 1)
        if self.output == "uint8":
            return chw, self.labels[index]
        return chw.float().sub_(_PIXEL_MEAN).mul_(_PIXEL_INV_STD), self.labels[index]


class EncodedImageDataset(_AugmentedImages):
    """Encoded images held in memory as one ``bytes`` blob, cheap to fork and to pickle."""

    def __init__(
        self, blob: bytes, offsets: array, labels: bytes, crop: int, output: str = "float"
    ) -> None:
        super().__init__(labels, NUM_CLASSES, crop, output)
        self.blob = blob
        self.offsets = offsets

    @classmethod
    def generated(
        cls, images: int, resolution: int, seed: int, crop: int, output: str = "float"
    ) -> EncodedImageDataset:
        """Generated JPEGs, from the on-disk cache when an earlier process made them."""
        if images < 1:
            raise ValueError(f"images must be at least 1, got {images}")
        if resolution < 8:
            raise ValueError(f"resolution must be at least 8, got {resolution}")
        path = cache_dir() / f"jpeg-{images}x{resolution}px-seed{seed}.bin"
        cached = _read_cache(path)
        if cached is None:
            cached = _generate_jpegs(images, resolution, seed)
            _write_cache_atomically(path, *cached)
        blob, offsets, labels = cached
        return cls(blob, offsets, labels, crop, output)

    def encoded(self, index: int) -> bytes:
        return self.blob[self.offsets[index] : self.offsets[index + 1]]


class ImageFolderDataset(_AugmentedImages):
    """Image files under a folder, read in ``__getitem__``; the label is the first-level subfolder.

    Files directly in the folder get label 0 (a flat folder is one class).
    """

    def __init__(self, image_dir: str | os.PathLike[str], crop: int, output: str = "float") -> None:
        root = Path(image_dir)
        if not root.is_dir():
            raise ValueError(f"image_dir {str(root)!r} is not a directory")
        files = sorted(
            path.relative_to(root)
            for path in root.rglob("*")
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()
        )
        if not files:
            raise ValueError(
                f"image_dir {str(root)!r} has no {'/'.join(IMAGE_SUFFIXES)} images (searched "
                "recursively)"
            )
        classes = sorted({path.parts[0] for path in files if len(path.parts) > 1})
        class_index = {name: index for index, name in enumerate(classes)}
        labels = [class_index[path.parts[0]] if len(path.parts) > 1 else 0 for path in files]
        super().__init__(labels, max(1, len(classes)), crop, output)
        self.paths = [str(root / path) for path in files]

    def encoded(self, index: int) -> bytes:
        with open(self.paths[index], "rb") as file:
            return file.read()


def random_resized_crop_box(
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """A ``(left, upper, right, lower)`` box as torchvision's ``RandomResizedCrop`` picks it."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(*log_ratio))
        crop_width = round(math.sqrt(target_area * aspect))
        crop_height = round(math.sqrt(target_area / aspect))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            left = random.randint(0, width - crop_width)
            upper = random.randint(0, height - crop_height)
            return left, upper, left + crop_width, upper + crop_height
    # Fallback, as torchvision: the largest centre crop inside the ratio bounds.
    if width / height < ratio[0]:
        crop_width, crop_height = width, round(width / ratio[0])
    elif width / height > ratio[1]:
        crop_width, crop_height = round(height * ratio[1]), height
    else:
        crop_width, crop_height = width, height
    left, upper = (width - crop_width) // 2, (height - crop_height) // 2
    return left, upper, left + crop_width, upper + crop_height


def fast_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack uint8 CHW samples into one ``(N, 3, H, W)`` uint8 tensor and int64 labels.

    A quarter of the bytes of float32 cross the worker queue and the host-to-device copy; the
    training step normalises on the device. ``default_collate`` does the stacking because it
    allocates the batch in shared memory inside a worker, which saves a copy.
    """
    images = default_collate([image for image, _ in batch])
    labels = torch.tensor([label for _, label in batch], dtype=torch.int64)
    return images, labels


# Generated JPEGs and their cache ------------------------------------------------------------


def cache_dir() -> Path:
    """``$TUNER_CACHE_DIR``, else ``~/.cache/dataloader-tuner``."""
    configured = os.environ.get("TUNER_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "dataloader-tuner"


def _generate_jpegs(images: int, resolution: int, seed: int) -> tuple[bytes, array, bytes]:
    """Photo-like JPEGs: a colour gradient, blurred shapes and sensor-like noise, quality 90."""
    rng = random.Random(seed)
    size = (resolution, resolution)
    encoded: list[bytes] = []
    for _ in range(images):
        # Upscaling 2x2 random colours bilinearly gives a smooth gradient across the image.
        corners = Image.frombytes("RGB", (2, 2), rng.randbytes(12))
        image = corners.resize(size, Image.Resampling.BILINEAR)
        draw = ImageDraw.Draw(image)
        for _ in range(rng.randint(2, 6)):
            left, right = sorted(rng.randrange(resolution) for _ in range(2))
            upper, lower = sorted(rng.randrange(resolution) for _ in range(2))
            shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
            shape((left, upper, right + 1, lower + 1), fill=tuple(rng.randbytes(3)))
        image = image.filter(ImageFilter.GaussianBlur(radius=1.5))
        noise = Image.frombytes("RGB", size, rng.randbytes(3 * resolution * resolution))
        image = Image.blend(image, noise, alpha=0.06)
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=_JPEG_QUALITY)
        encoded.append(buffer.getvalue())
    offsets = array("q", [0])
    for data in encoded:
        offsets.append(offsets[-1] + len(data))
    labels = bytes(rng.randrange(NUM_CLASSES) for _ in range(images))
    return b"".join(encoded), offsets, labels


def _read_cache(path: Path) -> tuple[bytes, array, bytes] | None:
    """The cached ``(blob, offsets, labels)``, or None when absent or not ours."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < _CACHE_HEADER.size:
        return None
    magic, count = _CACHE_HEADER.unpack_from(data)
    offsets_start = _CACHE_HEADER.size
    labels_start = offsets_start + 8 * (count + 1)
    blob_start = labels_start + count
    if magic != _CACHE_MAGIC or len(data) < blob_start:
        return None
    offsets = array("q")
    offsets.frombytes(data[offsets_start:labels_start])
    blob = data[blob_start:]
    if offsets[-1] != len(blob):
        return None
    return blob, offsets, data[labels_start:blob_start]


def _write_cache_atomically(path: Path, blob: bytes, offsets: array, labels: bytes) -> None:
    """Write to a temporary file and rename it, so concurrent trials never read half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(_CACHE_HEADER.pack(_CACHE_MAGIC, len(labels)))
            file.write(offsets.tobytes())
            file.write(labels)
            file.write(blob)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# Training step ------------------------------------------------------------------------------


def _network(model: str, num_classes: int) -> nn.Module:
    if model == "resnet50":
        try:
            from torchvision.models import resnet50
        except ImportError as error:
            raise ValueError(_NEEDS_TORCHVISION) from error
        return resnet50(num_classes=num_classes)
    _check_choice("model", model, MODELS)

    def block(channels_in: int, channels_out: int, kernel: int, stride: int) -> list[nn.Module]:
        padding = (kernel - 1) // 2 if kernel % 2 else 0
        return [
            nn.Conv2d(channels_in, channels_out, kernel, stride, padding, bias=False),
            nn.BatchNorm2d(channels_out),
            nn.ReLU(inplace=True),
        ]

    # Sized so that on a CPU one sample's step costs about what its decode and augmentation do
    # (~0.25 ms each on one core at 112 px): the regime where workers matter. A 4x4/4 patch stem
    # keeps it so; a 3x3/2 stem at 32-64-128 channels costs ~8x the decode.
    return nn.Sequential(
        *block(3, 16, kernel=4, stride=4),
        *block(16, 32, kernel=3, stride=2),
        *block(32, 64, kernel=3, stride=2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


class ImageClassifierStep:
    """Cross-entropy and SGD (momentum 0.9, lr 0.01) on ``(images, labels)`` batches.

    ``last_loss`` keeps the latest loss as a detached device tensor: reading it is the caller's
    choice, so the step itself never waits for the device. ``network`` is the workload's model
    on ``device`` (under DDP in a rank of several), as ``make_step(device, model)`` hands it.
    """

    def __init__(self, device: torch.device, network: nn.Module) -> None:
        self.network = network.to(device).train()
        self.optimizer = torch.optim.SGD(self.network.parameters(), lr=0.01, momentum=0.9)
        self.last_loss: torch.Tensor | None = None
        self._pixel_mean = _PIXEL_MEAN.to(device).unsqueeze(0)
        self._pixel_inv_std = _PIXEL_INV_STD.to(device).unsqueeze(0)

    def __call__(self, batch: Any) -> None:
        images, labels = batch
        if images.dtype == torch.uint8:
            images = images.float().sub_(self._pixel_mean).mul_(self._pixel_inv_std)
        loss = F.cross_entropy(self.network(images), labels)
        loss.backward()
        self.last_loss = loss.detach()

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
