"""The benchmark's workloads as loadtune sees them (a loadtune workload file).

    BENCH_LOADTUNE_WORKLOAD=image BENCH_LOADTUNE_OPTIONS='{"images": 512, "resolution": 96}' \\
        loadtune tune bench/loadtune_workloads.py

``bench.peer`` runs it so. loadtune builds the DataLoader itself (``batch_size``, ``shuffle``,
``drop_last``, its own knobs) from what ``get_workload()`` returns: a dataset factory, a model,
an optimizer and a step. These wrap the very datasets and training steps the tuner measures, so
both tools tune one workload:

* image: the built-in image dataset with its default collate (float samples normalised in the
  workers; loadtune has no collate knob), the same small CNN, SGD (lr 0.01, momentum 0.9) and
  cross entropy as ``objectives.image.ImageClassifierStep``.
* storage: the built-in storage dataset (each sample waits on storage), the same MLP, SGD
  (lr 0.01, momentum 0.9) and cross entropy as ``objectives.storage.MlpStep``.
* text: loadtune can only batch by a sample count, while the text workload batches by a token
  budget (a token-bucket batch sampler). So each sample here is one whole bucket of the tuner's
  default ``max_tokens`` (the sampler's epoch-0 batches), loaded with ``batch_size=1`` and
  padded by ``pad_collate``: the DataLoader moves exactly the batches the tuner's text workload
  moves at that budget, and loadtune tunes everything but the budget. Its throughput is then in
  buckets/s, which ranks its trials the same way sequences/s would.

Each of loadtune's trial processes imports this file afresh and reads the variables again.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import torch
import torch.nn.functional as F
from loadtune import Workload
from torch import nn
from torch.utils.data import Dataset

from objectives.image import NUM_CLASSES, _network, image_workload
from objectives.storage import mlp, storage_workload
from objectives.text import (
    PAD_TOKEN,
    TinyLanguageModel,
    TokenBucketBatchSampler,
    pad_collate,
    text_workload,
)

TEXT_MAX_TOKENS = 4096
"""The bucket budget loadtune gets: the text workload's ``default_batch_size``."""


def _options() -> dict[str, Any]:
    return json.loads(os.environ.get("BENCH_LOADTUNE_OPTIONS") or "{}")


def _image_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, device: torch.device
) -> torch.Tensor:
    images, labels = batch
    loss = F.cross_entropy(model(images.to(device)), labels.to(device))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _image() -> Workload:
    options = _options()
    return Workload(
        name="image",
        make_dataset=lambda: image_workload(**options).dataset,
        make_model=lambda: _network("small-cnn", NUM_CLASSES),
        train_step=_image_step,
        make_optimizer=_sgd,
        default_batch_size=image_workload(**options).default_batch_size,
        description="the tuner's image workload (float collate)",
    )


class BucketDataset(Dataset):
    """One token bucket per item: the sequences of one batch the tuner's sampler would form."""

    def __init__(self, sequences: Dataset, max_tokens: int, seed: int = 0) -> None:
        sampler = TokenBucketBatchSampler(sequences.lengths, max_tokens, seed)  # type: ignore[attr-defined]
        self.sequences = sequences
        self.buckets = list(iter(sampler))

    def __len__(self) -> int:
        return len(self.buckets)

    def __getitem__(self, index: int) -> list[torch.Tensor]:
        return [self.sequences[i] for i in self.buckets[index]]


def collate_bucket(items: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size=1``: the one bucket, padded as the tuner's text workload pads it."""
    (bucket,) = items
    return pad_collate(bucket)


def _text_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, device: torch.device
) -> torch.Tensor:
    tokens, _lengths = batch
    tokens = tokens.to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs, inputs == PAD_TOKEN)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD_TOKEN)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _text() -> Workload:
    options = _options()
    default_vocab = inspect.signature(text_workload).parameters["vocab_size"].default
    vocab_size = int(options.get("vocab_size", default_vocab))
    return Workload(
        name="text",
        make_dataset=lambda: BucketDataset(text_workload(**options).dataset, TEXT_MAX_TOKENS),
        make_model=lambda: TinyLanguageModel(vocab_size),
        train_step=_text_step,
        make_optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=3e-4),
        default_batch_size=1,
        collate_fn=collate_bucket,
        description=f"the tuner's text workload, one {TEXT_MAX_TOKENS}-token bucket per sample",
    )


def _storage_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, device: torch.device
) -> torch.Tensor:
    features, labels = batch
    loss = F.cross_entropy(model(features.to(device)), labels.to(device))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _storage() -> Workload:
    options = _options()
    defaults = inspect.signature(storage_workload).parameters
    features = int(options.get("features", defaults["features"].default))
    hidden = int(options.get("hidden", defaults["hidden"].default))
    return Workload(
        name="storage",
        make_dataset=lambda: storage_workload(**options).dataset,
        make_model=lambda: mlp(features, hidden),
        train_step=_storage_step,
        make_optimizer=_sgd,
        default_batch_size=storage_workload(**options).default_batch_size,
        description="the tuner's storage workload (samples that wait on storage, an MLP)",
    )


_FACTORIES = {"image": _image, "text": _text, "storage": _storage}


def get_workload() -> Workload:
    """loadtune's entry point; ``$BENCH_LOADTUNE_WORKLOAD`` picks image, text or storage."""
    name = os.environ.get("BENCH_LOADTUNE_WORKLOAD", "image")
    if name not in _FACTORIES:
        raise ValueError(f"BENCH_LOADTUNE_WORKLOAD must be one of {', '.join(_FACTORIES)}")
    return _FACTORIES[name]()
