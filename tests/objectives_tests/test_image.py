from __future__ import annotations

import importlib.util
import io
import math
import random
from pathlib import Path

import pytest
import torch
from PIL import Image

from objectives import image as image_module
from objectives import image_workload
from objectives.image import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    EncodedImageDataset,
    fast_collate,
    random_resized_crop_box,
)
from tests.objectives_tests.loaders import CONTEXTS, worker_batches

SMALL = {"images": 64, "resolution": 64, "crop": 48}


def test_generated_jpegs_are_cached_once_and_deterministic(
    image_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = image_workload(images=6, resolution=32, seed=7).dataset
    assert isinstance(first, EncodedImageDataset)
    cached = list(image_cache_dir.glob("*6x32px-seed7*"))
    assert [path.suffix for path in cached] == [".bin"]  # one file, no temporary left over

    def regenerate(*args: object) -> None:
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(image_module, "_generate_jpegs", regenerate)
    second = image_workload(images=6, resolution=32, seed=7).dataset
    assert isinstance(second, EncodedImageDataset)
    assert second.blob == first.blob and second.labels == first.labels
    for index in range(6):
        with Image.open(io.BytesIO(second.encoded(index))) as decoded:
            assert (decoded.format, decoded.size, decoded.mode) == ("JPEG", (32, 32), "RGB")
    assert all(0 <= label < 10 for label in second.labels)


def test_seeds_give_different_images(image_cache_dir: Path) -> None:
    one = image_workload(images=4, resolution=32, seed=1).dataset
    two = image_workload(images=4, resolution=32, seed=2).dataset
    assert isinstance(one, EncodedImageDataset) and isinstance(two, EncodedImageDataset)
    assert one.blob != two.blob


def test_a_foreign_cache_file_is_regenerated(image_cache_dir: Path) -> None:
    (image_cache_dir / "jpeg-3x32px-seed0.bin").write_bytes(b"not ours")
    dataset = image_workload(images=3, resolution=32).dataset
    assert len(dataset) == 3
    assert (image_cache_dir / "jpeg-3x32px-seed0.bin").read_bytes()[:8] == b"DLTJPEG1"


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("collate", ["float", "uint8"])
def test_workers_decode_augment_and_the_step_trains(context: str, collate: str) -> None:
    workload = image_workload(**SMALL).with_knobs({"collate": collate})
    batches = worker_batches(workload, 16, context, batches=3)
    assert len(batches) == 3
    step = workload.train_step(torch.device("cpu"))
    for images, labels in batches:
        assert images.shape == (16, 3, 48, 48)
        assert images.dtype == (torch.uint8 if collate == "uint8" else torch.float32)
        assert labels.dtype == torch.int64 and labels.min() >= 0 and labels.max() < 10
        step((images, labels))
        step.optimizer_step()
        assert step.last_loss is not None and torch.isfinite(step.last_loss)


def test_float_samples_are_the_uint8_samples_normalised() -> None:
    workload = image_workload(**SMALL)
    random.seed(3)
    floats, label = workload.dataset[5]
    random.seed(3)
    pixels, same_label = workload.with_knobs({"collate": "uint8"}).dataset[5]
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    assert label == same_label
    torch.testing.assert_close(floats, (pixels / 255 - mean) / std)


def test_fast_collate_stacks_uint8() -> None:
    samples = [(torch.full((3, 4, 4), value, dtype=torch.uint8), value) for value in range(5)]
    images, labels = fast_collate(samples)
    assert images.shape == (5, 3, 4, 4) and images.dtype == torch.uint8
    assert labels.tolist() == [0, 1, 2, 3, 4] and labels.dtype == torch.int64


def test_configure_switches_collate_on_the_same_images() -> None:
    workload = image_workload(**SMALL)
    assert workload.name == "image"
    assert workload.knobs == {"collate": ("float", "uint8")}
    assert (workload.default_batch_size, workload.batch_size_range) == (32, (8, 512))
    assert workload.collate_fn is None
    assert workload.description.startswith("image: 64 JPEG 64px → crop 48, small-cnn")
    uint8 = workload.with_knobs({"collate": "uint8"})
    assert uint8.collate_fn is fast_collate
    assert uint8.dataset.blob is workload.dataset.blob  # type: ignore[attr-defined]
    assert uint8.with_knobs({"collate": "float"}).collate_fn is None


def test_random_resized_crop_box_follows_torchvision() -> None:
    random.seed(0)
    for _ in range(500):
        left, upper, right, lower = random_resized_crop_box(128, 96)
        width, height = right - left, lower - upper
        assert 0 <= left < right <= 128 and 0 <= upper < lower <= 96
        assert 0.08 * 0.9 <= width * height / (128 * 96) <= 1
        assert 3 / 4 * 0.9 <= width / height <= 4 / 3 * 1.1
    # No crop of that ratio fits a strip: the centre crop clamped to the ratio bounds.
    left, upper, right, lower = random_resized_crop_box(1000, 10)
    assert (right - left, lower - upper) == (13, 10) and left == (1000 - 13) // 2
    assert math.isclose((right - left) / (lower - upper), 1.3)


def _write_image(path: Path, mode: str, colour: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (40 + colour, 30), colour * 20).save(path)


@pytest.mark.parametrize("context", CONTEXTS)
def test_folder_mode_reads_files_in_workers(tmp_path: Path, context: str) -> None:
    _write_image(tmp_path / "cats" / "a.jpg", "RGB", 1)
    _write_image(tmp_path / "cats" / "b.png", "RGBA", 2)
    _write_image(tmp_path / "dogs" / "deeper" / "c.JPEG", "L", 3)
    _write_image(tmp_path / "dogs" / "d.png", "P", 4)
    (tmp_path / "dogs" / "notes.txt").write_text("not an image")
    workload = image_workload(image_dir=str(tmp_path), crop=24, collate="uint8")
    assert workload.dataset.labels == [0, 0, 1, 1]  # type: ignore[attr-defined]
    assert workload.description.startswith(f"image: 4 files from {tmp_path} → crop 24")
    ((images, labels),) = worker_batches(workload, 4, context)
    assert images.shape == (4, 3, 24, 24) and images.dtype == torch.uint8
    assert sorted(labels.tolist()) == [0, 0, 1, 1]
    step = workload.train_step(torch.device("cpu"))
    step((images, labels))
    assert step.last_loss is not None and torch.isfinite(step.last_loss)


def test_flat_folder_is_one_class(tmp_path: Path) -> None:
    _write_image(tmp_path / "one.jpg", "RGB", 1)
    _write_image(tmp_path / "two.png", "RGB", 2)
    dataset = image_workload(image_dir=str(tmp_path)).dataset
    assert dataset.labels == [0, 0]  # type: ignore[attr-defined]
    assert dataset[1][0].shape == (3, 112, 112)


def test_folder_without_images_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("no images here")
    with pytest.raises(ValueError, match=r"has no \.jpg/\.jpeg/\.png images"):
        image_workload(image_dir=str(tmp_path))
    with pytest.raises(ValueError, match="is not a directory"):
        image_workload(image_dir=str(tmp_path / "missing"))


def test_unknown_choices_list_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown arch 'vgg'; known: small-cnn, resnet50"):
        image_workload(**SMALL, arch="vgg")
    with pytest.raises(ValueError, match="unknown collate 'half'; known: float, uint8"):
        image_workload(**SMALL, collate="half")


def test_resnet50_without_torchvision_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(  # a machine without torchvision, whether or not this one has it
        importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "torchvision" else find_spec(name, *rest),
    )
    with pytest.raises(ValueError, match=r"needs torchvision \(pip install torchvision\)"):
        image_workload(**SMALL, arch="resnet50")
